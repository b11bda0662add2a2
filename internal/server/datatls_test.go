package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writeSelfSigned writes a self-signed certificate for name and its key.
func writeSelfSigned(t *testing.T, certFile, keyFile, name string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(k)
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600)
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
	writeSelfSigned(t, cert, key, "*.one.test")
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
	if got := name(); got != "*.one.test" {
		t.Fatalf("served %q", got)
	}
	// A renewal is served once the files change; a broken one is not.
	time.Sleep(1100 * time.Millisecond)
	writeSelfSigned(t, cert, key, "*.two.test")
	os.Chtimes(cert, time.Now().Add(time.Minute), time.Now().Add(time.Minute))
	if got := name(); got != "*.two.test" {
		t.Fatalf("after renewal served %q", got)
	}
	time.Sleep(1100 * time.Millisecond)
	os.WriteFile(key, []byte("half written"), 0o600)
	os.Chtimes(key, time.Now().Add(2*time.Minute), time.Now().Add(2*time.Minute))
	if got := name(); got != "*.two.test" {
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
