// Package kubernetes holds SPACE's Kubernetes manifests (a kustomize base
// and a kind overlay) and no code. Its tests render the kustomizations
// offline, decode every object strictly into the Kubernetes API types and
// check them against the real `space` binary. See docs/install-kind.md.
package kubernetes
