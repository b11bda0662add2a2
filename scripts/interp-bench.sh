#!/usr/bin/env bash
# Measures the interpreter server alone (no SPACE in between): runs
# internal/template/interp (or DIR) in a built code-interpreter-v1 tree
# from the template cache, in private mount, PID and network namespaces
# (the tree is bind-mounted read-only; /tmp, /root, /home/user, /run are
# tmpfs), and times N warm POST /execute of CODE over one keep-alive
# connection. Prints p50/p90/min and, per run, the CPU milliseconds and
# voluntary context switches (thread wake-ups) of the kernel and the
# server: figures that a loaded host changes less than the wall time.
# Root only. Usage: scripts/interp-bench.sh [-d DIR] [-n N] [-c CODE] [ROOTFS]
set -euo pipefail
dir=$(cd "$(dirname "$0")/.." && pwd)/internal/template/interp
n=200 code='x+1'
while getopts d:n:c: o; do
  case $o in d) dir=$(cd "$OPTARG" && pwd) ;; n) n=$OPTARG ;; c) code=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
cache=${SPACE_TEMPLATE_CACHE:-/var/cache/space/templates}
root=${1:-}
if [ -z "$root" ]; then
  digest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["digest"].split(":")[1])' "$cache/names/code-interpreter-v1.json")
  root=$cache/rootfs/$digest
fi
[ -d "$root/opt/space/interpreter" ] || { echo "interp-bench: $root is no code-interpreter-v1 tree" >&2; exit 1; }
client=$(mktemp /tmp/interp-bench.XXXXXX.py)
trap 'rm -f "$client"' EXIT
cat > "$client" <<'EOF'
import glob, http.client, json, os, sys, time
root, n, code = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for _ in range(600):
    try:
        c = http.client.HTTPConnection("127.0.0.1", 49999)
        c.request("GET", "/health"); r = c.getresponse(); r.read()
        if r.status == 200:
            break
    except OSError:
        pass
    time.sleep(0.1)
def run(src):
    c.request("POST", "/execute", body=json.dumps({"code": src}))
    return [json.loads(l) for l in c.getresponse().read().splitlines() if l.strip()]
def usage():
    out, hz = {}, os.sysconf("SC_CLK_TCK")
    for st in glob.glob(root + "/proc/[0-9]*/stat"):
        try:
            f = open(st).read(); cmd = open(st[:-4] + "cmdline").read()
        except OSError:
            continue
        who = "kernel" if "ipykernel" in cmd else "server" if "server.py" in cmd else None
        if who is None:
            continue
        v = f[f.rindex(")") + 2:].split()
        out[who + " cpu ms"] = out.get(who + " cpu ms", 0) + (int(v[11]) + int(v[12])) * 1000 / hz
        for ts in glob.glob(st[:-4] + "task/*/status"):
            for l in open(ts):
                if l.startswith("voluntary_ctxt_switches"):
                    out[who + " wake-ups"] = out.get(who + " wake-ups", 0) + int(l.split()[1])
    return out
run("x = 1")
time.sleep(2)  # the default JavaScript context starts after /health
u0, ts = usage(), []
for _ in range(n):
    t = time.perf_counter(); evs = run(code); ts.append((time.perf_counter() - t) * 1000)
u1 = usage()
ts.sort()
print("%r: %s" % (code, [e for e in evs if e["type"] != "number_of_executions"]))
print("n=%d p50=%.2f ms p90=%.2f ms min=%.2f ms; per run: %s" % (n, ts[n // 2], ts[n * 9 // 10], ts[0],
      ", ".join("%s %.2f" % (k, (u1[k] - u0.get(k, 0)) / n) for k in sorted(u1))))
EOF
echo "interp-bench: $dir in $root, load $(cut -d' ' -f1-3 /proc/loadavg)"
unshare -mnpf --propagation private bash -euc '
root=$1 dir=$2 client=$3 n=$4 code=$5
ip link set lo up
mount --bind "$root" "$root"; mount -o remount,bind,ro "$root"
for d in tmp root home/user run var/tmp; do mount -t tmpfs tmpfs "$root/$d"; done
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
mount --bind "$dir" "$root/opt/space/interpreter"
chroot "$root" env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
  SPACE_INTERP_LOG=WARNING python3 /opt/space/interpreter/server.py 2>/dev/null &
python3 "$client" "$root" "$n" "$code"
' interp-bench "$root" "$dir" "$client" "$n" "$code"
