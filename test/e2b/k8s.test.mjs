// The e2b npm SDK against SPACE on a Kubernetes cluster, through its
// Service. Started by test/k8s (helm_test.go), which sets E2B_API_URL (the
// Service's control port), E2B_SANDBOX_URL (the data plane: the address of
// the pod that runs the sandboxes), E2B_API_KEY and SPACE_E2B_TEMPLATE.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Agent, fetch as ufetch } from 'undici'
import { Sandbox } from 'e2b'

const template = process.env.SPACE_E2B_TEMPLATE || 'minimal'
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// The cluster has no DNS for the sandbox domain (localhost:7071, derived
// from a data URL that is an address): every name resolves to the data
// plane's address, as a wildcard record would.
const dataHost = new URL(process.env.E2B_SANDBOX_URL).hostname
const dns = new Agent({
  connect: {
    lookup: (_host, opts, cb) => (opts && opts.all ? cb(null, [{ address: dataHost, family: 4 }]) : cb(null, dataHost, 4)),
  },
})

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

test('e2b SDK on Kubernetes: a port preview URL (getHost) reaches a server in the sandbox', async () => {
  const sbx = await Sandbox.create(template, { timeoutMs: 180_000 })
  try {
    await sbx.files.write('/tmp/site/marker.txt', 'hello from a pod sandbox\n')
    await sbx.commands.run('exec busybox httpd -f -p 8000 -h /tmp/site', { background: true, timeoutMs: 0 })
    const host = sbx.getHost(8000)
    assert.match(host, new RegExp(`^8000-${sbx.sandboxId}\\.`))
    let r
    for (let i = 0; i < 100; i++) {
      r = await ufetch(`http://${host}/marker.txt`, { dispatcher: dns })
      if (r.status === 200) break
      await r.arrayBuffer()
      await sleep(200)
    }
    assert.equal(r.status, 200, `http://${host}/marker.txt`)
    assert.equal(await r.text(), 'hello from a pod sandbox\n')
  } finally {
    await Sandbox.kill(sbx.sandboxId).catch(() => {})
  }
})
