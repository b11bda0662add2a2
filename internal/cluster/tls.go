package cluster

// The node link's transport: mutual TLS 1.3. A node serves its RPC only
// to peers with a client certificate from the cluster CA; a replica calls
// a node only when its certificate chains to the same CA and names that
// node. Plaintext is for tests and single-machine trials: it must be
// asked for, and then only loopback addresses are accepted.

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// TLS file names in a directory written by `space certs` (the layout of a
// Kubernetes TLS Secret with its CA).
const (
	TLSCertFile = "tls.crt"
	TLSKeyFile  = "tls.key"
	TLSCAFile   = "ca.crt"
)

// TLSFiles names the PEM files of one end of the node link: its own
// certificate and key, and the CA that signs its peers.
type TLSFiles struct {
	Cert, Key, CA string
}

// InDir fills the names left empty from dir (tls.crt, tls.key, ca.crt).
func (f TLSFiles) InDir(dir string) TLSFiles {
	if dir == "" {
		return f
	}
	for _, p := range []struct {
		v    *string
		name string
	}{{&f.Cert, TLSCertFile}, {&f.Key, TLSKeyFile}, {&f.CA, TLSCAFile}} {
		if *p.v == "" {
			*p.v = filepath.Join(dir, p.name)
		}
	}
	return f
}

// Empty reports whether no file is named.
func (f TLSFiles) Empty() bool { return f.Cert == "" && f.Key == "" && f.CA == "" }

func (f TLSFiles) load() (tls.Certificate, *x509.CertPool, error) {
	if f.Cert == "" || f.Key == "" || f.CA == "" {
		return tls.Certificate{}, nil, fmt.Errorf("node link TLS needs a certificate, its key and the cluster CA (got cert %q, key %q, ca %q): %w",
			f.Cert, f.Key, f.CA, core.ErrInvalid)
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("node link certificate: %w", err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return tls.Certificate{}, nil, fmt.Errorf("node link certificate: %w", err)
		}
	}
	raw, err := os.ReadFile(f.CA)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("node link CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw) {
		return tls.Certificate{}, nil, fmt.Errorf("node link CA %s: no PEM certificate in it: %w", f.CA, core.ErrInvalid)
	}
	return cert, pool, nil
}

// checkOwn refuses a certificate that has expired or cannot serve as
// usage: a misconfiguration found at start rather than at the first call.
func checkOwn(cert tls.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage, what string) error {
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("node link: this %s's certificate does not verify against the cluster CA for its use: %w", what, err)
	}
	return nil
}

// material is the node link's files as last loaded, reloaded when they
// change on disk (renewed certificates, a new CA bundle), checked at most
// once a second. A reload that fails (a pair half-replaced, a
// certificate not valid for its use) keeps what was loaded before.
type material struct {
	f     TLSFiles
	usage x509.ExtKeyUsage
	what  string

	mu      sync.Mutex
	cert    tls.Certificate
	pool    *x509.CertPool
	stamp   string // the files' sizes and modification times
	checked time.Time
}

func newMaterial(f TLSFiles, usage x509.ExtKeyUsage, what string) (*material, error) {
	cert, pool, err := f.load()
	if err != nil {
		return nil, err
	}
	if err := checkOwn(cert, pool, usage, what); err != nil {
		return nil, err
	}
	return &material{f: f, usage: usage, what: what, cert: cert, pool: pool, stamp: f.stamp(), checked: time.Now()}, nil
}

func (f TLSFiles) stamp() string {
	var b strings.Builder
	for _, p := range []string{f.Cert, f.Key, f.CA} {
		if fi, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%d.%d;", fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return b.String()
}

// get returns the current certificate and CA pool.
func (m *material) get() (tls.Certificate, *x509.CertPool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if time.Since(m.checked) >= time.Second {
		m.checked = time.Now()
		if st := m.f.stamp(); st != m.stamp {
			if cert, pool, err := m.f.load(); err == nil && checkOwn(cert, pool, m.usage, m.what) == nil {
				m.cert, m.pool, m.stamp = cert, pool, st
			}
		}
	}
	return m.cert, m.pool
}

// ServerTLS returns the TLS configuration a node serves its RPC with:
// TLS 1.3, its certificate, and a client certificate from the cluster CA
// required of every peer. Renewed files are picked up by new connections.
func ServerTLS(f TLSFiles) (*tls.Config, error) {
	m, err := newMaterial(f, x509.ExtKeyUsageServerAuth, "node")
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool := m.get()
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{cert},
				ClientAuth:   tls.RequireAndVerifyClientCert, // chain to the CA, client-auth usage
				ClientCAs:    pool,
			}, nil
		},
	}, nil
}

