// Package kubernetes holds SPACE's Kubernetes manifests and no code:
// kustomizations for servers and separate nodes (base), the
// single-process layout (single), what both share (common), and a kind
// overlay of each (kind, kind-single). Its tests render the kustomizations
// offline, decode every object strictly into the Kubernetes API types and
// check them against the real `space` binary. See docs/install-kind.md.
package kubernetes
