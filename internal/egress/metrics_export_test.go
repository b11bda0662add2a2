package egress

import (
	"net/netip"
	"testing"
)

func TestMetricsSnapshot(t *testing.T) {
	g, err := New(Config{Upstream: netip.MustParseAddrPort("127.0.0.1:53")})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	g.metrics.add(func(s *Stats) { s.DNSQueries += 3; s.ConnsDenied++ })
	g.metrics.decision(Decision{Proto: "dns", Verdict: "deny", Reason: "blocked"})
	g.metrics.decision(Decision{Proto: "dns", Verdict: "deny", Reason: "blocked"})
	n, totals, dec := g.MetricsSnapshot()
	if n != 0 || totals.DNSQueries != 3 || totals.ConnsDenied != 1 {
		t.Errorf("snapshot: %d sandboxes, %+v", n, totals)
	}
	if got := dec[[3]string{"dns", "deny", "blocked"}]; got != 2 || len(dec) != 1 {
		t.Errorf("decisions: %v", dec)
	}
	// The copy is the caller's.
	dec[[3]string{"dns", "deny", "blocked"}] = 99
	if _, _, again := g.MetricsSnapshot(); again[[3]string{"dns", "deny", "blocked"}] != 2 {
		t.Error("the snapshot shares the gateway's map")
	}
}
