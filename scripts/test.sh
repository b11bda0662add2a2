#!/usr/bin/env bash
# Runs the whole test suite: formatting, vet, staticcheck, unit tests and the
# root-only integration tests against a real `space server`. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --test
bash scripts/e2b-deps.sh
# QEMU, a Debian kernel and mkfs.ext4 for the qemu driver's test (one TCG boot).
bash scripts/vm-deps.sh
# gVisor's runsc, pinned and built from the Go module proxy into a cache (a
# few minutes the first time); the gvisor driver's tests use it.
export SPACE_RUNSC=${SPACE_RUNSC:-$(bash scripts/runsc.sh)}
# CRIU 4.1.1, pinned, built from Debian trixie's upstream tarball into a
# cache (/var/cache/space/criu; about two minutes the first time, with its
# build packages); internal/criu's tests and space doctor use it.
# A build that fails (trixie's source unreachable) is reported and the CRIU
# tests skip, saying so: nothing else depends on CRIU yet.
if [ -z "${SPACE_CRIU:-}" ]; then
  SPACE_CRIU=$(bash scripts/criu.sh) || { echo "== CRIU: scripts/criu.sh failed; internal/criu's tests skip"; SPACE_CRIU=; }
fi
export SPACE_CRIU
# etcd, Kubernetes, containerd and the CNI plugins for the single-node
# cluster test (test/k8s), built from the Go module proxy into a cache
# (/var/cache/space/k8s). The first build takes 30-75 minutes on two cores,
# more than this run's budget, so it happens only when asked for
# (SPACE_TEST_K8S=1) or when the cache is complete; then the test must run
# (SPACE_TEST_K8S=1 turns its skips into failures) and its kubectl also
# renders every kustomization with real kustomize (deploy/kubernetes).
# build also builds helm into the same cache, and the cache counts as
# complete only with it; deploy/kubernetes lints and renders the Helm
# chart with it and test/k8s installs the chart. test/k8s then deploys the
# split layout with a PostgreSQL image that `scripts/k8s.sh postgres`
# builds from Debian packages (mmdebstrap, ~4.5 min the first time, cached
# in the same directory). The whole test takes about 5 minutes.
# Without the cache the cluster test skips and says why.
if [ "${SPACE_TEST_K8S:-}" = 1 ] || bash scripts/k8s.sh built; then
  bash scripts/k8s.sh build >/dev/null
  export SPACE_TEST_K8S=1
  export PATH=$PATH:$(bash scripts/k8s.sh bin)
else
  echo "== test/k8s: the cluster's binaries are not cached; SPACE_TEST_K8S=1 bash scripts/test.sh builds them (30-75 min) and runs it"
fi
# The cgroup-v2-only round trip (test/cgroupv2) boots a Debian guest under
# QEMU without KVM: 2-5 minutes a run on two loaded cores. Its image is built
# (~3 minutes once, into /var/cache/space/cgroupv2) when asked for
# (SPACE_TEST_CGROUPV2=1, which also makes the test fail instead of skip);
# once cached, the test runs in every run.
if [ "${SPACE_TEST_CGROUPV2:-}" = 1 ]; then
  bash scripts/cgroupv2-vm.sh build >/dev/null
else
  bash scripts/cgroupv2-vm.sh built || echo "== test/cgroupv2: the guest is not cached; SPACE_TEST_CGROUPV2=1 bash scripts/test.sh builds it and runs the test"
fi
export PATH=$PATH:/usr/local/go/bin:$(go env GOPATH)/bin
export CGO_ENABLED=0
# Templates are built once per machine and shared by every test package.
export SPACE_TEMPLATE_CACHE=${SPACE_TEMPLATE_CACHE:-/var/cache/space/test-templates}
export SPACE_TEST_BASE=${SPACE_TEST_BASE:-1}
export SPACE_TEST_DEBIAN=${SPACE_TEST_DEBIAN:-0}

echo "== gofmt"
bad=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$bad" ]; then echo "gofmt needed: $bad"; exit 1; fi
echo "== go vet"
go vet ./...
echo "== staticcheck"
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
echo "== console assets"
# The embedded web console (internal/console/dist) is what web/console builds to.
bash scripts/console.sh
# scripts/deps.sh --test installed chromium: the console's browser test must run,
# not skip.
export SPACE_TEST_BROWSER=${SPACE_TEST_BROWSER:-1}
# A throwaway PostgreSQL cluster (127.0.0.1:55432) for the store suite and
# the two-replica test; a cluster that will not start fails the run.
export SPACE_TEST_POSTGRES=${SPACE_TEST_POSTGRES:-$(bash scripts/postgres.sh)}
echo "== go test"
# -p 1: the root tests share host-wide state (cgroups, uid range) and the
# leak checks must see only their own sandboxes.
go test -p 1 -count=1 -timeout 45m "$@" ./...
