package netns

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/netns/netnstest"
	"github.com/vishvananda/netlink"
)

func TestClaimConflicts(t *testing.T) {
	a := claim{Pool: "10.1.0.0/24", Table: "space-a", IfPrefix: "spa"}
	for _, c := range []struct {
		b    claim
		want string
	}{
		{claim{Pool: "10.2.0.0/24", Table: "space-b", IfPrefix: "spb"}, ""},
		{claim{Pool: "10.1.0.0/16", Table: "space-b", IfPrefix: "spb"}, "egress pool 10.1.0.0/24 overlaps its pool 10.1.0.0/16"},
		{claim{Pool: "10.2.0.0/24", Table: "space-a", IfPrefix: "spb"}, `table "space-a"`},
		{claim{Pool: "10.2.0.0/24", Table: "space-b", IfPrefix: "sp"}, `prefix "spa" collides with its prefix "sp"`},
		{claim{Pool: "10.2.0.0/24", Pool6: "fd00::/48", Table: "space-b", IfPrefix: "spb"}, ""}, // a has IPv6 off
	} {
		got := a.conflicts(c.b)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("conflicts(%+v) = %q, want %q", c.b, got, c.want)
		}
	}
}

// TestClaimHostRanges: a pool that covers another interface's address is
// refused, naming it; two managers may not hold the same table; a released
// claim frees it.
func TestClaimHostRanges(t *testing.T) {
	netnstest.RequireRoot(t)
	if !netnstest.Inside() {
		t.Skip("runs only inside its private network namespace")
	}
	dummy := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "other0"}, PeerName: "other1"}
	if err := netlink.LinkAdd(dummy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netlink.LinkDel(dummy) })
	addr, _ := netlink.ParseAddr("10.209.0.5/16")
	if err := netlink.AddrAdd(dummy, addr); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	_, err := New(Config{Pool: netip.MustParsePrefix("10.209.3.0/24"), IfPrefix: "clm", Table: "space-clm", ClaimDir: dir})
	if !errors.Is(err, ErrClaimed) || !strings.Contains(err.Error(), "other0") || !strings.Contains(err.Error(), "10.209.3.0/24") {
		t.Fatalf("pool inside another interface's address: %v", err)
	}
	m, err := New(Config{Pool: netip.MustParsePrefix("10.208.0.0/24"), IfPrefix: "clm", Table: "space-clm", ClaimDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Pool: netip.MustParsePrefix("10.207.0.0/24"), IfPrefix: "clx", Table: "space-clm", ClaimDir: dir}); !errors.Is(err, ErrClaimed) {
		t.Fatalf("second manager with the same table: %v", err)
	}
	if err := m.Destroy(); err != nil {
		t.Fatal(err)
	}
	m2, err := New(Config{Pool: netip.MustParsePrefix("10.207.0.0/24"), IfPrefix: "clx", Table: "space-clm", ClaimDir: dir})
	if err != nil {
		t.Fatalf("after the first released its claim: %v", err)
	}
	if err := m2.Destroy(); err != nil {
		t.Fatal(err)
	}
}
