package server

import (
	"crypto/tls"
	"fmt"
	"strings"

	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/core"
)

// clusterLink is how a --remote-nodes replica reaches the nodes: mutual
// TLS with its certificate, or plaintext when allowed (loopback URLs only).
// One of the two is required.
func clusterLink(cfg Config) (cluster.LinkOptions, error) {
	if cfg.ClusterTLS.Empty() {
		if !cfg.ClusterPlaintext {
			return cluster.LinkOptions{}, fmt.Errorf("--remote-nodes: the node link needs a certificate (--cluster-tls-dir, or --cluster-cert/--cluster-key/--cluster-ca; `space certs` makes them), or --cluster-plaintext for nodes on loopback: %w", core.ErrInvalid)
		}
		return cluster.LinkOptions{Plaintext: true}, nil
	}
	ct, err := cluster.LoadClientTLS(cfg.ClusterTLS)
	if err != nil {
		return cluster.LinkOptions{}, err
	}
	// With a certificate, plaintext stays allowed on loopback only if asked.
	return cluster.LinkOptions{TLS: ct, Plaintext: cfg.ClusterPlaintext}, nil
}

// nodeRPCTLS returns the node RPC's TLS configuration, or nil when a
// plaintext RPC was allowed and its address is on loopback. It runs before
// the node does any work, so a misconfigured node fails at once.
func nodeRPCTLS(listen string, nc NodeConfig) (*tls.Config, error) {
	if nc.TLS.Empty() {
		if !nc.Plaintext {
			return nil, fmt.Errorf("space node: the node RPC needs a certificate (--cluster-tls-dir, or --cluster-cert/--cluster-key/--cluster-ca; `space certs` makes them), or --cluster-plaintext on a loopback --listen: %w", core.ErrInvalid)
		}
		if err := cluster.CheckPlaintextListen(listen); err != nil {
			return nil, err
		}
		return nil, nil
	}
	if nc.Plaintext {
		return nil, fmt.Errorf("space node: --cluster-plaintext and a node certificate: choose one: %w", core.ErrInvalid)
	}
	return cluster.ServerTLS(nc.TLS)
}

// logfWriter turns a printf logger into an io.Writer for log.Logger.
type logfWriter func(string, ...any)

func (w logfWriter) Write(p []byte) (int, error) {
	w("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
