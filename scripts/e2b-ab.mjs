// Compares the E2B SDK round trips of two or more SPACE servers (e.g. a
// build before and after a change), request by request interleaved so
// that both see the same host load: per kind (runCode('x+1'),
// commands.run('true')) N requests per side, and per side the wall time
// (p50/p90/min) and, per request, the CPU ms and voluntary context switches
// (thread wake-ups) of the sandbox's processes (agent, interpreter server,
// kernel; found by the sandbox id in /proc/PID/cgroup) and of the side's
// `space server`: figures a loaded host moves less than the wall time.
// Usage (root, node): N=100 node scripts/e2b-ab.mjs NAME=ENVFILE=SANDBOX=SERVERPID ...
// ENVFILE holds E2B_API_URL=, E2B_SANDBOX_URL=, E2B_API_KEY= of that server;
// SANDBOX is a running code-interpreter-v1 sandbox of it.
import { createRequire } from 'node:module'
import { readFileSync, readdirSync } from 'node:fs'
// The E2B SDKs of test/e2b (scripts/e2b-deps.sh).
const require = createRequire(new URL('../test/e2b/', import.meta.url))
const { Sandbox } = require('@e2b/code-interpreter')
const stat = (xs) => { const s = [...xs].sort((a, b) => a - b); return `p50 ${s[Math.floor(s.length / 2)].toFixed(2)}  p90 ${s[Math.floor(s.length * 0.9)].toFixed(2)}  min ${s[0].toFixed(2)}` }
const N = +(process.env.N || 100), K = (process.env.K || 'runCode,cmd').split(',')
const hz = 100
function pidsOf(sbxId) {
  const out = []
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue
    try { if (readFileSync(`/proc/${p}/cgroup`, 'utf8').includes(sbxId)) out.push(p) } catch {}
  }
  return out
}
function usage(pids) {
  let cpu = 0, vcs = 0
  for (const p of pids) {
    try {
      const st = readFileSync(`/proc/${p}/stat`, 'utf8'); const v = st.slice(st.lastIndexOf(')') + 2).split(' ')
      cpu += (+v[11] + +v[12]) * 1000 / hz
      for (const t of readdirSync(`/proc/${p}/task`)) {
        const m = readFileSync(`/proc/${p}/task/${t}/status`, 'utf8').match(/^voluntary_ctxt_switches:\s+(\d+)/m); if (m) vcs += +m[1]
      }
    } catch {}
  }
  return { cpu, vcs }
}
const sbs = []
for (const a of process.argv.slice(2)) {
  const [name, envf, id, spid] = a.split('=')
  const env = Object.fromEntries([...readFileSync(envf, 'utf8').matchAll(/(E2B_\w+)=(\S+)/g)].map((m) => [m[1], m[2]]))
  const s = await Sandbox.connect(id, { apiKey: env.E2B_API_KEY, apiUrl: env.E2B_API_URL, sandboxUrl: env.E2B_SANDBOX_URL })
  await s.runCode('x = 1'); await s.commands.run('true')
  sbs.push({ name, s, sandboxPids: pidsOf(id), serverPid: spid })
}
const kinds = {
  runCode: async (s) => { if ((await s.runCode('x+1')).text !== '2') throw new Error('bad') },
  cmd: async (s) => { await s.commands.run('true') },
}
const load = () => readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ')
console.log(`${new Date().toISOString()} load ${load()}, n=${N} per side and kind, interleaved`)
for (const k of K) {
  const wall = {}, u0 = {}
  for (const b of sbs) { if (k === 'cmd') b.sandboxPids = pidsOf(b.s.sandboxId); u0[b.name] = [usage(b.sandboxPids), usage([b.serverPid])] }
  for (let i = 0; i < N; i++) for (const { name, s } of (i % 2 ? sbs : [...sbs].reverse())) {
    const t = performance.now(); await kinds[k](s); (wall[name] ??= []).push(performance.now() - t)
  }
  for (const b of sbs) {
    const [a, sv] = [usage(b.sandboxPids), usage([b.serverPid])], [a0, sv0] = u0[b.name]
    console.log(`  ${(k + ' ' + b.name).padEnd(16)} ${stat(wall[b.name])} ms; per request: sandbox cpu ${((a.cpu - a0.cpu) / N).toFixed(2)} ms, wake-ups ${((a.vcs - a0.vcs) / N).toFixed(1)}; space server cpu ${((sv.cpu - sv0.cpu) / N).toFixed(2)} ms, wake-ups ${((sv.vcs - sv0.vcs) / N).toFixed(1)}`)
  }
}
console.log(`${new Date().toISOString()} load ${load()}`)
