// The e2b npm SDK against SPACE installed on a Kubernetes cluster by the
// Helm chart, through its Service. Started by test/k8s (helm_test.go),
// which sets E2B_API_URL, E2B_SANDBOX_URL (the Service's control and data
// ports), E2B_API_KEY and SPACE_E2B_TEMPLATE.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

const template = process.env.SPACE_E2B_TEMPLATE || 'minimal'

test('e2b SDK on Kubernetes: create, commands, files, pause and resume', async () => {
  const sbx = await Sandbox.create(template, { metadata: { suite: 'k8s' }, timeoutMs: 180_000 })
  try {
    assert.equal(await sbx.isRunning(), true)
    const r = await sbx.commands.run('echo hello from a pod; echo oops >&2')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello from a pod\n')
    assert.equal(r.stderr, 'oops\n')
    await sbx.files.write('/tmp/k8s.txt', 'written by the SDK')
    assert.equal(await sbx.files.read('/tmp/k8s.txt'), 'written by the SDK')
    assert.equal((await sbx.commands.run('cat /tmp/k8s.txt')).stdout, 'written by the SDK')
    const names = (await sbx.files.list('/tmp')).map((e) => e.name)
    assert.ok(names.includes('k8s.txt'), `ls /tmp: ${names}`)
    assert.equal(await sbx.pause(), true)
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await again.commands.run('cat /tmp/k8s.txt')).stdout, 'written by the SDK')
  } finally {
    await Sandbox.kill(sbx.sandboxId).catch(() => {})
  }
})
