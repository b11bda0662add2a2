package gvisor

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/drivertest"
)

// TestNetworkSandbox runs a sandbox with --network=sandbox over a netns the
// test makes (veth host 10.231.7.1/30, sandbox .2) and fetches a page from
// a server on the host side of the veth.
func TestNetworkSandbox(t *testing.T) {
	requireRunsc(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	name := fmt.Sprintf("gvt%d", os.Getpid()%100000)
	hostIf, peerIf := name+"h", name+"p"
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, out)
		}
	}
	ip("netns", "add", name)
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", hostIf).Run()
		_ = exec.Command("ip", "netns", "del", name).Run()
	})
	ip("link", "add", hostIf, "type", "veth", "peer", "name", peerIf)
	ip("link", "set", peerIf, "netns", name)
	ip("addr", "add", "10.231.7.1/30", "dev", hostIf)
	ip("link", "set", hostIf, "up")
	ip("-n", name, "addr", "add", "10.231.7.2/30", "dev", peerIf)
	ip("-n", name, "link", "set", peerIf, "up")
	ip("-n", name, "link", "set", "lo", "up")
	ip("-n", name, "route", "add", "default", "via", "10.231.7.1")

	ln, err := net.Listen("tcp", "10.231.7.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the host to %s", r.RemoteAddr)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	opts := testOptions(t, shortDir(t))
	cleaned := false
	opts.NetNS = func(ctx context.Context, id string) (string, error) { return "/var/run/netns/" + name, nil }
	opts.NetNSCleanup = func(ctx context.Context, id string) error { cleaned = true; return nil }
	d := newDriver(t, opts)
	inst := create(t, d, "net", driver.Limits{})
	port := ln.Addr().(*net.TCPAddr).Port
	out := drivertest.MustSh(t, inst, fmt.Sprintf("wget -qO- http://10.231.7.1:%d/", port))
	if !strings.Contains(out, "hello from the host to 10.231.7.2:") {
		t.Errorf("fetch: %q", out)
	}
	if err := inst.Destroy(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if !cleaned {
		t.Error("NetNSCleanup not called")
	}
}
