package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// testCA is a CA written by NewCA, issuing into directories as `space
// certs issue` does.
type testCA struct {
	t         *testing.T
	cert, key []byte
	certFile  string
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	c, k, err := NewCA("test CA", 24*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca := &testCA{t: t, cert: c, key: k, certFile: filepath.Join(dir, "ca.crt")}
	if err := os.WriteFile(ca.certFile, c, 0o644); err != nil {
		t.Fatal(err)
	}
	return ca
}

func (ca *testCA) issue(role CertRole, name string, hosts ...string) TLSFiles {
	ca.t.Helper()
	c, k, err := IssueCert(ca.cert, ca.key, CertRequest{Role: role, Name: name, Hosts: hosts, Validity: time.Hour}, time.Now())
	if err != nil {
		ca.t.Fatal(err)
	}
	dir := ca.t.TempDir()
	for n, b := range map[string][]byte{TLSCertFile: c, TLSKeyFile: k, TLSCAFile: ca.cert} {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			ca.t.Fatal(err)
		}
	}
	return TLSFiles{}.InDir(dir)
}

// lockedLog collects a server's error log.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor waits for s in the log (the server logs after the client saw
// its connection end).
func (l *lockedLog) waitFor(s string) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if strings.Contains(l.String(), s) {
			return true
		}
	}
	return false
}

// serveTLS serves "ok" over the node's TLS configuration on loopback.
func serveTLS(t *testing.T, f TLSFiles) (string, *lockedLog) {
	t.Helper()
	tc, err := ServerTLS(f)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedLog{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }),
		ErrorLog: log.New(logs, "", 0), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(tls.NewListener(ln, tc))
	t.Cleanup(func() { srv.Close() })
	return "https://" + ln.Addr().String(), logs
}

func get(hc *http.Client, url string) error {
	resp, err := hc.Get(url + "/x")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return errors.New(resp.Status)
	}
	return nil
}

func TestNodeLinkMutualTLS(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	url, nodeLog := serveTLS(t, ca.issue(RoleNode, "n1"))
	link := func(f TLSFiles) LinkOptions {
		ct, err := LoadClientTLS(f)
		if err != nil {
			t.Fatal(err)
		}
		return LinkOptions{TLS: ct, Timeout: 5 * time.Second}
	}
	good := link(ca.issue(RoleServer, "srv-a"))
	hc, err := good.HTTPClient("n1", url)
	if err != nil {
		t.Fatal(err)
	}
	if err := get(hc, url); err != nil {
		t.Fatalf("a replica of the cluster CA: %v", err)
	}
	if st := hc.Transport.(*http.Transport).TLSClientConfig.MinVersion; st != tls.VersionTLS13 {
		t.Fatalf("client min version %x", st)
	}
	// The node's certificate names n1: calling it as n2 fails.
	hc2, _ := good.HTTPClient("n2", url)
	if err := get(hc2, url); err == nil || !strings.Contains(err.Error(), "neither the node") {
		t.Fatalf("node n1's certificate accepted for n2: %v", err)
	}
	// A replica with a certificate of another CA is refused by the node
	// (the client trusts the node here: the refusal is the node's).
	y := other.issue(RoleServer, "srv-y")
	if _, err := LoadClientTLS(TLSFiles{Cert: y.Cert, Key: y.Key, CA: ca.certFile}); err == nil {
		t.Fatal("LoadClientTLS accepted a certificate its CA did not sign")
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.cert)
	ycert, err := tls.LoadX509KeyPair(y.Cert, y.Key)
	if err != nil {
		t.Fatal(err)
	}
	foreign := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "n1",
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{ycert}}}}
	if err := get(foreign, url); err == nil {
		t.Fatal("a replica of another CA reached the node")
	}
	if !nodeLog.waitFor("certificate signed by unknown authority") {
		t.Fatalf("node log: %s", nodeLog)
	}
	// No client certificate at all: refused by the node.
	bare := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "n1", MinVersion: tls.VersionTLS13}}}
	if err := get(bare, url); err == nil {
		t.Fatal("a client without a certificate reached the node")
	}
	if !nodeLog.waitFor("client didn't provide a certificate") {
		t.Fatalf("node log: %s", nodeLog)
	}
	// TLS 1.2 is refused.
	old := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "n1", MaxVersion: tls.VersionTLS12}}}
	if err := get(old, url); err == nil {
		t.Fatal("TLS 1.2 accepted")
	}
	// A node with a certificate of another CA is refused by the replica.
	url2, _ := serveTLS(t, other.issue(RoleNode, "n1"))
	hc3, _ := good.HTTPClient("n1", url2)
	if err := get(hc3, url2); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a node of another CA was trusted: %v", err)
	}
	// A node certificate may also name the RPC URL's host.
	url3, _ := serveTLS(t, ca.issue(RoleNode, "n3", "127.0.0.1"))
	hc4, _ := good.HTTPClient("renamed", url3)
	if err := get(hc4, url3); err != nil {
		t.Fatalf("node certificate with the URL's IP: %v", err)
	}
}

