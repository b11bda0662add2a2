#!/usr/bin/env bash
# Builds gVisor's runsc at a pinned version from the Go module proxy into a
# cache dir and prints its path. Idempotent: a cached binary is reused.
#   RUNSC_VERSION  pseudo-version of gvisor.dev/gvisor (default: pinned below)
#   RUNSC_CACHE    cache root (default /var/cache/space/runsc)
# The binary lands in $RUNSC_CACHE/$RUNSC_VERSION/runsc; the server finds it
# with `space server --runsc PATH` (or on PATH).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
RUNSC_VERSION=${RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}
RUNSC_CACHE=${RUNSC_CACHE:-/var/cache/space/runsc}
dir=$RUNSC_CACHE/$RUNSC_VERSION
bin=$dir/runsc
# The build's flavour: bump it when the way runsc is built changes, so that
# a cached binary of the old build is replaced.
flavour="$RUNSC_VERSION precompiled-seccomp"
if [ -x "$bin" ] && [ "$(cat "$dir/VERSION" 2>/dev/null)" = "$flavour" ] && "$bin" --version >/dev/null 2>&1; then
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
  # gVisor's module source ships without the seccomp programs its own
  # (Bazel) build precompiles, so the Sentry and the gofer each compile and
  # optimise their host filter at every sandbox start (12 ms of runsc's
  # boot here). gvisor-precompile (runsc-precompile.go) asks gVisor's
  # filter packages for the programs and writes the two registration files
  # the Bazel build generates, into a copy of the module that the build
  # then uses in place of the module cache's (Go refuses build overlays
  # there).
  mkdir -p gen
  # The build tag keeps the generator out of SPACE's own module.
  sed '/^\/\/go:build ignore$/d' "$here/runsc-precompile.go" > gen/main.go
  CGO_ENABLED=0 go build -o "$work/gvisor-precompile" ./gen >&2
  cp -r "$(go list -m -f '{{.Dir}}' gvisor.dev/gvisor)" gvisor
  chmod -R u+w gvisor
  "$work/gvisor-precompile" gvisor
  go mod edit -replace gvisor.dev/gvisor=./gvisor
  CGO_ENABLED=0 go build -trimpath -o "$work/runsc" gvisor.dev/gvisor/runsc >&2
)
"$work/runsc" --version >/dev/null
install -m 0755 "$work/runsc" "$bin.tmp"
mv -f "$bin.tmp" "$bin"
echo "$flavour" > "$dir/VERSION"
echo "$bin"
