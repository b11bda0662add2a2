// A stateful JavaScript context of SPACE's code interpreter (server.py):
// Debian's Node.js has no packaged Jupyter kernel, so each JavaScript
// context is one of these processes. Requests arrive as JSON lines on
// stdin ({code, env}); events go out as JSON lines on the fd named by
// SPACE_INTERP_FD (stdout, stderr, result, error, then end), so output of
// child processes on fd 1/2 cannot corrupt the channel. Cells run as scripts in this process's
// global scope, so declarations persist from one cell to the next, as in
// the Node REPL. SIGINT interrupts the running cell.
'use strict'
const fs = require('node:fs')
const vm = require('node:vm')
const util = require('node:util')
const readline = require('node:readline')

// The event channel's fd, passed by server.py.
const OUT = Number(process.env.SPACE_INTERP_FD || 3)
delete process.env.SPACE_INTERP_FD
let count = 0
let current = null // {cancel} of the cell being awaited

function send(ev) {
  const line = JSON.stringify(ev) + '\n'
  fs.writeSync(OUT, line)
}

function now() { return new Date().toISOString() }

// User output goes to the cell's stream events, in order with its result.
const fmt = (args) => util.formatWithOptions({ colors: false }, ...args) + '\n'
const out = (...a) => send({ type: 'stdout', text: fmt(a), timestamp: now() })
const err = (...a) => send({ type: 'stderr', text: fmt(a), timestamp: now() })
console.log = console.info = console.debug = out
console.error = console.warn = console.trace = err
const write = (type) => (chunk, enc, cb) => {
  send({ type, text: typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString(), timestamp: now() })
  if (typeof enc === 'function') enc()
  else if (typeof cb === 'function') cb()
  return true
}
process.stdout.write = write('stdout')
process.stderr.write = write('stderr')

globalThis.require = require
globalThis.module = module
process.on('SIGINT', () => { if (current) current.cancel() })
process.on('uncaughtException', (e) => send({ type: 'stderr', text: 'Uncaught ' + (e && e.stack || String(e)) + '\n', timestamp: now() }))
process.on('unhandledRejection', (e) => send({ type: 'stderr', text: 'Unhandled rejection ' + (e && e.stack || String(e)) + '\n', timestamp: now() }))

// cellStack is a stack trace without the frames of this driver.
function cellStack(stack) {
  const lines = String(stack || '').split('\n')
  const i = lines.findIndex((l) => /^\s+at .*(node:vm|jsctx\.js)/.test(l))
  return (i < 0 ? lines : lines.slice(0, i)).join('\n')
}

function errorEvent(e) {
  if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e)) {
    return { type: 'error', name: e.name || 'Error', value: e.message || '', traceback: cellStack(e.stack) }
  }
  return { type: 'error', name: 'Error', value: util.inspect(e), traceback: '' }
}

// A TypeScript context (SPACE_INTERP_TS=1) transpiles each cell with
// Debian's node-typescript before running it as JavaScript: types are
// stripped, not checked; syntax errors are reported as SyntaxError.
const ts = process.env.SPACE_INTERP_TS === '1' ? require('typescript') : null
delete process.env.SPACE_INTERP_TS

function transpile(code) {
  if (!ts) return code
  const out = ts.transpileModule(code, {
    reportDiagnostics: true,
    compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.CommonJS, esModuleInterop: true },
  })
  const errs = (out.diagnostics || []).filter((d) => d.category === ts.DiagnosticCategory.Error)
  if (errs.length > 0) {
    const msg = errs.map((d) => {
      const text = ts.flattenDiagnosticMessageText(d.messageText, '\n')
      if (!d.file || d.start === undefined) return text
      const { line, character } = d.file.getLineAndCharacterOfPosition(d.start)
      return `(${line + 1},${character + 1}): ${text}`
    }).join('\n')
    throw new SyntaxError(msg)
  }
  // A cell with import/export is emitted as a CommonJS module: it runs as
  // a script like any cell, so drop the strict marker and the __esModule
  // flag, and declare imports with var so the cell can run again.
  return out.outputText
    .replace(/^"use strict";\s*\n?/, '')
    .replace(/^Object\.defineProperty\(exports, "__esModule", \{ value: true \}\);\s*\n?/m, '')
    .replace(/^const (\w+) = ((?:__importDefault|__importStar)\()?require\(/gm, 'var $1 = $2require(')
}

// run evaluates one cell: as a script (declarations persist), or, when it
// uses top-level await, as the body of an async function (its
// declarations then stay local to the cell, as in E2B's kernel).
async function run(code) {
  code = transpile(code)
  let value
  try {
    value = vm.runInThisContext(code, { filename: `<cell ${count}>`, breakOnSigint: true })
  } catch (e) {
    if (!(e instanceof SyntaxError) || !/await/.test(String(e.message)) && !/await/.test(code)) throw e
    const body = code.trim()
    // The value of a single expression is the result; otherwise none.
    let fn
    try {
      // TypeScript's output ends an expression with ";".
      fn = vm.runInThisContext(`(async () => (${ts ? body.replace(/;$/, '') : body}\n))`, { filename: `<cell ${count}>` })
    } catch {
      fn = vm.runInThisContext(`(async () => {${body}\n})`, { filename: `<cell ${count}>` })
    }
    value = fn()
  }
  if (value && typeof value.then === 'function') {
    value = await new Promise((resolve, reject) => {
      current = { cancel: () => reject(Object.assign(new Error('Execution interrupted'), { name: 'KeyboardInterrupt' })) }
      value.then(resolve, reject)
    }).finally(() => { current = null })
  }
  return value
}

async function handle(req) {
  count++
  const saved = {}
  for (const [k, v] of Object.entries(req.env || {})) {
    saved[k] = Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined
    process.env[k] = String(v)
  }
  send({ type: 'number_of_executions', execution_count: count })
  try {
    const value = await run(String(req.code || ''))
    if (value !== undefined) {
      send({ type: 'result', text: typeof value === 'string' ? value : util.inspect(value, { colors: false }), is_main_result: true })
    }
  } catch (e) {
    send(errorEvent(e))
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]
      else process.env[k] = v
    }
    send({ type: 'end' })
  }
}

// One cell at a time: the server sends the next request only after "end".
const rl = readline.createInterface({ input: process.stdin, terminal: false })
let queue = Promise.resolve()
rl.on('line', (line) => {
  let req
  try {
    req = JSON.parse(line)
  } catch {
    return
  }
  queue = queue.then(() => handle(req))
})
rl.on('close', () => process.exit(0))
send({ type: 'ready' })