func TestNodeLinkRoles(t *testing.T) {
	ca := newTestCA(t)
	// A replica's certificate (client auth only) cannot serve a node.
	if _, err := ServerTLS(ca.issue(RoleServer, "srv-a")); err == nil {
		t.Fatal("a server certificate served the node RPC")
	}
	// A node certificate is also a client one (node-to-node calls).
	if _, err := LoadClientTLS(ca.issue(RoleNode, "n1")); err != nil {
		t.Fatalf("node certificate as a client: %v", err)
	}
	if _, _, err := IssueCert(ca.cert, ca.key, CertRequest{Role: RoleServer, Name: "a", Hosts: []string{"x"}, Validity: time.Hour}, time.Now()); err == nil {
		t.Fatal("server certificate with hosts")
	}
	if _, _, err := IssueCert(ca.cert, ca.key, CertRequest{Role: RoleNode, Name: "Bad Name", Validity: time.Hour}, time.Now()); err == nil {
		t.Fatal("bad name accepted")
	}
	other := newTestCA(t)
	if _, _, err := IssueCert(ca.cert, other.key, CertRequest{Role: RoleNode, Name: "n1", Validity: time.Hour}, time.Now()); err == nil {
		t.Fatal("a CA certificate with another CA's key issued")
	}
	// The leaf never outlives its CA.
	c, _, err := IssueCert(ca.cert, ca.key, CertRequest{Role: RoleNode, Name: "n1", Validity: 1000 * time.Hour}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(c)
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if time.Until(leaf.NotAfter) > 25*time.Hour {
		t.Fatalf("leaf valid until %v, past its CA", leaf.NotAfter)
	}
	if leaf.IsCA || leaf.KeyUsage&x509.KeyUsageCertSign != 0 {
		t.Fatal("leaf may sign certificates")
	}
	if _, _, err := (TLSFiles{Cert: "x"}).load(); err == nil || !errors.Is(err, core.ErrInvalid) {
		t.Fatalf("incomplete files: %v", err)
	}
}

func TestNodeLinkPlaintext(t *testing.T) {
	for _, c := range []struct {
		opts LinkOptions
		url  string
		ok   bool
	}{
		{LinkOptions{}, "http://127.0.0.1:7072", false},
		{LinkOptions{Plaintext: true}, "http://127.0.0.1:7072", true},
		{LinkOptions{Plaintext: true}, "http://[::1]:7072", true},
		{LinkOptions{Plaintext: true}, "http://localhost:7072", true},
		{LinkOptions{Plaintext: true}, "http://10.0.0.5:7072", false},
		{LinkOptions{Plaintext: true}, "http://node.example:7072", false},
		{LinkOptions{Plaintext: true}, "https://10.0.0.5:7072", false}, // no certificate
		{LinkOptions{Plaintext: true}, "ftp://127.0.0.1:7072", false},
	} {
		_, err := c.opts.HTTPClient("n1", c.url)
		if (err == nil) != c.ok {
			t.Errorf("%+v %s: %v", c.opts, c.url, err)
		}
		if err != nil && !errors.Is(err, core.ErrUnavailable) {
			t.Errorf("%s: %v is not unavailable", c.url, err)
		}
	}
	for addr, ok := range map[string]bool{"127.0.0.1:0": true, "[::1]:7072": true, "0.0.0.0:7072": false, ":7072": false, "10.1.2.3:1": false} {
		if err := CheckPlaintextListen(addr); (err == nil) != ok {
			t.Errorf("CheckPlaintextListen(%s): %v", addr, err)
		}
	}
}

// TestNodeLinkReload: a node's certificate renewed on disk is what new
// connections get, without a restart; a half-written pair keeps the old.
func TestNodeLinkReload(t *testing.T) {
	ca := newTestCA(t)
	f := ca.issue(RoleNode, "n1")
	url, _ := serveTLS(t, f)
	ct, err := LoadClientTLS(ca.issue(RoleServer, "srv-a"))
	if err != nil {
		t.Fatal(err)
	}
	serial := func() string {
		hc, err := LinkOptions{TLS: ct, Timeout: 5 * time.Second}.HTTPClient("n1", url)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Get(url + "/x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0].SerialNumber.String()
	}
	before := serial()
	// A new key written over the old one, its certificate not yet: the
	// pair does not match and the old one is kept.
	c2, k2, err := IssueCert(ca.cert, ca.key, CertRequest{Role: RoleNode, Name: "n1", Validity: time.Hour}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Key, k2, 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // past the once-a-second check
	if got := serial(); got != before {
		t.Fatalf("a half-replaced pair was loaded: %s", got)
	}
	if err := os.WriteFile(f.Cert, c2, 0o600); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); serial() == before; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the renewed certificate was not picked up")
		}
	}
}
