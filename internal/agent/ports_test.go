package agent_test

import (
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/agent/client"
)

// echoServer accepts on loopback and echoes until the peer half-closes,
// then closes its side.
func echoServer(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

func TestTunnelCarriesBytesBothWays(t *testing.T) {
	a := startAgent(t, agent.Options{})
	port := echoServer(t)
	c, err := a.DialPort(testCtx(t), port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	payload := make([]byte, 8<<20)
	rand.Read(payload)
	want := sha256.Sum256(payload)
	go func() {
		c.Write(payload)
		c.(interface{ CloseWrite() error }).CloseWrite()
	}()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read back: %v (after %d bytes)", err, len(got))
	}
	if sha256.Sum256(got) != want {
		t.Fatalf("echoed %d bytes, checksum differs from the %d sent", len(got), len(payload))
	}
}

func TestTunnelClosedPort(t *testing.T) {
	a := startAgent(t, agent.Options{})
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	_, err = a.DialPort(testCtx(t), port)
	if !client.IsPortClosed(err) {
		t.Fatalf("DialPort to a closed port: %v, want port_closed", err)
	}
	// The route refuses bad ports and a plain GET without the upgrade.
	for path, want := range map[string]int{
		"/v1/ports/0/connect":                          400,
		"/v1/ports/65536/connect":                      400,
		"/v1/ports/08/connect":                         400,
		"/v1/ports/" + strconv.Itoa(port) + "/x":       404,
		"/v1/ports/" + strconv.Itoa(port) + "/connect": 400, // no Upgrade header
	} {
		if st, body := a.raw(t, "GET", path, nil); st != want {
			t.Errorf("GET %s: %d %s, want %d", path, st, body, want)
		}
	}
}

func TestTunnelsEndWithTheAgent(t *testing.T) {
	a := startAgent(t, agent.Options{})
	port := echoServer(t)
	c, err := a.DialPort(testCtx(t), port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q %v", buf, err)
	}
	a.stop()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(buf); err == nil {
		t.Fatal("tunnel still open after the agent stopped")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("tunnel not closed when the agent stopped")
	}
}

func TestListPorts(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "net"), 0o755)
	// 0.0.0.0:8000 and 127.0.0.1:49999 listening, an established
	// connection (not listed); ::/8000 and ::1:3000 on IPv6.
	tcp := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n" +
		"   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0\n" +
		"   1: 0100007F:C34F 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0\n" +
		"   2: 0100007F:1F40 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0\n" +
		"   3: garbage\n"
	tcp6 := "  sl  local_address                         remote_address                        st\n" +
		"   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 0\n" +
		"   1: 00000000000000000000000001000000:0BB8 00000000000000000000000000000000:0000 0A 0\n"
	os.WriteFile(filepath.Join(dir, "net/tcp"), []byte(tcp), 0o644)
	os.WriteFile(filepath.Join(dir, "net/tcp6"), []byte(tcp6), 0o644)
	a := startAgent(t, agent.WithProcDir(agent.Options{}, dir))
	ports, err := a.ListPorts(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []agent.ListeningPort{
		{Port: 3000, Address: "::1", Family: "ipv6"},
		{Port: 8000, Address: "0.0.0.0", Family: "ipv4"},
		{Port: 8000, Address: "::", Family: "ipv6"},
		{Port: 49999, Address: "127.0.0.1", Family: "ipv4"},
	}
	if len(ports) != len(want) {
		t.Fatalf("ports %+v, want %+v", ports, want)
	}
	for i := range want {
		if ports[i] != want[i] {
			t.Errorf("port %d: %+v, want %+v", i, ports[i], want[i])
		}
	}
	// The real /proc of this host lists a listener the test opens.
	b := startAgent(t, agent.Options{})
	port := echoServer(t)
	real, err := b.ListPorts(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range real {
		found = found || (p.Port == port && p.Address == "127.0.0.1")
	}
	if !found {
		t.Fatalf("listener on 127.0.0.1:%d not in %v", port, real)
	}
}
