package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"
)

// hello captures the ClientHello crypto/tls sends for sni.
func hello(t testing.TB, sni string) []byte {
	t.Helper()
	a, b := net.Pipe()
	go func() {
		c := tls.Client(a, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
		c.SetDeadline(time.Now().Add(time.Second))
		c.Handshake()
		a.Close()
	}()
	b.SetDeadline(time.Now().Add(time.Second))
	var hdr [5]byte
	if _, err := b.Read(hdr[:]); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
	for n := 0; n < len(body); {
		m, err := b.Read(body[n:])
		if err != nil {
			t.Fatal(err)
		}
		n += m
	}
	b.Close()
	return append(hdr[:], body...)
}

func TestClientHello(t *testing.T) {
	raw := hello(t, "Registry.Test")
	sni, got, err := readClientHello(bufio.NewReader(bytes.NewReader(raw)))
	if err != nil || sni != "registry.test" || !bytes.Equal(got, raw) {
		t.Fatalf("sni %q err %v replay %v", sni, err, bytes.Equal(got, raw))
	}
	// The same hello split over two records is reassembled.
	body := raw[5:]
	split := append([]byte{0x16, 3, 1, 0, 10}, body[:10]...)
	split = append(split, 0x16, 3, 1, byte((len(body)-10)>>8), byte(len(body)-10))
	split = append(split, body[10:]...)
	if sni, _, err := readClientHello(bufio.NewReader(bytes.NewReader(split))); err != nil || sni != "registry.test" {
		t.Fatalf("split: %q %v", sni, err)
	}
	// No SNI at all.
	if sni, _, err := readClientHello(bufio.NewReader(bytes.NewReader(hello(t, "")))); err != nil || sni != "" {
		t.Fatalf("no sni: %q %v", sni, err)
	}
	// Truncated, and not TLS.
	for _, bad := range [][]byte{raw[:len(raw)-1], []byte("GET / HTTP/1.1\r\n\r\n"), {0x16, 3, 1, 0, 0}} {
		if _, _, err := readClientHello(bufio.NewReader(bytes.NewReader(bad))); err == nil {
			t.Errorf("accepted %q", bad[:min(len(bad), 16)])
		}
	}
}

func FuzzClientHello(f *testing.F) {
	f.Add(hello(f, "registry.test"))
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		sni, raw, err := readClientHello(bufio.NewReader(bytes.NewReader(b)))
		if len(raw) > maxHello+5 {
			t.Fatalf("read %d bytes", len(raw))
		}
		if err == nil && sni != "" && sni != toLowerASCII(sni) {
			t.Fatalf("non-canonical sni %q", sni)
		}
	})
}

func toLowerASCII(s string) string { return string(bytes.ToLower([]byte(s))) }

func TestIPFilter(t *testing.T) {
	f := newIPFilter([]netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")}, []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")})
	for _, s := range []string{"127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1", "169.254.169.254",
		"0.0.0.0", "224.0.0.1", "255.255.255.255", "198.51.100.1", "10.200.0.1", "::1", "::ffff:127.0.0.1", "2001:db8::1"} {
		if !f.internal(netip.MustParseAddr(s)) {
			t.Errorf("%s is not internal", s)
		}
	}
	for _, s := range []string{"203.0.113.10", "8.8.8.8", "1.1.1.1"} {
		if f.internal(netip.MustParseAddr(s)) {
			t.Errorf("%s is internal", s)
		}
	}
}
