// The E2B column of the table of security attributes by creation path
// (test/attrs/table.go, docs/security.md): Sandbox.create(snapshotId, opts)
// takes what opts say and the source sandbox's values for the rest; the
// port privacy of a restored sandbox is its own (issue 22: a private
// create from a public source's snapshot answered no trafficAccessToken
// and served its ports without a credential). Started by attrs_test.go
// with the variables sdk.test.mjs documents.
import { test, describe, before, after } from 'node:test'
import assert from 'node:assert/strict'

const pkg = process.env.SPACE_E2B_PKG || 'e2b'
const { Sandbox } = await import(pkg)
const template = process.env.SPACE_E2B_TEMPLATE || 'base'
const api = process.env.E2B_API_URL
const data = process.env.E2B_SANDBOX_URL
const key = process.env.E2B_API_KEY

// The native record of a sandbox (same key, SPACE's own API).
async function record(id) {
  const r = await fetch(`${api}/v1/sandboxes/${id}`, { headers: { 'X-API-Key': key } })
  assert.equal(r.status, 200)
  return r.json()
}

// A forwarded port without any credential: 401 when private; a public
// sandbox lets it through to the (closed) port, 502.
async function portStatus(id) {
  const r = await fetch(`${data}/v1/sandboxes/${id}/ports/8999/`)
  await r.arrayBuffer()
  return r.status
}

describe(`e2b SDK (${pkg}): attributes of a sandbox created from a snapshot`, () => {
  const made = []
  let pubSnap, privSnap, pub, priv
  const create = async (t, opts) => {
    const s = await Sandbox.create(t, { timeoutMs: 300_000, ...opts })
    made.push(s.sandboxId)
    return s
  }

  before(async () => {
    pub = await create(template, {})
    priv = await create(template, { network: { allowPublicTraffic: false } })
    pubSnap = (await pub.createSnapshot()).snapshotId
    privSnap = (await priv.createSnapshot()).snapshotId
  })
  after(async () => {
    for (const id of made) await Sandbox.kill(id).catch(() => {})
  })

  test('public ports: the request wins (private from a public source)', async () => {
    const s = await create(pubSnap, { network: { allowPublicTraffic: false } })
    assert.ok(s.trafficAccessToken, 'no trafficAccessToken for a private sandbox')
    assert.equal((await record(s.sandboxId)).public_ports, undefined)
    assert.equal(await portStatus(s.sandboxId), 401)
  })

  test('public ports: the request wins (public from a private source)', async () => {
    const s = await create(privSnap, { network: { allowPublicTraffic: true } })
    assert.equal(s.trafficAccessToken, undefined)
    assert.equal(await portStatus(s.sandboxId), 502)
  })

  test('public ports: unsaid, the source\'s', async () => {
    const a = await create(privSnap, {})
    assert.ok(a.trafficAccessToken, 'a private source\'s restore answered no trafficAccessToken')
    assert.equal(await portStatus(a.sandboxId), 401)
    const b = await create(pubSnap, {})
    assert.equal(await portStatus(b.sandboxId), 502)
  })

  test('timeout, autoPause, autoResume: the request\'s', async () => {
    const s = await create(privSnap, { timeoutMs: 200_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
    const r = await record(s.sandboxId)
    assert.equal(r.timeout_seconds, 200)
    assert.equal(r.on_timeout, 'hibernate')
    assert.equal(r.auto_resume, true)
  })

  test('limits, network, default user: the source\'s', async () => {
    const src = await record(priv.sandboxId)
    const s = await create(privSnap, {})
    const r = await record(s.sandboxId)
    assert.deepEqual(r.limits, src.limits)
    assert.deepEqual(r.network, src.network)
    const want = (await priv.commands.run('id -un')).stdout
    assert.equal((await s.commands.run('id -un')).stdout, want)
  })
})
