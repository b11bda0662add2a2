// E2B network options through the real e2b SDK: allowInternetAccess,
// network.allowOut/denyOut and updateNetwork, checked against the policy
// SPACE stores (native API, GET /v1/sandboxes/{id}). Started by
// e2b_test.go (TestSDKNetwork) with the variables of sdk.test.mjs, plus
//   SPACE_E2B_EGRESS  "1": the server runs --egress (its own network
//                     namespace) with --e2b-network open (E2B's default,
//                     the open internet, for a create that asks for
//                     nothing); otherwise it has no sandbox network
import { test, describe, before, after } from 'node:test'
import assert from 'node:assert/strict'

const pkg = process.env.SPACE_E2B_PKG || 'e2b'
const { Sandbox, ALL_TRAFFIC } = await import(pkg)
const template = process.env.SPACE_E2B_TEMPLATE || 'base'
const egress = process.env.SPACE_E2B_EGRESS === '1'
const api = process.env.E2B_API_URL
const key = process.env.E2B_API_KEY
// 2.51 creates on POST /v2/sandboxes and sends allow_internet_access only
// when set; 2.50 uses POST /sandboxes and always sends it (true by default).
const v2 = pkg === 'e2b'
const all = ALL_TRAFFIC || '0.0.0.0/0'

// policy returns the network policy SPACE stored for a sandbox.
async function policy(id) {
  const res = await fetch(`${api}/v1/sandboxes/${id}`, { headers: { 'X-API-Key': key } })
  assert.equal(res.status, 200)
  const sb = await res.json()
  return sb.network || { mode: 'blocked' }
}

describe(`e2b SDK (${pkg}) network options, server ${egress ? 'with' : 'without'} --egress`, () => {
  const made = []
  const create = async (opts) => {
    const sbx = await Sandbox.create(template, { timeoutMs: 120_000, ...opts })
    made.push(sbx.sandboxId)
    return sbx
  }

  before(async () => {
    // The template may still be loading on a server that just started.
    for (let i = 0; i < 600; i++) {
      const res = await fetch(`${api}/v1/templates/${template}`, { headers: { 'X-API-Key': key } })
      if (res.status === 200) return
      await new Promise((r) => setTimeout(r, 100))
    }
    throw new Error(`template ${template} not ready`)
  })

  after(async () => {
    await Promise.all(made.map((id) => Sandbox.kill(id).catch(() => {})))
  })

  test('allowInternetAccess: false is blocked, and getInfo says so', async () => {
    const sbx = await create({ allowInternetAccess: false })
    assert.deepEqual(await policy(sbx.sandboxId), { mode: 'blocked' })
    const info = await sbx.getInfo()
    assert.equal(info.allowInternetAccess, false)
    assert.deepEqual(info.network.denyOut, [all])
  })

  test(`no network options: the server's default, ${egress ? 'open (--e2b-network open)' : 'blocked'}`, async () => {
    // 2.50 sends allow_internet_access: true here too (its default).
    const sbx = await create({})
    assert.equal((await policy(sbx.sandboxId)).mode, egress ? 'open' : 'blocked')
    assert.equal((await sbx.getInfo()).allowInternetAccess, egress)
  })

  test('a denyOut of a public range cannot be expressed: 400', async () => {
    await assert.rejects(create({ network: { denyOut: ['8.8.8.8'] } }), /SPACE cannot deny a public range/)
  })

  test('allowOut addresses cannot be expressed: 400', async () => {
    await assert.rejects(create({ network: { allowOut: ['1.1.1.1'], denyOut: [all] } }), /by host name, not by address/)
  })

  test('header-transform rules are refused: 400', async () => {
    await assert.rejects(create({ network: { allowOut: ['api.example.com'], denyOut: [all], rules: { 'api.example.com': [{ transform: { headers: { 'X-A': 'b' } } }] } } }), /network\.rules/)
  })

  if (!egress) {
    test('asking for network access without --egress: 400 that says so', async () => {
      await assert.rejects(create({ network: { allowOut: ['api.example.com'], denyOut: [all] } }), /egress gateway.*--egress/)
      await assert.rejects(create({ network: { allowOut: [all] } }), /egress gateway.*--egress/)
      if (v2) await assert.rejects(create({ allowInternetAccess: true }), /egress gateway.*--egress/)
      const sbx = await create({ allowInternetAccess: false })
      await assert.rejects(sbx.updateNetwork({ allowOut: ['api.example.com'], denyOut: [all] }), /egress gateway.*--egress/)
      await sbx.updateNetwork({ allowInternetAccess: false })
      assert.deepEqual(await policy(sbx.sandboxId), { mode: 'blocked' })
    })
    return
  }

  test('allowOut names with denyOut all traffic: an allowlist of those names', async () => {
    const sbx = await create({ network: { allowOut: ['api.example.com', '*.pypi.org'], denyOut: [all] } })
    assert.deepEqual(await policy(sbx.sandboxId), { mode: 'allowlist', allow: ['api.example.com:80,443', '*.pypi.org:80,443'] })
    const info = await sbx.getInfo()
    assert.deepEqual(info.network.allowOut, ['api.example.com', '*.pypi.org'])
    assert.deepEqual(info.network.denyOut, [all])
  })

  test('allowInternetAccess: false with allowOut names: an allowlist', async () => {
    const sbx = await create({ allowInternetAccess: false, network: { allowOut: ['registry.npmjs.org'] } })
    assert.deepEqual(await policy(sbx.sandboxId), { mode: 'allowlist', allow: ['registry.npmjs.org:80,443'] })
  })

  test('allowInternetAccess: true is open (2.51 asks for it; on 2.50 it is the SDK default, and the server\'s default is open)', async () => {
    const sbx = await create({ allowInternetAccess: true })
    assert.equal((await policy(sbx.sandboxId)).mode, 'open')
  })

  test('allowOut all traffic, and a denyOut of internal ranges only: open', async () => {
    const a = await create({ network: { allowOut: [all], denyOut: [all] } })
    assert.equal((await policy(a.sandboxId)).mode, 'open')
    const b = await create({ network: { denyOut: ['169.254.169.254', '10.0.0.0/8', '127.0.0.0/8'] } })
    assert.equal((await policy(b.sandboxId)).mode, 'open')
    assert.equal((await b.getInfo()).allowInternetAccess, true)
  })

  test('updateNetwork replaces the policy', async () => {
    const sbx = await create({ allowInternetAccess: false })
    await sbx.updateNetwork({ allowOut: ['api.example.com'], denyOut: [all] })
    assert.deepEqual(await policy(sbx.sandboxId), { mode: 'allowlist', allow: ['api.example.com:80,443'] })
    await sbx.updateNetwork({ allowInternetAccess: true })
    assert.equal((await policy(sbx.sandboxId)).mode, 'open')
    await sbx.updateNetwork({})
    assert.deepEqual(await policy(sbx.sandboxId), { mode: 'blocked' })
    await assert.rejects(sbx.updateNetwork({ denyOut: ['8.8.8.0/24'] }), /SPACE cannot deny a public range/)
    assert.deepEqual(await policy(sbx.sandboxId), { mode: 'blocked' })
  })
})
