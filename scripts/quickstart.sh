#!/usr/bin/env bash
# Brings SPACE up on this machine and runs a sandbox end to end:
# installs packages, builds `space`, starts `space server` in the background
# (embedded SQLite, namespace driver), creates an API key, waits for the
# Debian `base` template and runs examples/quickstart.py against it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
export PATH=$PATH:/usr/local/go/bin
DATA=${SPACE_DATA_DIR:-/var/lib/space}
mkdir -p bin "$DATA"
echo "== building bin/space and bin/space-agent"
CGO_ENABLED=0 go build -o bin/ ./cmd/space ./cmd/space-agent
if ! curl -fsS http://127.0.0.1:7070/healthz >/dev/null 2>&1; then
  echo "== starting space server (log: $DATA/server.log)"
  nohup bin/space server --data-dir "$DATA" >>"$DATA/server.log" 2>&1 &
  for _ in $(seq 1 100); do curl -fsS http://127.0.0.1:7070/healthz >/dev/null 2>&1 && break; sleep 0.1; done
fi
KEY_FILE="$DATA/quickstart.key"
if [ ! -s "$KEY_FILE" ]; then
  bin/space keys create --data-dir "$DATA" --name quickstart > "$KEY_FILE"
  chmod 600 "$KEY_FILE"
fi
export SPACE_URL=http://127.0.0.1:7070 SPACE_API_KEY=$(cat "$KEY_FILE")
echo "== waiting for the 'base' template (Debian bookworm + python3; built once, ~1-2 min the first time)"
for _ in $(seq 1 900); do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "X-API-Key: $SPACE_API_KEY" $SPACE_URL/v1/templates/base)
  [ "$code" = 200 ] && break
  sleep 1
done
echo "== running examples/quickstart.py"
python3 examples/quickstart.py
echo
echo "SPACE is running: control API $SPACE_URL, API key in $KEY_FILE"
echo "try: SPACE_API_KEY=\$(cat $KEY_FILE) bin/space sandbox create --template base"
