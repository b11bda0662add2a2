#!/usr/bin/env bash
# Type-checks and builds the web console (web/console) with the locked npm
# packages and checks that internal/console/dist, which the space binary embeds, is
# byte for byte what the sources build to. `bash scripts/console.sh write`
# rebuilds the committed dist instead (after editing web/console/src).
# A plain `go build` needs none of this: the dist is committed.
set -euo pipefail
cd "$(dirname "$0")/../web/console"
mode=${1:-check}
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  echo "console: node/npm not found (scripts/deps.sh installs them)" >&2
  exit 1
fi
want=$(sha256sum package-lock.json | cut -d' ' -f1)
stamp=node_modules/.space-lock-sha256
if ! [ -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" > "$stamp"
fi
dist=../../internal/console/dist
# Type-check the sources (esbuild strips types without checking them).
node_modules/.bin/tsc -p .
case "$mode" in
  write)
    rm -rf "$dist"
    node build.mjs "$dist"
    ;;
  check)
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
    node build.mjs "$out"
    if ! diff -r "$out" "$dist" >/dev/null; then
      echo "console: internal/console/dist differs from a fresh build of web/console:" >&2
      diff -rq "$out" "$dist" >&2 || true
      echo "run: bash scripts/console.sh write (and commit internal/console/dist)" >&2
      exit 1
    fi
    echo "console: internal/console/dist matches web/console"
    ;;
  *)
    echo "usage: scripts/console.sh [check|write]" >&2
    exit 2
    ;;
esac
