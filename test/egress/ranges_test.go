package egress_test

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/space-sandbox/space/internal/bench"
	"github.com/space-sandbox/space/internal/driver/namespace"
	"github.com/space-sandbox/space/internal/server"
)

// A lab network in the benchmarking range 198.18.0.0/15, which the
// gateway calls internal unless --egress-public-ranges says otherwise.
const (
	labIP      = "198.18.0.10"  // lab.test: the allowlisted lab service
	labOtherIP = "198.19.0.10"  // other.lab.test: public with the flag, never allowlisted
	labCarveIP = "198.18.99.10" // carveout.lab.test: inside --egress-internal-ranges
)

var labIPs = []string{labIP, labOtherIP, labCarveIP}

func init() {
	zone["lab.test"] = zoneEntry{a: []string{labIP}}
	zone["other.lab.test"] = zoneEntry{a: []string{labOtherIP}}
	zone["carveout.lab.test"] = zoneEntry{a: []string{labCarveIP}}
	zone["meta.lab.test"] = zoneEntry{a: []string{"169.254.169.254"}}
}

// serveLab answers HTTP and HTTPS on every lab address; a contact with
// anything but lab.test's is recorded as a violation.
func (w *wan) serveLab() error {
	cert, err := w.ca.issue("lab.test", "other.lab.test", "carveout.lab.test")
	if err != nil {
		return err
	}
	for _, ip := range labIPs {
		ip := ip
		h := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			w.note(ip != labIP, "lab %s %s %s from %s", ip, r.Host, r.URL, r.RemoteAddr)
			io.WriteString(rw, "lab ok "+ip+"\n")
		})
		if err := w.listenHTTP(ip, h, cert); err != nil {
			return err
		}
	}
	return nil
}

