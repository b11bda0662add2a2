// Package kubernetes holds SPACE's Kubernetes manifests and no code:
// kustomizations for servers and separate nodes (base), the
// single-process layout (single), what both share (common), and a kind
// overlay of each (kind, kind-single), and one for the cluster of
// scripts/k8s.sh (local-single). Its tests render the kustomizations and
// the Helm chart (../helm/space) offline, decode every object strictly into
// the Kubernetes v1.37 API types, check that the chart renders what the
// kustomizations do, and check them against the real `space` binary (and
// helm, where scripts/k8s.sh built it). See docs/install-kind.md and
// docs/install-kubernetes.md.
package kubernetes
