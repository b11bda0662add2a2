// The unmodified @e2b/code-interpreter SDK (2.8.0, on e2b 2.51.0) against
// SPACE's code-interpreter-v1 template and its interpreter server.
// Started by interp_test.go with the variables sdk.test.mjs documents.
import { test, describe, before, after } from 'node:test'
import assert from 'node:assert/strict'

const { Sandbox } = await import('@e2b/code-interpreter')
const sandboxURL = process.env.E2B_SANDBOX_URL
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]

describe('@e2b/code-interpreter against SPACE', () => {
  let sbx, priv
  const timings = {}

  before(async () => {
    // The SDK's default template is code-interpreter-v1.
    const t0 = performance.now()
    sbx = await Sandbox.create({ timeoutMs: 600_000, envs: { SANDBOX_VAR: 'from-create' } })
    timings.create = performance.now() - t0
    const t1 = performance.now()
    const first = await sbx.runCode('x = 1; x + 1')
    timings.firstRunCode = performance.now() - t1
    assert.equal(first.text, '2', JSON.stringify(first))
  })

  after(async () => {
    for (const s of [sbx, priv]) if (s) await Sandbox.kill(s.sandboxId).catch(() => {})
    console.log(`timings (ms): ${JSON.stringify(timings)}`)
  })

  test('state is kept across runCode calls; execution count grows', async () => {
    const a = await sbx.runCode('x + 41')
    assert.equal(a.text, '42')
    const b = await sbx.runCode('def f(n):\n    return n * x\nf(5)')
    assert.equal(b.text, '5')
    assert.ok(b.executionCount > a.executionCount, `${a.executionCount} then ${b.executionCount}`)
    const n = 50 // also a regression check: streamed answers were cut at ~5% before full duplex
    const runs = []
    for (let i = 0; i < n; i++) {
      const t = performance.now()
      assert.equal((await sbx.runCode('x+1')).text, '2')
      runs.push(performance.now() - t)
    }
    timings.runCodeP50 = median(runs)
    // The same round trip for commands.run, for comparison.
    const cmds = []
    for (let i = 0; i < n; i++) {
      const t = performance.now()
      await sbx.commands.run('true')
      cmds.push(performance.now() - t)
    }
    timings.commandsRunP50 = median(cmds)
  })

  test('stdout and stderr reach the callbacks and the logs', async () => {
    const out = [], err = []
    const ex = await sbx.runCode('import sys\nprint("hello out")\nprint("hello err", file=sys.stderr)', {
      onStdout: (m) => out.push(m.line), onStderr: (m) => err.push(m.line),
    })
    assert.equal(ex.error, undefined)
    assert.deepEqual(out, ['hello out\n'])
    assert.deepEqual(err, ['hello err\n'])
    assert.deepEqual(ex.logs.stdout, ['hello out\n'])
    assert.deepEqual(ex.logs.stderr, ['hello err\n'])
  })

  test('an exception is an error with name, value and traceback', async () => {
    const seen = []
    const ex = await sbx.runCode('def g():\n    return 1/0\ng()', { onError: (e) => seen.push(e) })
    assert.equal(ex.error.name, 'ZeroDivisionError')
    assert.equal(ex.error.value, 'division by zero')
    assert.match(ex.error.traceback, /ZeroDivisionError/)
    assert.match(ex.error.traceback, /g\(\)/)
    assert.equal(seen.length, 1)
    assert.equal(ex.results.length, 0)
    // The context survives its error.
    assert.equal((await sbx.runCode('x')).text, '1')
  })

  test('a matplotlib figure comes back as a PNG result', async () => {
    const ex = await sbx.runCode(
      'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("squares")\nplt.show()')
    assert.equal(ex.error, undefined, JSON.stringify(ex.error))
    const png = ex.results.find((r) => r.png)
    assert.ok(png, `no PNG among ${ex.results.map((r) => r.formats())}`)
    const bytes = Buffer.from(png.png, 'base64')
    assert.deepEqual([...bytes.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
    assert.ok(bytes.length > 1000, `PNG of ${bytes.length} bytes`)
    assert.equal(png.isMainResult, false)
  })

  test('a pandas DataFrame comes back as HTML and data', async () => {
    const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})')
    assert.equal(ex.error, undefined, JSON.stringify(ex.error))
    const r = ex.results.find((r) => r.isMainResult)
    assert.ok(r, 'no main result')
    assert.match(r.html, /<table[\s\S]*<td>x<\/td>/)
    assert.deepEqual(r.data, { a: [1, 2], b: ['x', 'y'] })
    assert.match(r.text, /a\s+b/)
    assert.ok(r.formats().includes('html') && r.formats().includes('data'), String(r.formats()))
  })

  test('env vars apply to one execution only; sandbox envs are seen', async () => {
    const code = 'import os\nstr(os.environ.get("PER_RUN"))'
    assert.equal((await sbx.runCode(code, { envs: { PER_RUN: "it's set" } })).text, "it's set")
    assert.equal((await sbx.runCode(code)).text, 'None')
    assert.equal((await sbx.runCode('os.environ.get("SANDBOX_VAR")')).text, 'from-create')
  })

  test('contexts: create with cwd, isolated state, list, restart, remove', async () => {
    const ctx = await sbx.createCodeContext({ language: 'python', cwd: '/tmp' })
    assert.equal(ctx.language, 'python')
    assert.equal(ctx.cwd, '/tmp')
    assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, '/tmp')
    const iso = await sbx.runCode('x', { context: ctx })
    assert.equal(iso.error?.name, 'NameError', 'the new context sees the default one\'s x')
    await sbx.runCode('y = 7', { context: ctx })
    assert.equal((await sbx.runCode('y', { context: ctx })).text, '7')
    const list = await sbx.listCodeContexts()
    assert.ok(list.some((c) => c.id === ctx.id && c.cwd === '/tmp'), JSON.stringify(list))
    await sbx.restartCodeContext(ctx)
    assert.equal((await sbx.runCode('y', { context: ctx })).error?.name, 'NameError')
    await sbx.removeCodeContext(ctx.id)
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
    await assert.rejects(sbx.runCode('1', { context: ctx }), (e) => e.name === 'NotFoundError')
    // The default context kept its state throughout.
    assert.equal((await sbx.runCode('x')).text, '1')
  })

  test('JavaScript: default context keeps state; own contexts; errors', async () => {
    const a = await sbx.runCode('let a = 40; a + 2', { language: 'javascript' })
    assert.equal(a.text, '42', JSON.stringify(a))
    const out = []
    const b = await sbx.runCode('console.log("js says", a); a + 1', { language: 'js', onStdout: (m) => out.push(m.line) })
    assert.equal(b.text, '41')
    assert.deepEqual(out, ['js says 40\n'])
    const c = await sbx.runCode('await new Promise((r) => setTimeout(() => r(a * 2), 10))', { language: 'javascript' })
    assert.equal(c.text, '80')
    const e = await sbx.runCode('null.foo', { language: 'javascript' })
    assert.equal(e.error?.name, 'TypeError')
    assert.match(e.error.traceback, /TypeError/)
    const env = await sbx.runCode('process.env.PER_RUN', { language: 'javascript', envs: { PER_RUN: 'js-env' } })
    assert.equal(env.text, 'js-env')
    assert.equal((await sbx.runCode('process.env.PER_RUN', { language: 'javascript' })).text, undefined)
    const ctx = await sbx.createCodeContext({ language: 'javascript', cwd: '/tmp' })
    assert.equal((await sbx.runCode('process.cwd()', { context: ctx })).text, '/tmp')
    assert.equal((await sbx.runCode('typeof a', { context: ctx })).text, 'undefined')
    await sbx.removeCodeContext(ctx)
  })

  test('TypeScript: cells are transpiled in their own context; types stripped, syntax checked', async () => {
    const a = await sbx.runCode('interface P { n: number }\nconst p: P = { n: 40 }\np.n + 2', { language: 'typescript' })
    assert.equal(a.text, '42', JSON.stringify(a))
    const b = await sbx.runCode('import * as path from "path"; path.join("a", String(p.n as number))', { language: 'ts' })
    assert.equal(b.text, 'a/40', JSON.stringify(b))
    assert.equal((await sbx.runCode('typeof p', { language: 'javascript' })).text, 'undefined')
    const e = await sbx.runCode('let bad: = 1', { language: 'typescript' })
    assert.equal(e.error?.name, 'SyntaxError', JSON.stringify(e))
    const ctx = await sbx.createCodeContext({ language: 'typescript', cwd: '/tmp' })
    assert.equal(ctx.language, 'typescript')
    assert.equal((await sbx.runCode('const c: string = process.cwd(); c', { context: ctx })).text, '/tmp')
    await sbx.removeCodeContext(ctx)
  })

  test('R in an R context: state, output, data frames, errors, env vars', async () => {
    const ctx = await sbx.createCodeContext({ language: 'r', cwd: '/tmp' })
    assert.equal(ctx.language, 'r')
    const a = await sbx.runCode('r1 <- 21; r1 * 2', { context: ctx })
    assert.equal(a.text, '[1] 42', JSON.stringify(a))
    const out = []
    const b = await sbx.runCode('cat("from R\\n"); getwd()', { context: ctx, onStdout: (m) => out.push(m.line) })
    assert.deepEqual(out, ['from R\n'])
    assert.equal(b.text, '[1] "/tmp"')
    const df = await sbx.runCode('data.frame(a = 1:2, b = c("x", "y"))', { context: ctx })
    assert.equal(df.error, undefined, JSON.stringify(df.error))
    assert.match(df.results[0].html, /<table[\s\S]*<td>x<\/td>/)
    const e = await sbx.runCode('stop("boom")', { context: ctx })
    assert.match(e.error?.value ?? '', /boom/, JSON.stringify(e))
    const env = await sbx.runCode('Sys.getenv("PER_RUN")', { context: ctx, envs: { PER_RUN: "r's env" } })
    assert.equal(env.text, '[1] "r\'s env"')
    assert.equal((await sbx.runCode('Sys.getenv("PER_RUN")', { context: ctx })).text, '[1] ""')
    // language 'r' without a context: the default R context, not ctx.
    assert.equal((await sbx.runCode('exists("r1")', { language: 'r' })).text, '[1] FALSE')
    await sbx.removeCodeContext(ctx)
  })

  test('bash contexts keep variables and cwd; a failing cell is an error', async () => {
    const out = []
    const a = await sbx.runCode('B=5; cd /tmp; echo "b=$B"', { language: 'bash', onStdout: (m) => out.push(m.line) })
    assert.equal(a.error, undefined)
    assert.deepEqual(out, ['b=5\n'])
    const b = await sbx.runCode('echo "$B $PWD $PER_RUN"; false', { language: 'bash', envs: { PER_RUN: 'e' } })
    assert.deepEqual(b.logs.stdout, ['5 /tmp e\n'])
    assert.equal(b.error?.name, 'ExitCode')
    assert.equal(b.error?.value, '1')
  })

  test('unsupported languages are refused, not run as Python', async () => {
    await assert.rejects(sbx.runCode('print(1)', { language: 'cobol' }), /400/)
    await assert.rejects(sbx.createCodeContext({ language: 'fortran' }), /400/)
  })

  test('a timeout interrupts the kernel and the context stays usable', async () => {
    const code = 'import time\ntry:\n    time.sleep(120)\nexcept KeyboardInterrupt:\n    open("/tmp/interrupted", "w").write("yes")\n    raise'
    const t0 = performance.now()
    await assert.rejects(sbx.runCode(code, { timeoutMs: 2000 }), (e) => e.name === 'TimeoutError')
    assert.ok(performance.now() - t0 < 30_000)
    // The next run waits for the interrupted one, which the server stopped
    // when the client went away: well before the sleep's 120 s.
    const t1 = performance.now()
    const ex = await sbx.runCode('open("/tmp/interrupted").read()', { timeoutMs: 60_000 })
    assert.equal(ex.text, 'yes')
    assert.ok(performance.now() - t1 < 60_000)
    assert.equal((await sbx.runCode('x')).text, '1')
  })

  test('an endless JavaScript loop is interrupted too', async () => {
    await assert.rejects(sbx.runCode('while (true) {}', { language: 'javascript', timeoutMs: 2000 }), (e) => e.name === 'TimeoutError')
    const ex = await sbx.runCode('a', { language: 'javascript', timeoutMs: 60_000 })
    assert.equal(ex.text, '40')
  })

  test('a private sandbox runs code with its traffic token and refuses without', async () => {
    priv = await Sandbox.create({ timeoutMs: 300_000, network: { allowPublicTraffic: false } })
    assert.ok(priv.trafficAccessToken)
    assert.equal((await priv.runCode('6 * 7')).text, '42')
    const anon = await fetch(`${sandboxURL}/execute`, {
      method: 'POST',
      headers: { 'E2b-Sandbox-Id': priv.sandboxId, 'E2b-Sandbox-Port': '49999', 'Content-Type': 'application/json' },
      body: JSON.stringify({ code: '1' }),
    })
    assert.equal(anon.status, 401)
    await anon.arrayBuffer()
  })

  test('bad requests get JSON errors', async () => {
    const hdr = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49999', 'Content-Type': 'application/json' }
    for (const body of ['{"code": 5}', '[]', '{"code": "1", "context_id": "c", "language": "python"}', '{"code": "1", "env_vars": {"A=B": "x"}}']) {
      const r = await fetch(`${sandboxURL}/execute`, { method: 'POST', headers: hdr, body })
      assert.equal(r.status, 400, body)
      assert.equal(typeof (await r.json()).error.message, 'string')
    }
    const h = await fetch(`${sandboxURL}/health`, { headers: hdr })
    assert.equal(h.status, 200)
    await h.arrayBuffer()
  })
})
