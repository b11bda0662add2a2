#!/usr/bin/env bash
# Builds gVisor's runsc at a pinned version from the Go module proxy into a
# cache dir and prints its path. Idempotent: a cached binary is reused.
#   RUNSC_VERSION  pseudo-version of gvisor.dev/gvisor (default: pinned below)
#   RUNSC_CACHE    cache root (default /var/cache/space/runsc)
# The binary lands in $RUNSC_CACHE/$RUNSC_VERSION/runsc; the server finds it
# with `space server --runsc PATH` (or on PATH).
set -euo pipefail
RUNSC_VERSION=${RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}
RUNSC_CACHE=${RUNSC_CACHE:-/var/cache/space/runsc}
dir=$RUNSC_CACHE/$RUNSC_VERSION
bin=$dir/runsc
if [ -x "$bin" ] && [ "$(cat "$dir/VERSION" 2>/dev/null)" = "$RUNSC_VERSION" ] && "$bin" --version >/dev/null 2>&1; then
  echo "$bin"
  exit 0
fi
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH=$PATH:/usr/local/go/bin
fi
command -v go >/dev/null || { echo "runsc.sh: Go is required to build runsc" >&2; exit 1; }
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(
  cd "$work"
  go mod init runscbuild >/dev/null 2>&1
  go get "gvisor.dev/gvisor/runsc@$RUNSC_VERSION" >&2
  CGO_ENABLED=0 go build -trimpath -o "$work/runsc" gvisor.dev/gvisor/runsc >&2
)
"$work/runsc" --version >/dev/null
install -m 0755 "$work/runsc" "$bin.tmp"
mv -f "$bin.tmp" "$bin"
echo "$RUNSC_VERSION" > "$dir/VERSION"
echo "$bin"
