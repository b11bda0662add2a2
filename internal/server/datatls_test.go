package server

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/cluster"
)

// writeCert writes a certificate for name, and its key, issued by a fresh
// CA (the CA code of space certs).
func writeCert(t *testing.T, certFile, keyFile, name string) {
	t.Helper()
	now := time.Now()
	caPEM, caKey, err := cluster.NewCA("test CA", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := cluster.IssueCert(caPEM, caKey, cluster.CertRequest{Role: cluster.RoleNode, Name: name, Validity: time.Hour}, now)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(certFile, certPEM, 0o600)
	os.WriteFile(keyFile, keyPEM, 0o600)
}

func TestDataTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	if c, err := dataTLS("", ""); c != nil || err != nil {
		t.Fatalf("no files: %v %v", c, err)
	}
	if _, err := dataTLS(cert, ""); err == nil {
		t.Fatal("a certificate without a key was accepted")
	}
	if _, err := dataTLS(cert, key); err == nil {
		t.Fatal("missing files were accepted")
	}
	writeCert(t, cert, key, "one.test")
	conf, err := dataTLS(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	name := func() string {
		c, err := conf.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		leaf, _ := x509.ParseCertificate(c.Certificate[0])
		return leaf.Subject.CommonName
	}
	if got := name(); got != "one.test" {
		t.Fatalf("served %q", got)
	}
	// A renewal is served once the files change; a broken one is not.
	time.Sleep(1100 * time.Millisecond)
	writeCert(t, cert, key, "two.test")
	os.Chtimes(cert, time.Now().Add(time.Minute), time.Now().Add(time.Minute))
	if got := name(); got != "two.test" {
		t.Fatalf("after renewal served %q", got)
	}
	time.Sleep(1100 * time.Millisecond)
	os.WriteFile(key, []byte("half written"), 0o600)
	os.Chtimes(key, time.Now().Add(2*time.Minute), time.Now().Add(2*time.Minute))
	if got := name(); got != "two.test" {
		t.Fatalf("after a broken renewal served %q", got)
	}
}

func TestCheckConfigE2BNetwork(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{}, true},
		{Config{E2BNetwork: "blocked"}, true},
		{Config{E2BNetwork: "open"}, false}, // no --egress
		{Config{E2BNetwork: "open", Egress: &EgressConfig{}}, true},
		{Config{E2BNetwork: "open", RemoteNodes: true}, true},
		{Config{E2BNetwork: "allowlist"}, false},
		{Config{RemoteNodes: true, DataTLSCert: "c.pem", DataTLSKey: "k.pem"}, false},
	} {
		if err := checkConfig(c.cfg); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok=%v", c.cfg, err, c.ok)
		}
	}
}