// ClientTLS is the replica's (or a node's, calling a peer) end of the
// node link.
type ClientTLS struct {
	m *material
}

// LoadClientTLS loads a replica's certificate and the cluster CA.
func LoadClientTLS(f TLSFiles) (*ClientTLS, error) {
	m, err := newMaterial(f, x509.ExtKeyUsageClientAuth, "server")
	if err != nil {
		return nil, err
	}
	return &ClientTLS{m: m}, nil
}

// Config returns the TLS configuration for calling node name at host
// (its RPC URL's host): the node's certificate must chain to the cluster
// CA, allow server auth, and name the node (a DNS name equal to its node
// name) or the host the replica dialled.
func (c *ClientTLS) Config(name, host string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _ := c.m.get()
			return &cert, nil
		},
		// The standard check would only accept the dialled host; the
		// full verification, with the node's name as a second accepted
		// identity, is VerifyConnection's.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, roots := c.m.get()
			return verifyNode(cs, roots, name, host)
		},
	}
}

func verifyNode(cs tls.ConnectionState, roots *x509.CertPool, name, host string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("node presented no certificate")
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("node %s certificate: %w", name, err)
	}
	if leaf.VerifyHostname(name) == nil || (host != "" && leaf.VerifyHostname(host) == nil) {
		return nil
	}
	return fmt.Errorf("node %s certificate names %v %v, neither the node nor %s", name, leaf.DNSNames, leaf.IPAddresses, host)
}

// LinkOptions say how a replica reaches nodes.
type LinkOptions struct {
	// TLS is the replica's certificate and the cluster CA (nil: plaintext).
	TLS *ClientTLS
	// Plaintext allows http:// node URLs, on loopback addresses only.
	Plaintext bool
	// PlaintextSecrets lets credentials go over such a link too (tests
	// of the RPC itself); otherwise secrets go to nodes over TLS only.
	PlaintextSecrets bool
	// Timeout bounds one call (default 5 minutes).
	Timeout time.Duration
}

// HTTPClient returns the HTTP client for calling node name at rawURL, or
// an error (core.ErrUnavailable) when the link options forbid that URL: an
// http:// URL without Plaintext or off loopback, an https:// one without
// TLS.
func (l LinkOptions) HTTPClient(name, rawURL string) (*http.Client, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("node %s: RPC URL %.200q: %v: %w", name, rawURL, err, core.ErrUnavailable)
	}
	timeout := l.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Minute
	}
	switch u.Scheme {
	case "https":
		if l.TLS == nil {
			return nil, fmt.Errorf("node %s serves TLS (%s) but this server has no node link certificate (--cluster-tls-dir): %w", name, rawURL, core.ErrUnavailable)
		}
		tr := linkTransport()
		tr.TLSClientConfig = l.TLS.Config(name, u.Hostname())
		return &http.Client{Timeout: timeout, Transport: tr}, nil
	case "http":
		if !l.Plaintext {
			return nil, fmt.Errorf("node %s advertises a plaintext RPC URL (%s); this server requires TLS on the node link: %w", name, rawURL, core.ErrUnavailable)
		}
		if !LoopbackHost(u.Hostname()) {
			return nil, fmt.Errorf("node %s: plaintext RPC URL %s is not on loopback (--cluster-plaintext allows loopback only): %w", name, rawURL, core.ErrUnavailable)
		}
		// No proxy: a loopback call must stay on this machine.
		tr := linkTransport()
		tr.Proxy = nil
		return &http.Client{Timeout: timeout, Transport: tr}, nil
	default:
		return nil, fmt.Errorf("node %s: RPC URL %.200q: want https:// (or http:// on loopback): %w", name, rawURL, core.ErrUnavailable)
	}
}

// linkTransport is the transport of one node link. A replica keeps as
// many idle connections to a node as it has calls in flight: with the
// default two, every burst of concurrent creates and deletes beyond two
// closed its connections afterwards and paid a new TLS handshake on both
// ends for each later call.
func linkTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 0 // no limit across hosts; per host below
	tr.MaxIdleConnsPerHost = 256
	return tr
}

// LoopbackHost reports whether host (a name or an address, without a
// port) is on loopback: "localhost" or a loopback IP.
func LoopbackHost(host string) bool {
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckPlaintextListen refuses a plaintext node RPC address off loopback
// (an empty host or an unspecified address listens on every interface).
func CheckPlaintextListen(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen address %q: %w", addr, err)
	}
	if !LoopbackHost(host) {
		return fmt.Errorf("plaintext node RPC on %s: --cluster-plaintext allows loopback addresses only; give the node a certificate (--cluster-tls-dir): %w", addr, core.ErrInvalid)
	}
	return nil
}
