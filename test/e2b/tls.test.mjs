// The e2b SDK as E2B's docs use it, against a SPACE data listener that
// serves HTTPS with an operator's wildcard certificate: no
// E2B_SANDBOX_URL, so every envd call goes to
// https://49983-<id>.<domain>, getHost(port) URLs are https, and signed
// file URLs work as returned, with fetch and with curl. Started by
// tls_test.go with
//   E2B_API_URL, E2B_API_KEY, SPACE_E2B_PKG, SPACE_E2B_TEMPLATE as for sdk.test.mjs
//   NODE_EXTRA_CA_CERTS  the test's CA (it signed *.<SPACE_TLS_DOMAIN>)
//   SPACE_TLS_DOMAIN     the wildcard name, without the port
import { test, describe, before, after } from 'node:test'
import assert from 'node:assert/strict'
import dns from 'node:dns'
import { execFile } from 'node:child_process'
import { promisify } from 'node:util'

// Wildcard DNS as an operator's resolver gives it: every name under the
// domain is the data listener's loopback address. The SDK's own undici
// agent connects through net/tls, which ask dns.lookup.
const domain = process.env.SPACE_TLS_DOMAIN
const lookup = dns.lookup
dns.lookup = (host, opts, cb) => {
  if (typeof opts === 'function') { cb = opts; opts = {} }
  if (host === domain || host.endsWith('.' + domain)) {
    return opts && opts.all ? cb(null, [{ address: '127.0.0.1', family: 4 }]) : cb(null, '127.0.0.1', 4)
  }
  return lookup(host, opts, cb)
}

const pkg = process.env.SPACE_E2B_PKG || 'e2b'
const { Sandbox } = await import(pkg)
const template = process.env.SPACE_E2B_TEMPLATE || 'minimal'
const run = promisify(execFile)

describe(`e2b SDK (${pkg}) over HTTPS with a wildcard certificate`, () => {
  let sbx
  before(async () => {
    assert.equal(process.env.E2B_SANDBOX_URL, undefined, 'the test must not set E2B_SANDBOX_URL')
    sbx = await Sandbox.create(template, { timeoutMs: 120_000 })
  })
  after(async () => {
    if (sbx) await Sandbox.kill(sbx.sandboxId).catch(() => {})
  })

  test('envd calls go to https://49983-<id>.<domain>', async () => {
    assert.equal((await sbx.commands.run('echo over tls')).stdout, 'over tls\n')
    await sbx.files.write('/tmp/tls.txt', 'tls file')
    assert.equal(await sbx.files.read('/tmp/tls.txt'), 'tls file')
  })

  test('signed URLs as returned: https with the sandbox in the host; fetch and curl', async () => {
    const down = await sbx.downloadUrl('/tmp/tls.txt')
    const u = new URL(down)
    assert.equal(u.protocol, 'https:')
    assert.equal(u.hostname, `49983-${sbx.sandboxId}.${domain}`)
    const res = await fetch(down)
    assert.equal(res.status, 200)
    assert.equal(await res.text(), 'tls file')
    // curl, as a user pastes the URL: its own resolver, the CA file.
    const { stdout } = await run('curl', ['-sS', '--fail', '--cacert', process.env.NODE_EXTRA_CA_CERTS,
      '--resolve', `${u.hostname}:${u.port}:127.0.0.1`, down])
    assert.equal(stdout, 'tls file')
    const up = await sbx.uploadUrl('/tmp/up-tls.txt')
    const form = new FormData()
    form.append('file', new Blob(['up over tls']), '/tmp/up-tls.txt')
    const put = await fetch(up, { method: 'POST', body: form })
    assert.equal(put.status, 200, await put.clone().text())
    assert.equal(await sbx.files.read('/tmp/up-tls.txt'), 'up over tls')
  })

  test('getHost(port) as the docs use it: https://<host>', async () => {
    await sbx.files.write('/tmp/site/index.html', 'hello over tls')
    await sbx.commands.run('exec busybox httpd -f -p 8000 -h /tmp/site', { background: true, timeoutMs: 0 })
    const host = sbx.getHost(8000)
    let res
    for (let i = 0; i < 100; i++) {
      res = await fetch(`https://${host}/index.html`)
      if (res.status === 200) break
      await res.arrayBuffer()
      await new Promise((r) => setTimeout(r, 100))
    }
    assert.equal(res.status, 200)
    assert.equal(await res.text(), 'hello over tls')
  })
})
