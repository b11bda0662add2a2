// Drives the real e2b npm SDK at a sandbox of a SPACE fleet through a data
// listener of another node than the sandbox's (test/multinode
// TestE2BAnyNode starts the fleet). It sets:
//   E2B_API_URL, E2B_API_KEY   a `space server --remote-nodes` replica
//   E2B_SANDBOX_URL            the data URL of a node the sandbox is NOT on
//   SPACE_SBX_ID               the sandbox (created through SPACE's API)
//   SPACE_SBX_TOKEN            its data-plane session token (its ports are private)
import { test, describe, before } from 'node:test'
import assert from 'node:assert/strict'

const { Sandbox } = await import(process.env.SPACE_E2B_PKG || 'e2b')
const id = process.env.SPACE_SBX_ID
const sandboxURL = process.env.E2B_SANDBOX_URL
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

describe('e2b SDK through another node', () => {
  let sbx
  before(async () => {
    sbx = await Sandbox.connect(id)
  })

  test('commands', async () => {
    const r = await sbx.commands.run('echo hi-$((6*7)) && cat /etc/hostname >/dev/null')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hi-42\n')
    const streamed = []
    await sbx.commands.run('for i in 1 2 3; do echo line-$i; done', { onStdout: (d) => streamed.push(d) })
    assert.equal(streamed.join(''), 'line-1\nline-2\nline-3\n')
  })

  test('files', async () => {
    await sbx.files.write('/tmp/e2b-anynode.txt', 'written through a peer node\n')
    assert.equal(await sbx.files.read('/tmp/e2b-anynode.txt'), 'written through a peer node\n')
    const list = await sbx.files.list('/tmp')
    assert.ok(list.some((e) => e.name === 'e2b-anynode.txt'), JSON.stringify(list))
  })

  test('private ports (E2b-Sandbox-Id and E2b-Sandbox-Port headers)', async () => {
    await sbx.commands.run('mkdir -p /tmp/w && echo port-ok > /tmp/w/m.txt')
    await sbx.commands.run('busybox httpd -f -p 0.0.0.0:8000 -h /tmp/w', { background: true })
    const hdr = { 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': '8000' }
    let last
    for (let i = 0; i < 50; i++) {
      last = await fetch(`${sandboxURL}/m.txt`, { headers: { ...hdr, 'X-Access-Token': process.env.SPACE_SBX_TOKEN } })
      if (last.status === 200) break
      await last.arrayBuffer()
      await sleep(100)
    }
    assert.equal(last.status, 200)
    assert.equal(await last.text(), 'port-ok\n')
    const anon = await fetch(`${sandboxURL}/m.txt`, { headers: hdr })
    assert.equal(anon.status, 401, 'a private port opened without a token through the peer')
  })
})
