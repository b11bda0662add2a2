// Drives the real e2b npm SDK against a running `space server`.
// Started by e2b_test.go, which sets:
//   E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY  how the SDK finds SPACE
//   SPACE_E2B_PKG        "e2b" (2.51.0) or "e2b-2.50" (npm alias of 2.50.0)
//   SPACE_E2B_TEMPLATE   the template to create sandboxes from (default "base")
//   SPACE_E2B_CONCURRENCY how many sandboxes the concurrency test makes (default 10)
import { test, describe, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'

const pkg = process.env.SPACE_E2B_PKG || 'e2b'
const e2b = await import(pkg)
const { Sandbox, CommandExitError, SandboxNotFoundError, AuthenticationError, FileNotFoundError, FilesystemEventType } = e2b
const template = process.env.SPACE_E2B_TEMPLATE || 'base'
const concurrency = Number(process.env.SPACE_E2B_CONCURRENCY || 10)
const runID = randomBytes(4).toString('hex')
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

describe(`e2b SDK (${pkg}) against SPACE`, () => {
  let sbx

  before(async () => {
    sbx = await Sandbox.create(template, {
      metadata: { suite: `main-${runID}` },
      envs: { SANDBOX_VAR: 'from-create' },
      timeoutMs: 300_000,
    })
  })

  after(async () => {
    if (sbx) await Sandbox.kill(sbx.sandboxId).catch(() => {})
  })

  test('create, getInfo, isRunning', async () => {
    assert.match(sbx.sandboxId, /^sbx-[0-9a-f]{16}$/)
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.metadata.suite, `main-${runID}`)
    assert.equal(info.state, 'running')
    assert.ok(info.endAt > info.startedAt)
    assert.equal(await sbx.isRunning(), true)
  })

  test('commands.run without callbacks', async () => {
    const r = await sbx.commands.run('echo hello; echo oops >&2')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello\n')
    assert.equal(r.stderr, 'oops\n')
  })

  test('commands.run streams output to callbacks', async () => {
    const out = []
    const errs = []
    const times = []
    const r = await sbx.commands.run('for i in 1 2 3; do echo line$i; sleep 0.3; done; echo bad >&2', {
      onStdout: (d) => { out.push(d); times.push(Date.now()) },
      onStderr: (d) => errs.push(d),
    })
    assert.equal(out.join(''), 'line1\nline2\nline3\n')
    assert.equal(errs.join(''), 'bad\n')
    assert.equal(r.exitCode, 0)
    // Output arrived incrementally, not all at the end.
    assert.ok(times.length >= 3 && times[times.length - 1] - times[0] >= 400, `chunks at ${times}`)
  })

  test('non-zero exit raises CommandExitError', async () => {
    await assert.rejects(sbx.commands.run('echo partial; exit 3'), (err) => {
      assert.ok(err instanceof CommandExitError)
      assert.equal(err.exitCode, 3)
      assert.equal(err.stdout, 'partial\n')
      return true
    })
  })

  test('env and cwd', async () => {
    const r = await sbx.commands.run('echo "$FOO $SANDBOX_VAR"; pwd', { envs: { FOO: 'bar' }, cwd: '/tmp' })
    assert.equal(r.stdout, 'bar from-create\n/tmp\n')
    const home = await sbx.commands.run('pwd; whoami')
    assert.equal(home.stdout, '/home/user\nuser\n')
    const root = await sbx.commands.run('whoami', { user: 'root' })
    assert.equal(root.stdout, 'root\n')
  })

  test('background command, list, connect, kill', async () => {
    const h = await sbx.commands.run('echo started; sleep 60', { background: true })
    assert.ok(h.pid > 0)
    const procs = await sbx.commands.list()
    assert.ok(procs.some((p) => p.pid === h.pid), `pid ${h.pid} not in ${JSON.stringify(procs)}`)
    const c = await sbx.commands.connect(h.pid)
    assert.equal(await c.kill(), true)
    await assert.rejects(c.wait(), (err) => {
      assert.ok(err instanceof CommandExitError)
      assert.equal(err.exitCode, -1)
      assert.match(err.error, /killed/)
      return true
    })
    assert.equal(await sbx.commands.kill(h.pid), false) // gone now
    // A finished background command can still be connected to for its result.
    const short = await sbx.commands.run('echo done-bg', { background: true })
    const res = await (await sbx.commands.connect(short.pid)).wait()
    assert.equal(res.stdout, 'done-bg\n')
  })

  test('stdin', async () => {
    const h = await sbx.commands.run('cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'hello ')
    await sbx.commands.sendStdin(h.pid, 'stdin\n')
    await sbx.commands.closeStdin(h.pid)
    const r = await h.wait()
    assert.equal(r.stdout, 'hello stdin\n')
  })

  test('files: write, read, exists, list, getInfo, rename, makeDir, remove', async () => {
    const dir = `/tmp/files-${runID}`
    assert.equal(await sbx.files.makeDir(dir), true)
    assert.equal(await sbx.files.makeDir(dir), false)
    const w = await sbx.files.write(`${dir}/a.txt`, 'alpha')
    assert.equal(w.path, `${dir}/a.txt`)
    assert.equal(await sbx.files.read(`${dir}/a.txt`), 'alpha')
    await sbx.files.write([
      { path: `${dir}/b.txt`, data: 'beta' },
      { path: `${dir}/sub/c.txt`, data: 'gamma' },
    ])
    assert.equal(await sbx.files.read(`${dir}/sub/c.txt`), 'gamma')
    assert.equal(await sbx.files.exists(`${dir}/b.txt`), true)
    assert.equal(await sbx.files.exists(`${dir}/nope`), false)
    const names = (await sbx.files.list(dir)).map((e) => e.name).sort()
    assert.deepEqual(names, ['a.txt', 'b.txt', 'sub'])
    const deep = (await sbx.files.list(dir, { depth: 2 })).map((e) => e.path).sort()
    assert.ok(deep.includes(`${dir}/sub/c.txt`), JSON.stringify(deep))
    const info = await sbx.files.getInfo(`${dir}/a.txt`)
    assert.equal(info.type, 'file')
    assert.equal(info.size, 5)
    const moved = await sbx.files.rename(`${dir}/a.txt`, `${dir}/renamed.txt`)
    assert.equal(moved.path, `${dir}/renamed.txt`)
    assert.equal(await sbx.files.exists(`${dir}/a.txt`), false)
    await sbx.files.remove(`${dir}/sub`)
    assert.equal(await sbx.files.exists(`${dir}/sub`), false)
    await assert.rejects(sbx.files.read(`${dir}/missing`), FileNotFoundError)
    // Relative paths resolve against the user's home.
    await sbx.files.write('rel.txt', 'home')
    assert.equal((await sbx.commands.run('cat /home/user/rel.txt')).stdout, 'home')
  })

  test('files act as the user, with its permissions', async () => {
    // No user: the sandbox's default user ("user"), as commands run.
    await sbx.files.write(`/tmp/owned-${runID}`, 'x')
    assert.equal((await sbx.commands.run(`stat -c %U /tmp/owned-${runID}`)).stdout, 'user\n')
    // /root is 0700: refused as a command of user would be, allowed to root.
    await assert.rejects(sbx.files.write(`/root/denied-${runID}`, 'x'))
    await sbx.files.write(`/root/ok-${runID}`, 'r', { user: 'root' })
    assert.equal((await sbx.commands.run(`stat -c %U /root/ok-${runID}`, { user: 'root' })).stdout, 'root\n')
    await assert.rejects(sbx.files.read(`/root/ok-${runID}`))
    assert.equal(await sbx.files.read(`/root/ok-${runID}`, { user: 'root' }), 'r')
    await assert.rejects(sbx.files.makeDir(`/root/d-${runID}`))
    assert.equal(await sbx.files.makeDir(`/root/d-${runID}`, { user: 'root' }), true)
    assert.equal((await sbx.commands.run(`ls /root`, { user: 'root' })).stdout.includes(`denied-${runID}`), false)
  })

  test('files.watchDir', async () => {
    const dir = `/tmp/watch-${runID}`
    await sbx.files.makeDir(dir)
    const events = []
    const handle = await sbx.files.watchDir(dir, (ev) => events.push(ev))
    try {
      await sbx.files.write(`${dir}/new.txt`, 'x')
      const deadline = Date.now() + 5000
      while (!events.some((e) => e.name === 'new.txt' && e.type === FilesystemEventType.WRITE) && Date.now() < deadline) {
        await sleep(100)
      }
      assert.ok(events.some((e) => e.name === 'new.txt' && e.type === FilesystemEventType.WRITE), JSON.stringify(events))
      await sbx.files.remove(`${dir}/new.txt`)
      while (!events.some((e) => e.type === FilesystemEventType.REMOVE) && Date.now() < deadline + 5000) {
        await sleep(100)
      }
      assert.ok(events.some((e) => e.name === 'new.txt' && e.type === FilesystemEventType.REMOVE), JSON.stringify(events))
    } finally {
      await handle.stop()
    }
  })

  test('upload and download of 20 MB', async () => {
    const data = randomBytes(20 << 20)
    const sum = createHash('sha256').update(data).digest('hex')
    await sbx.files.write('/tmp/big.bin', data)
    const back = Buffer.from(await sbx.files.read('/tmp/big.bin', { format: 'bytes' }))
    assert.equal(back.length, data.length)
    assert.equal(createHash('sha256').update(back).digest('hex'), sum)
    const r = await sbx.commands.run('sha256sum /tmp/big.bin')
    assert.equal(r.stdout.split(' ')[0], sum)
  })

  test('setTimeout extends the end', async () => {
    await sbx.setTimeout(600_000)
    const info = await sbx.getInfo()
    const left = info.endAt.getTime() - Date.now()
    assert.ok(left > 590_000 && left <= 601_000, `left ${left}`)
  })

  test('connect returns a working sandbox', async () => {
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await again.commands.run('echo via-connect')).stdout, 'via-connect\n')
  })

  test('pause freezes the sandbox; connect resumes it with its files', async () => {
    await sbx.files.write('/tmp/kept', 'kept across pause')
    assert.equal(await sbx.pause(), true)
    assert.equal(await sbx.pause(), false) // already paused: E2B's 409
    assert.equal(await sbx.isRunning(), false)
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await again.commands.run('cat /tmp/kept')).stdout, 'kept across pause')
    assert.equal(await sbx.isRunning(), true)
  })

  test('lifecycle onTimeout pause + autoResume: hibernates at the timeout, traffic resumes it', async () => {
    const tag = `life-${runID}`
    const s = await Sandbox.create(template, {
      metadata: { suite: tag }, timeoutMs: 3_000, lifecycle: { onTimeout: 'pause', autoResume: true },
    })
    try {
      await s.files.write('/tmp/kept', 'kept across timeout')
      // A background process: with process hibernation (gVisor, or the
      // namespace driver with CRIU: SPACE_E2B_PROCESSES=1) it is still
      // the same process, counting on, after the resume.
      await s.commands.run("sh -c 'echo $$ > /tmp/bgpid; i=0; while true; do i=$((i+1)); echo $i > /tmp/bgn.new; mv /tmp/bgn.new /tmp/bgn; sleep 0.1; done'", { background: true })
      const info = await s.getInfo()
      assert.equal(info.lifecycle?.onTimeout, 'pause')
      assert.equal(info.lifecycle?.autoResume, true)
      let state = info.state
      for (let i = 0; i < 100 && state !== 'paused'; i++) {
        await sleep(200)
        state = (await s.getInfo()).state
      }
      assert.equal(state, 'paused', 'not paused at its timeout')
      const listed = await Sandbox.list({ query: { metadata: { suite: tag }, state: ['paused'] } }).nextItems()
      assert.deepEqual(listed.map((x) => x.sandboxId), [s.sandboxId])
      const all = await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems()
      assert.deepEqual(all.map((x) => x.sandboxId), [s.sandboxId], 'no state filter lists paused sandboxes too')
      // No connect: the command's own envd request resumes it.
      assert.equal((await s.commands.run('cat /tmp/kept')).stdout, 'kept across timeout')
      assert.equal((await s.getInfo()).state, 'running')
      if (process.env.SPACE_E2B_PROCESSES === '1') {
        const probe = 'p=$(cat /tmp/bgpid); kill -0 $p && echo "$p $(cat /tmp/bgn)"'
        const [pid, n1] = (await s.commands.run(probe)).stdout.trim().split(' ')
        await sleep(500)
        const [pid2, n2] = (await s.commands.run(probe)).stdout.trim().split(' ')
        assert.equal(pid2, pid, 'the background process is not the one that ran before the pause')
        assert.ok(Number(n1) > 0 && Number(n2) > Number(n1), `background counter ${n1} then ${n2}: not running on`)
      }
    } finally {
      await Sandbox.kill(s.sandboxId).catch(() => {})
    }
  })

  test('list with metadata filter and paging', async () => {
    const tag = `list-${runID}`
    const made = await Promise.all([0, 1, 2].map((i) =>
      Sandbox.create(template, { metadata: { suite: tag, idx: String(i) }, timeoutMs: 120_000 })))
    try {
      const seen = []
      const pager = Sandbox.list({ query: { metadata: { suite: tag }, state: ['running'] }, limit: 2 })
      let pages = 0
      while (pager.hasNext && pages < 5) {
        const items = await pager.nextItems()
        pages++
        assert.ok(items.length <= 2)
        seen.push(...items.map((s) => s.sandboxId))
      }
      assert.equal(pages, 2)
      assert.deepEqual(seen.sort(), made.map((s) => s.sandboxId).sort())
      const one = await Sandbox.list({ query: { metadata: { suite: tag, idx: '1' } } }).nextItems()
      assert.deepEqual(one.map((s) => s.sandboxId), [made[1].sandboxId])
      const paused = await Sandbox.list({ query: { metadata: { suite: tag }, state: ['paused'] } }).nextItems()
      assert.deepEqual(paused, [])
    } finally {
      await Promise.all(made.map((s) => s.kill()))
    }
  })

  test('kill, then the sandbox is gone', async () => {
    const s = await Sandbox.create(template, { timeoutMs: 60_000 })
    await s.kill()
    assert.equal(await s.isRunning(), false)
    assert.equal(await Sandbox.kill(s.sandboxId), false)
    await assert.rejects(s.getInfo(), SandboxNotFoundError)
    await assert.rejects(Sandbox.connect(s.sandboxId), SandboxNotFoundError)
  })

  test('unknown sandbox and bad key', async () => {
    await assert.rejects(Sandbox.connect('sbx-0000000000000000'), SandboxNotFoundError)
    await assert.rejects(Sandbox.getInfo('nonsense'), SandboxNotFoundError)
    await assert.rejects(Sandbox.create(template, { apiKey: 'space_bad_key' }), AuthenticationError)
    await assert.rejects(Sandbox.list({ apiKey: 'e2b_wrong' }).nextItems(), AuthenticationError)
    await assert.rejects(Sandbox.create('no-such-template'), /404|not found/i)
  })

  test(`${concurrency} concurrent sandboxes each run a command`, async () => {
    const results = await Promise.allSettled(Array.from({ length: concurrency }, async (_, i) => {
      const s = await Sandbox.create(template, { timeoutMs: 120_000, metadata: { suite: `conc-${runID}` } })
      try {
        const r = await s.commands.run(`echo n${i}`)
        assert.equal(r.stdout, `n${i}\n`)
      } finally {
        await s.kill()
      }
    }))
    const failed = results.filter((r) => r.status === 'rejected')
    assert.equal(failed.length, 0, failed.map((f) => String(f.reason)).join('\n'))
  })
})
