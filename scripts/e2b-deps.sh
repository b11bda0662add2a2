#!/usr/bin/env bash
# Installs the npm packages of the E2B compatibility tests (test/e2b): the
# real e2b SDK at 2.51.0 and, under the alias "e2b-2.50", at 2.50.0, and
# E2B's code interpreter SDK @e2b/code-interpreter 2.8.0 (on e2b 2.51.0).
# Idempotent: does nothing when node_modules already matches the lock file.
# Without node/npm it says so and exits 0; the tests then skip with a reason.
set -euo pipefail
cd "$(dirname "$0")/../test/e2b"
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  echo "e2b-deps: node/npm not found; the E2B SDK tests will be skipped" >&2
  exit 0
fi
want=$(sha256sum package-lock.json | cut -d' ' -f1)
stamp=node_modules/.space-lock-sha256
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
   [ -f node_modules/e2b/package.json ] && [ -f node_modules/e2b-2.50/package.json ] &&
   [ -f node_modules/@e2b/code-interpreter/package.json ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
echo "$want" > "$stamp"
