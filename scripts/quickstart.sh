#!/usr/bin/env bash
# Brings SPACE up on this machine and runs a sandbox end to end:
# installs packages, builds `space`, starts `space server` in the background
# (embedded SQLite, disk limits when the host has loop devices), creates an
# API key, waits for the Debian `base` template and runs
# examples/quickstart.py against it.
#
#   scripts/quickstart.sh              start (or, after `git pull`, restart on the new binary)
#   scripts/quickstart.sh --stop       stop the server (sandboxes keep running; see README.md)
#   scripts/quickstart.sh --uninstall  delete every sandbox, stop the server, remove its state
#
# State lives in $SPACE_DATA_DIR (default /var/lib/space): the store, the
# key (quickstart.key), the server's log (server.log, mode 0600, rotated at
# 10 MiB with one old file kept: server.log.1) and its pid (server.pid).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${SPACE_DATA_DIR:-/var/lib/space}
RUN_DIR=${SPACE_RUN_DIR:-/run/space}
URL=http://127.0.0.1:7070
LOG="$DATA/server.log"
PID_FILE="$DATA/server.pid"
LOG_MAX=$((10 << 20))

# __log FILE: copy stdin to FILE, moving it to FILE.1 whenever it passes
# LOG_MAX bytes (the server writes to stderr; this keeps its log bounded).
if [ "${1:-}" = __log ]; then
  umask 077
  n=$(stat -c %s "$2" 2>/dev/null || echo 0)
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$2"
    n=$((n + ${#line} + 1))
    if [ "$n" -ge "$LOG_MAX" ]; then mv -f "$2" "$2.1"; n=0; fi
  done
  exit 0
fi

healthy() { curl -fsS "$URL/healthz" >/dev/null 2>&1; }

# server_pid prints the pid of the server on :7070: the one quickstart
# recorded, else whichever process listens there.
server_pid() {
  local pid
  pid=$(cat "$PID_FILE" 2>/dev/null || true)
  if [ -n "$pid" ] && [ -d "/proc/$pid" ]; then echo "$pid"; return; fi
  ss -ltnpH 'sport = :7070' 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2
}

stop_server() {
  local pid
  pid=$(server_pid)
  if [ -z "$pid" ]; then echo "== no server running on $URL"; return; fi
  echo "== stopping space server (pid $pid)"
  kill "$pid"
  for _ in $(seq 1 300); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
  if [ -d "/proc/$pid" ]; then echo "space server (pid $pid) did not stop within 30 s" >&2; exit 1; fi
  rm -f "$PID_FILE"
}

key() { cat "$DATA/quickstart.key" 2>/dev/null || true; }

case "${1:-}" in
--stop)
  stop_server
  exit 0
  ;;
--uninstall)
  if healthy && [ -n "$(key)" ]; then
    echo "== deleting every sandbox of the quickstart key's project"
    SPACE_URL=$URL SPACE_API_KEY=$(key) bin/space sandbox rm --all --wait || true
  fi
  stop_server
  if grep -qs " $DATA/" /proc/mounts; then
    echo "sandbox mounts are still under $DATA (grep $DATA /proc/mounts): start the server, delete the sandboxes, then run this again" >&2
    exit 1
  fi
  echo "== removing $DATA, $RUN_DIR and bin/"
  rm -rf "$DATA" "$RUN_DIR" bin
  echo "done; the packages scripts/deps.sh installed stay (apt-get remove them if you wish)"
  exit 0
  ;;
"") ;;
*)
  echo "usage: scripts/quickstart.sh [--stop | --uninstall]" >&2
  exit 2
  ;;
esac

bash scripts/deps.sh
export PATH=$PATH:/usr/local/go/bin
mkdir -p bin "$DATA"
chmod 0711 "$DATA"
echo "== building bin/space and bin/space-agent"
COMMIT=$(git rev-parse HEAD 2>/dev/null || true)
if [ -n "$COMMIT" ] && [ -n "$(git status --porcelain 2>/dev/null)" ]; then COMMIT="$COMMIT-dirty"; fi
CGO_ENABLED=0 go build -ldflags "-X github.com/space-sandbox/space/internal/version.Commit=$COMMIT" \
  -o bin/ ./cmd/space ./cmd/space-agent

# After `git pull`, a server still running the old binary is restarted on
# the new one (its sandboxes keep running and are re-adopted).
if healthy; then
  pid=$(server_pid)
  if [ -n "$pid" ] && ! cmp -s "/proc/$pid/exe" bin/space; then
    echo "== the running server (pid $pid) is an older build: restarting it on bin/space"
    stop_server
  fi
fi

if ! healthy; then
  # Disk limits (docs/operations.md): each sandbox's writable layer is an
  # ext4 image of its size, so one sandbox cannot fill the disk.
  DISK_FLAGS=()
  if [ -e /dev/loop-control ] && command -v mkfs.ext4 >/dev/null; then
    DISK_FLAGS=(--default-disk-bytes 2G --max-disk-bytes 20G)
  else
    echo "== no loop devices here: starting without disk limits (a sandbox can fill $DATA's filesystem)"
  fi
  echo "== starting space server (log: $LOG, pid in $PID_FILE)"
  if [ -f "$LOG" ] && [ "$(stat -c %s "$LOG")" -ge "$LOG_MAX" ]; then mv -f "$LOG" "$LOG.1"; fi
  touch "$LOG" && chmod 600 "$LOG"
  rm -f "$DATA/.log.fifo" && mkfifo -m 600 "$DATA/.log.fifo"
  setsid nohup bash scripts/quickstart.sh __log "$LOG" <"$DATA/.log.fifo" >/dev/null 2>&1 &
  setsid nohup bin/space server --data-dir "$DATA" --run-dir "$RUN_DIR" "${DISK_FLAGS[@]}" \
    >"$DATA/.log.fifo" 2>&1 </dev/null &
  echo $! >"$PID_FILE"
  for _ in $(seq 1 300); do healthy && break; sleep 0.1; done
  healthy || { echo "space server did not come up; its log:" >&2; tail -20 "$LOG" >&2; exit 1; }
fi
KEY_FILE="$DATA/quickstart.key"
if [ ! -s "$KEY_FILE" ]; then
  (umask 077 && bin/space keys create --data-dir "$DATA" --name quickstart >"$KEY_FILE")
fi
export SPACE_URL=$URL SPACE_API_KEY=$(cat "$KEY_FILE")
bin/space version --server
echo "== waiting for the 'base' template (Debian bookworm + python3; built once, ~1-2 min the first time)"
for _ in $(seq 1 900); do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "X-API-Key: $SPACE_API_KEY" $SPACE_URL/v1/templates/base)
  [ "$code" = 200 ] && break
  sleep 1
done
echo "== running examples/quickstart.py"
python3 examples/quickstart.py
echo
echo "SPACE is running: control API $SPACE_URL, API key in $KEY_FILE, log in $LOG"
echo "try: SPACE_API_KEY=\$(cat $KEY_FILE) bin/space sandbox create --template base"
echo "stop: scripts/quickstart.sh --stop    remove everything: scripts/quickstart.sh --uninstall"
