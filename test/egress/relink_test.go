package egress_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/space-sandbox/space/internal/bench"
	"github.com/space-sandbox/space/internal/netns/netnstest"
	"github.com/space-sandbox/space/test/testenv"
)

// TestEgressRelinkAfterLostLink: a namespace sandbox outlives its server
// while its host-side veth does not (a Kubernetes node pod's network
// namespace holds that end and goes with the pod, taking the pair with
// it). The next start re-adopts the sandbox with a new link in the
// sandbox's own network namespace instead of leaving it without one.
func TestEgressRelinkAfterLostLink(t *testing.T) {
	netnstest.RequireRoot(t)
	if !netnstest.Inside() {
		t.Skip("runs only inside its private network namespace")
	}
	const table, prefix = "space-relink-test", "srl"
	srv, err := testenv.New("space-relink-")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Remove()
	defer srv.Stop()
	srv.Args = []string{"--driver", "namespace", "--builtins", "minimal",
		"--egress", "--egress-dns", upstreamDNS, "--egress-table", table, "--egress-if-prefix", prefix, "--egress-pool", "10.205.0.0/24"}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	key, err := srv.CreateKey("p1")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitTemplate(key, "minimal", 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl := bench.NewClient(srv.Ctrl, key)
	sb, err := cl.Create(ctx, "minimal")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Delete(context.Background(), sb.ID)
	ifaces := func() string {
		t.Helper()
		var out strings.Builder
		if _, err := cl.Exec(ctx, sb, []string{"/bin/sh", "-c", "ls /sys/class/net"}, func(b []byte) { out.Write(b) }); err != nil {
			t.Fatalf("exec: %v", err)
		}
		return strings.Join(strings.Fields(out.String()), " ")
	}
	if got := ifaces(); !strings.Contains(got, "eth0") {
		t.Fatalf("interfaces before: %q, want eth0", got)
	}
	srv.Stop()
	old := links(prefix)
	if len(old) != 1 {
		t.Fatalf("host links after stop: %v, want the sandbox's", old)
	}
	l, err := netlink.LinkByName(old[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(l); err != nil { // the pair goes: eth0 inside too
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if got := ifaces(); !strings.Contains(got, "eth0") {
		t.Fatalf("interfaces after the restart: %q, want a new eth0\n%s", got, srv.LogTail(3000))
	}
	if l := links(prefix); len(l) != 1 {
		t.Fatalf("host links after the restart: %v, want one", l)
	}
	// Its policy and credentials were set again on the new link.
	if log := srv.LogTail(20000); strings.Contains(log, "sandbox not attached") {
		t.Fatalf("the re-adopted sandbox's policy found no network:\n%s", log)
	}
	if err := cl.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the link to go", func() bool { return len(links(prefix)) == 0 })
}