// TestEgressRanges: --egress-public-ranges and --egress-internal-ranges.
// The real binary refuses public ranges that may never be public; with
// 198.18.0.0/15 public (198.18.99.0/24 internal again) an allowlisted name
// in it works over HTTP and verified HTTPS while other names, the address
// literal, the carve-out, metadata and loopback answers still fail; open
// mode reaches the lab but not the carve-out or metadata; /v1/info shows
// the sets; restarted without the flag, the same name is refused with
// internal_answer.
func TestEgressRanges(t *testing.T) {
	lab, carve := netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("198.18.99.0/24")
	e := startOpts(t, startOptions{driver: namespace.Name, noWarmPool: true, public: []netip.Prefix{lab}, internal: []netip.Prefix{carve}})

	t.Run("refused at start", func(t *testing.T) {
		for rng, want := range map[string]string{
			"169.254.0.0/16":    "metadata",
			"127.0.0.0/8":       "loopback",
			"fd00:ec2::254/128": "metadata",
			"10.0.0.0/8":        "sandbox pool",
			uplinkIP + "/32":    "this host's own interfaces",
			"0.0.0.0/0":         "never public",
		} {
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			out, err := exec.CommandContext(ctx, filepath.Join(e.tmp, "bin", "space"), "server", "--egress", "--egress-dns", upstreamDNS,
				"--egress-table", "space-ranges-refused", "--egress-if-prefix", "spr", "--egress-public-ranges", "198.18.0.0/15,"+rng,
				"--data-dir", dir, "--run-dir", dir, "--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0", "--builtins", "").CombinedOutput()
			cancel()
			if err == nil || !strings.Contains(string(out), rng) || !strings.Contains(string(out), want) {
				t.Errorf("--egress-public-ranges %s: %v, want a refusal naming it and %q:\n%s", rng, err, want, out)
			}
		}
		if n, err := nftTableExists("space-ranges-refused"); err != nil || n {
			t.Errorf("a refused start left its nftables table: %v %v", n, err)
		}
	})

	info := func(t *testing.T) (internal, public []string) {
		t.Helper()
		var in struct {
			EgressRanges *struct{ Internal, Public []string } `json:"egress_ranges"`
		}
		if code := e.api(t, "GET", "/v1/info", nil, &in); code != 200 || in.EgressRanges == nil {
			t.Fatalf("/v1/info: %d %+v", code, in)
		}
		return in.EgressRanges.Internal, in.EgressRanges.Public
	}

	t.Run("info", func(t *testing.T) {
		internal, public := info(t)
		if !slices.Contains(public, lab.String()) {
			t.Errorf("public %v lacks %s", public, lab)
		}
		// The harness's host has IPv6, so the sandboxes do: IPv6 outside
		// global unicast is internal (without IPv6 it would be ::/0).
		for _, want := range []string{carve.String(), "169.254.0.0/16", "127.0.0.0/8", "10.0.0.0/8", "::/3", "8000::/1", "2001:db8::/32"} {
			if !slices.Contains(internal, want) {
				t.Errorf("internal %v lacks %s", internal, want)
			}
		}
		for _, s := range internal {
			if p := netip.MustParsePrefix(s); p.Overlaps(lab) && !carve.Contains(p.Addr()) {
				t.Errorf("internal %s overlaps the public %s outside the carve-out", p, lab)
			}
		}
	})

	allow := map[string]any{"mode": "allowlist", "allow": []string{"lab.test", "carveout.lab.test", "meta.lab.test", "local.test"}}
	violations := e.wan.attackerCount()
	t.Run("allowlist", func(t *testing.T) {
		sb := e.create(t, allow)
		defer e.cl.Delete(context.Background(), sb.ID)
		if out := e.run(t, sb, "http", "lab.test:80", "lab.test", "/"); !strings.Contains(out, "lab ok "+labIP) {
			t.Errorf("allowlisted lab name over HTTP: %s", out)
		}
		if out := e.run(t, sb, "https", "lab.test:443", "lab.test", "/", "GET", ""); !strings.Contains(out, "lab ok "+labIP) {
			t.Errorf("allowlisted lab name over verified HTTPS: %s", out)
		}
		seq := e.seq(t, sb)
		for _, c := range []struct {
			args   []string
			reason string
		}{
			{[]string{"http", "other.lab.test:80", "other.lab.test", "/"}, "dns_refused"},           // public now, but not allowlisted
			{[]string{"http", labOtherIP + ":80", "lab.test", "/"}, "not_resolved"},                 // an allowed name to an address it does not resolve to
			{[]string{"http", labIP + ":80", labIP, "/"}, "ip_literal"},                             // the literal
			{[]string{"http", "carveout.lab.test:80", "carveout.lab.test", "/"}, "internal_answer"}, // --egress-internal-ranges wins
			{[]string{"dns", "meta.lab.test"}, "internal_answer"},                                   // metadata stays internal
			{[]string{"dns", "local.test"}, "internal_answer"},                                      // loopback stays internal
		} {
			out := e.run(t, sb, c.args...)
			if strings.Contains(out, "lab ok") || internalAnswer(out) && c.args[0] == "dns" {
				t.Errorf("%v got through: %s", c.args, out)
			}
			if l := e.logAfter(t, sb, seq); !l.denied(c.reason) {
				t.Errorf("%v: no %s decision: %+v", c.args, c.reason, l.Decisions)
			}
			seq = e.seq(t, sb)
		}
	})

	t.Run("open", func(t *testing.T) {
		sb := e.create(t, map[string]any{"mode": "open"})
		defer e.cl.Delete(context.Background(), sb.ID)
		if out := e.run(t, sb, "http", labOtherIP+":80", "other.lab.test", "/"); !strings.Contains(out, "lab ok "+labOtherIP) {
			t.Errorf("open mode to a public lab address: %s", out)
		}
		violations++ // that contact was allowed
		seq := e.seq(t, sb)
		for _, addr := range []string{labCarveIP, "169.254.169.254"} {
			if out := e.run(t, sb, "http", addr+":80", "x.test", "/"); strings.Contains(out, "lab ok") {
				t.Errorf("open mode reached internal %s: %s", addr, out)
			}
		}
		if l := e.logAfter(t, sb, seq); !l.denied("internal") {
			t.Errorf("no internal decision: %+v", l.Decisions)
		}
	})
	if n := e.wan.attackerCount(); n != violations {
		t.Errorf("lab addresses other than lab.test's were contacted: %d contacts, %d expected", n, violations)
	}
	if c := e.wan.internalContacts(); len(c) > 0 {
		t.Errorf("internal listeners contacted: %v", c)
	}

	t.Run("without the flag", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.srv.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		cfg := e.cfg
		eg := *cfg.Egress
		eg.Gateway.Public = slices.DeleteFunc(slices.Clone(eg.Gateway.Public), func(p netip.Prefix) bool { return p == lab })
		eg.Gateway.Deny = nil
		cfg.Egress = &eg
		srv, err := server.Start(ctx, cfg)
		if err != nil {
			e.srv = nil
			t.Fatal(err)
		}
		e.srv, e.cl = srv, bench.NewClient("http://"+srv.Addr(), e.key)
		internal, public := info(t)
		if slices.Contains(public, lab.String()) || !slices.Contains(internal, lab.String()) {
			t.Errorf("without the flag: public %v, internal %v", public, internal)
		}
		sb := e.create(t, allow)
		defer e.cl.Delete(context.Background(), sb.ID)
		seq := e.seq(t, sb)
		if out := e.run(t, sb, "http", "lab.test:80", "lab.test", "/"); strings.Contains(out, "lab ok") {
			t.Errorf("the lab name got through without the flag: %s", out)
		}
		if l := e.logAfter(t, sb, seq); !l.denied("internal_answer") {
			t.Errorf("no internal_answer decision: %+v", l.Decisions)
		}
	})
}

// nftTableExists reports whether this namespace has the inet table.
func nftTableExists(name string) (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, err
	}
	defer c.CloseLasting()
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, err
	}
	for _, tb := range tables {
		if tb.Name == name {
			return true, nil
		}
	}
	return false, nil
}
