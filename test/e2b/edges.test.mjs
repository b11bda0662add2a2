// E2B edges found by using SPACE from outside, with the real e2b SDK:
// signed file URLs used exactly as returned, restoring a snapshot with
// envs, deleting snapshots of one sandbox in any order, the template a
// restored sandbox reports, and the status of a paused sandbox's public
// port. Started by edges_test.go with the variables of sdk.test.mjs.
import { test, describe, before, after } from 'node:test'
import assert from 'node:assert/strict'

const pkg = process.env.SPACE_E2B_PKG || 'e2b'
const { Sandbox } = await import(pkg)
const template = process.env.SPACE_E2B_TEMPLATE || 'base'
const sandboxURL = process.env.E2B_SANDBOX_URL

// pausedPortAnswers checks that port 8000 of the paused sandbox s answers
// 409 both without a credential and with its envd token.
async function pausedPortAnswers(s) {
  const port = { 'E2b-Sandbox-Id': s.sandboxId, 'E2b-Sandbox-Port': '8000' }
  const anon = await fetch(sandboxURL + '/', { headers: port })
  const withToken = await fetch(sandboxURL + '/', { headers: { ...port, 'X-Access-Token': s.envdAccessToken || '' } })
  const bodies = [await anon.text(), await withToken.text()]
  assert.equal(anon.status, withToken.status, bodies.join(' | '))
  assert.equal(anon.status, 409, bodies[0])
}

describe(`e2b SDK (${pkg}) edges`, () => {
  let sbx
  const made = []
  const create = async (tpl, opts) => {
    const s = await Sandbox.create(tpl, { timeoutMs: 120_000, ...opts })
    made.push(s.sandboxId)
    return s
  }

  before(async () => {
    sbx = await create(template, { envs: { A: 'a', B: 'b' } })
  })

  after(async () => {
    for (const id of made) await Sandbox.kill(id).catch(() => {})
  })

  test('signed downloadUrl and uploadUrl work as returned (no header added)', async () => {
    await sbx.files.write('/tmp/signed.txt', 'as returned')
    const down = await sbx.downloadUrl('/tmp/signed.txt')
    let res = await fetch(down)
    assert.equal(res.status, 200, await res.clone().text())
    assert.equal(await res.text(), 'as returned')
    const up = await sbx.uploadUrl('/tmp/up.txt')
    const form = new FormData()
    form.append('file', new Blob(['uploaded as returned']), '/tmp/up.txt')
    res = await fetch(up, { method: 'POST', body: form })
    assert.equal(res.status, 200, await res.clone().text())
    assert.equal(await sbx.files.read('/tmp/up.txt'), 'uploaded as returned')
    // A forged signature still names no sandbox: 401, not a guess.
    const bad = new URL(down)
    bad.searchParams.set('signature', 'v1_' + 'A'.repeat(43))
    res = await fetch(bad)
    assert.equal(res.status, 401, await res.text())
  })

  test('restore with envs adds them on top of the snapshot\'s; the restored sandbox reports its template', async () => {
    const snap = await sbx.createSnapshot()
    const restored = await create(snap.snapshotId, { envs: { B: 'B2', C: 'c' } })
    const src = await sbx.getInfo()
    const info = await restored.getInfo()
    assert.equal(info.templateId, src.templateId)
    assert.equal(info.templateId, template)
    const listed = (await Sandbox.list({ query: { state: ['running'] } }).nextItems()).find((s) => s.sandboxId === restored.sandboxId)
    assert.equal(listed?.templateId, template, JSON.stringify(listed))
    const out = await restored.commands.run('echo "$A $B $C"')
    assert.equal(out.stdout, 'a B2 c\n')
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  })

  test('snapshots of one sandbox can be deleted in any order', async () => {
    const s = await create(template)
    await s.files.write('/tmp/one.txt', 'one')
    const first = await s.createSnapshot()
    await s.files.write('/tmp/two.txt', 'two')
    const second = await s.createSnapshot()
    // The oldest first, while a newer one builds on it.
    assert.equal(await Sandbox.deleteSnapshot(first.snapshotId), true)
    assert.equal(await Sandbox.deleteSnapshot(first.snapshotId), false)
    const left = await Sandbox.listSnapshots({ sandboxId: s.sandboxId }).nextItems()
    assert.deepEqual(left.map((x) => x.snapshotId), [second.snapshotId])
    await assert.rejects(Sandbox.create(first.snapshotId))
    // The newer one still has what the deleted one held.
    const r = await create(second.snapshotId)
    assert.equal(await r.files.read('/tmp/one.txt'), 'one')
    assert.equal(await r.files.read('/tmp/two.txt'), 'two')
    // A third snapshot builds on the second; deleting the middle one
    // keeps the third whole too.
    await s.files.write('/tmp/three.txt', 'three')
    const third = await s.createSnapshot()
    assert.equal(await Sandbox.deleteSnapshot(second.snapshotId), true)
    const r3 = await create(third.snapshotId)
    assert.equal((await r3.commands.run('cat /tmp/one.txt /tmp/two.txt /tmp/three.txt')).stdout, 'onetwothree')
    assert.equal(await Sandbox.deleteSnapshot(third.snapshotId), true)
  })

  test('a paused sandbox\'s public port answers the same status with or without a credential', async () => {
    const s = await create(template)
    const pause = s.pause ? s.pause.bind(s) : s.betaPause.bind(s)
    assert.equal(await pause(), true)
    await pausedPortAnswers(s)
  })

  test('a sandbox paused at its timeout (hibernated) answers the same on its public port with or without a credential', async () => {
    const s = await create(template, { timeoutMs: 2_000, lifecycle: { onTimeout: 'pause' } })
    let state = 'running'
    for (let i = 0; i < 100 && state !== 'paused'; i++) {
      await new Promise((r) => setTimeout(r, 200))
      state = (await s.getInfo()).state
    }
    assert.equal(state, 'paused', 'not paused at its timeout')
    await pausedPortAnswers(s)
  })
})
