// E2B parity beyond ports: getMetrics with real figures, snapshots and
// create-from-snapshot, fork, signed download/upload URLs. Started by
// parity_test.go with the same environment as sdk.test.mjs, plus
// SPACE_E2B_KEY2 (a key of another project).
import { test, describe, before, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'

const pkg = process.env.SPACE_E2B_PKG || 'e2b'
const e2b = await import(pkg)
const { Sandbox, SandboxNotFoundError } = e2b
const template = process.env.SPACE_E2B_TEMPLATE || 'base'
const key2 = process.env.SPACE_E2B_KEY2
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const last = (list) => list[list.length - 1]

describe(`e2b SDK (${pkg}) parity: metrics, snapshots, fork, signed URLs`, () => {
  let sbx
  const made = []

  before(async () => {
    sbx = await Sandbox.create(template, { timeoutMs: 300_000 })
    made.push(sbx.sandboxId)
  })

  after(async () => {
    for (const id of made) await Sandbox.kill(id).catch(() => {})
  })

  test('getMetrics: real figures; CPU, memory and disk rise with use', async () => {
    const idle = last(await sbx.getMetrics())
    assert.ok(idle, 'no sample')
    assert.ok(idle.timestamp instanceof Date && !isNaN(idle.timestamp), `timestamp ${idle.timestamp}`)
    assert.ok(idle.cpuCount >= 1 && idle.memTotal > 0 && idle.memUsed > 0 && idle.diskTotal > 0 && idle.diskUsed > 0, JSON.stringify(idle))
    await sleep(1100)
    const calm = last(await sbx.getMetrics())
    await sbx.commands.run(`timeout 3 sh -c 'while :; do :; done'`, { background: true })
    await sleep(2000)
    const busy = last(await sbx.getMetrics())
    assert.ok(busy.cpuUsedPct >= 20 / busy.cpuCount && busy.cpuUsedPct > calm.cpuUsedPct,
      `cpu idle ${calm.cpuUsedPct}%, burning ${busy.cpuUsedPct}% of ${busy.cpuCount}`)

    await sbx.commands.run(`x=$(head -c 67108864 /dev/zero | tr '\\0' a); sleep 6; echo \${#x}`, { background: true })
    let mem
    for (let i = 0; i < 20; i++) {
      await sleep(500)
      mem = last(await sbx.getMetrics())
      if (mem.memUsed - calm.memUsed > 48 << 20) break
    }
    assert.ok(mem.memUsed - calm.memUsed > 48 << 20, `memUsed ${calm.memUsed} -> ${mem.memUsed}`)

    const before = last(await sbx.getMetrics())
    await sbx.commands.run('head -c 33554432 /dev/urandom > $HOME/big.bin && sync')
    await sleep(1100)
    const afterW = last(await sbx.getMetrics())
    assert.ok(afterW.diskUsed - before.diskUsed > 24 << 20, `diskUsed ${before.diskUsed} -> ${afterW.diskUsed}`)
    await sbx.commands.run('rm -f $HOME/big.bin')

    // start/end select samples: the first second holds the first sample only.
    const all = await sbx.getMetrics()
    const first = await sbx.getMetrics({ start: idle.timestamp, end: idle.timestamp })
    assert.ok(first.length >= 1 && first.length < all.length, `${first.length} of ${all.length}`)
  })

  test('createSnapshot, Sandbox.create(snapshotId), listSnapshots, deleteSnapshot', async () => {
    await sbx.files.write('/home/user/snap.txt', 'before the snapshot')
    const snap = await sbx.createSnapshot({ name: 'parity-snap' })
    assert.match(snap.snapshotId, /^snap-[0-9a-f]{16}$/)
    assert.deepEqual(snap.names, ['parity-snap'])
    // The source runs on.
    assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n')
    await sbx.files.write('/home/user/snap.txt', 'after the snapshot')

    const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
    assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId && s.names[0] === 'parity-snap'), JSON.stringify(listed))
    const byName = await Sandbox.listSnapshots({ name: 'parity-snap' }).nextItems()
    assert.deepEqual(byName.map((s) => s.snapshotId), [snap.snapshotId])
    const paged = Sandbox.listSnapshots({ limit: 1 })
    assert.equal((await paged.nextItems()).length, 1)

    const restored = await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000 })
    made.push(restored.sandboxId)
    assert.notEqual(restored.sandboxId, sbx.sandboxId)
    assert.equal(await restored.files.read('/home/user/snap.txt'), 'before the snapshot')
    assert.equal((await restored.commands.run('echo restored')).stdout, 'restored\n')

    // Another project sees none of it.
    if (key2) {
      const other = await Sandbox.listSnapshots({ apiKey: key2 }).nextItems()
      assert.ok(!other.some((s) => s.snapshotId === snap.snapshotId))
      await assert.rejects(Sandbox.create(snap.snapshotId, { apiKey: key2 }))
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, { apiKey: key2 }), false)
    }

    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
    const gone = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
    assert.ok(!gone.some((s) => s.snapshotId === snap.snapshotId))
    await assert.rejects(Sandbox.create(snap.snapshotId))
  })

  test('fork: count sandboxes with the files of the moment; the source runs on', async () => {
    if (typeof sbx.fork !== 'function') return // not in this SDK version
    await sbx.files.write('/home/user/fork.txt', 'forked state')
    const forks = await sbx.fork({ count: 2, timeoutMs: 120_000 })
    assert.equal(forks.length, 2)
    for (const f of forks) {
      assert.ok(f instanceof Sandbox, String(f))
      made.push(f.sandboxId)
      assert.equal(await f.files.read('/home/user/fork.txt'), 'forked state')
    }
    assert.notEqual(forks[0].sandboxId, forks[1].sandboxId)
    assert.equal((await sbx.commands.run('echo source')).stdout, 'source\n')
    // The fork's snapshot is the fork's means, not kept.
    const left = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
    assert.deepEqual(left, [])
    await assert.rejects(Sandbox.fork('sbx-0000000000000000', { count: 1 }), SandboxNotFoundError)
  })

  test('signed download and upload URLs', async () => {
    await sbx.files.write('/home/user/signed.txt', 'signed content')
    const hdr = { 'E2b-Sandbox-Id': sbx.sandboxId }
    const down = await sbx.downloadUrl('/home/user/signed.txt')
    assert.match(down, /signature=v1_/)
    let res = await fetch(down, { headers: hdr })
    assert.equal(res.status, 200)
    assert.equal(await res.text(), 'signed content')
    // The <port>-<id>.<domain> Host form, no header (fetch cannot set Host).
    const byHost = await new Promise((resolve, reject) => {
      http.get(down, { headers: { Host: `49983-${sbx.sandboxId}.sandbox.local` } }, (r) => {
        let body = ''
        r.on('data', (d) => { body += d })
        r.on('end', () => resolve({ status: r.statusCode, body }))
      }).on('error', reject)
    })
    assert.deepEqual(byHost, { status: 200, body: 'signed content' })
    // With an expiration, and as another user.
    const exp = await sbx.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: 60, user: 'root' })
    assert.match(exp, /signature_expiration=\d+/)
    res = await fetch(exp, { headers: hdr })
    assert.equal(res.status, 200)

    // Upload through the signed URL (multipart, as a browser form would).
    const up = await sbx.uploadUrl('/home/user/uploaded.txt')
    const form = new FormData()
    form.append('file', new Blob(['uploaded via url']), '/home/user/uploaded.txt')
    res = await fetch(up, { method: 'POST', body: form, headers: hdr })
    assert.equal(res.status, 200, await res.clone().text())
    assert.equal(await sbx.files.read('/home/user/uploaded.txt'), 'uploaded via url')

    // Refused: tampered, expired, other path, other operation, other user,
    // no sandbox.
    const tampered = new URL(down)
    const sig = tampered.searchParams.get('signature')
    tampered.searchParams.set('signature', sig.slice(0, -2) + (sig.endsWith('A') ? 'BB' : 'AA'))
    const other = new URL(down)
    other.searchParams.set('path', '/etc/passwd')
    const asRoot = new URL(down)
    asRoot.searchParams.set('username', 'root')
    const expired = new URL(exp)
    expired.searchParams.set('signature_expiration', String(Math.floor(Date.now() / 1000) - 10))
    for (const [name, url, init] of [
      ['tampered', tampered, { headers: hdr }],
      ['other path', other, { headers: hdr }],
      ['other user', asRoot, { headers: hdr }],
      ['expired', expired, { headers: hdr }],
      ['read URL used to write', down, { method: 'POST', body: form, headers: hdr }],
      ['write URL used to read', up, { headers: hdr }],
    ]) {
      res = await fetch(url, init)
      assert.equal(res.status, 401, `${name}: ${res.status} ${await res.text()}`)
    }
    const expiredSig = await sbx.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: -5 })
    res = await fetch(expiredSig, { headers: hdr })
    assert.equal(res.status, 401, 'signature that expired 5 s ago')
  })
})
