// Port forwarding with the real e2b SDK: getHost(port) URLs, E2B's
// header routing (E2b-Sandbox-Port, as the code interpreter uses it),
// allowPublicTraffic: false with the traffic token, and the JSON errors.
// Started by ports_test.go with the variables sdk.test.mjs documents.
import { test, describe, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Agent, fetch as ufetch } from 'undici'

const pkg = process.env.SPACE_E2B_PKG || 'e2b'
const { Sandbox } = await import(pkg)
const template = process.env.SPACE_E2B_TEMPLATE || 'base'
const sandboxURL = process.env.E2B_SANDBOX_URL
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// Wildcard DNS for the sandbox domain, as a resolver would give it: every
// name resolves to the data listener's loopback address.
const dns = new Agent({
  connect: {
    lookup: (_host, opts, cb) => (opts && opts.all ? cb(null, [{ address: '127.0.0.1', family: 4 }]) : cb(null, '127.0.0.1', 4)),
  },
})
const get = (url, headers = {}) => ufetch(url, { dispatcher: dns, headers })

// A web server on port inside the sandbox: python3's http.server where the
// template has python3 (base), else busybox httpd (minimal), serving a
// directory with a marker file.
async function serve(sbx, port) {
  await sbx.files.write(`/tmp/site${port}/marker-${port}.txt`, 'hello from the sandbox\n')
  const cmd = template === 'base'
    ? `cd /tmp/site${port} && exec python3 -m http.server ${port}`
    : `echo '<a href="marker-${port}.txt">marker-${port}.txt</a>' > /tmp/site${port}/index.html && exec busybox httpd -f -p ${port} -h /tmp/site${port}`
  await sbx.commands.run(cmd, { background: true, timeoutMs: 0 })
}

async function waitOK(url, headers) {
  let last
  for (let i = 0; i < 100; i++) {
    last = await get(url, headers)
    if (last.status === 200) return last
    await last.arrayBuffer()
    await sleep(200)
  }
  assert.fail(`${url}: still ${last.status}`)
}

describe(`ports with ${pkg}`, () => {
  let pub, priv
  before(async () => {
    pub = await Sandbox.create(template, { timeoutMs: 300_000 })
    priv = await Sandbox.create(template, { timeoutMs: 300_000, network: { allowPublicTraffic: false } })
  })
  after(async () => {
    for (const s of [pub, priv]) if (s) await Sandbox.kill(s.sandboxId).catch(() => {})
  })

  test('getHost(8000) reaches the sandbox server', async () => {
    await serve(pub, 8000)
    const host = pub.getHost(8000)
    assert.match(host, new RegExp(`^8000-${pub.sandboxId}\\.`))
    const r = await waitOK(`http://${host}/`)
    const body = await r.text()
    assert.match(body, /marker-8000\.txt/, body)
    const f = await get(`http://${host}/marker-8000.txt`)
    assert.equal(await f.text(), 'hello from the sandbox\n')
  })

  test('E2b-Sandbox-Port header routing (code interpreter style)', async () => {
    const r = await fetch(`${sandboxURL}/marker-8000.txt`, {
      headers: { 'E2b-Sandbox-Id': pub.sandboxId, 'E2b-Sandbox-Port': '8000' },
    })
    assert.equal(r.status, 200)
    assert.equal(await r.text(), 'hello from the sandbox\n')
  })

  test('a port nothing listens on is a 502 with a JSON body', async () => {
    const r = await get(`http://${pub.getHost(8001)}/`)
    assert.equal(r.status, 502)
    const body = await r.json()
    assert.equal(body.error.code, 'port_not_listening')
  })

  test('allowPublicTraffic: false needs the traffic token', async () => {
    assert.ok(priv.trafficAccessToken, 'create answered no trafficAccessToken')
    await serve(priv, 8000)
    const url = `http://${priv.getHost(8000)}/`
    const r = await waitOK(url, { 'e2b-traffic-access-token': priv.trafficAccessToken })
    assert.match(await r.text(), /marker-8000\.txt/)
    const anon = await get(url)
    assert.equal(anon.status, 401)
    assert.equal((await anon.json()).error.code, 'unauthorized')
    // The public sandbox's traffic token does not open this one, and
    // this one's does not open the public one's envd or another sandbox.
    const wrong = await get(url, { 'e2b-traffic-access-token': 'spt_forged.token' })
    assert.equal(wrong.status, 401)
    await wrong.arrayBuffer()
  })
})
