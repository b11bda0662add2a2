#!/usr/bin/env bash
# Installs the Debian packages SPACE and its tests need. Idempotent.
set -euo pipefail
pkgs=(ca-certificates curl git make gcc python3 mmdebstrap busybox-static crun nftables iproute2 procps util-linux e2fsprogs jq postgresql)
# --test: also what only the test suite needs. chromium: the web console's
# browser test (test/console), headless; a large package a server does not need.
if [ "${1:-}" = "--test" ]; then pkgs+=(chromium); fi
# --test: runc, iptables and conntrack for the single-node Kubernetes
# cluster of scripts/k8s.sh (test/k8s): containerd's runtime, and what
# kubelet and kube-proxy call.
if [ "${1:-}" = "--test" ]; then pkgs+=(runc iptables conntrack openssl); fi
# --test: agent-sandbox's Python client (test/operator TestAgentSandboxClient,
# vendored there) needs the Kubernetes client and prometheus_client; its
# pydantic 2 comes from the interpreter (Debian 12's python3-pydantic is 1.x).
if [ "${1:-}" = "--test" ]; then pkgs+=(python3-kubernetes python3-prometheus-client); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js runs the E2B SDK compatibility tests. Some machines carry a
# Node.js build that bundles npm; Debian's separate npm package would
# conflict with it, so ask for packages only for what is missing.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH=$PATH:/usr/local/go/bin
fi
command -v go >/dev/null || { echo "Go 1.26+ is required (https://go.dev/dl); not found on PATH" >&2; exit 1; }
