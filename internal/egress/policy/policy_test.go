package policy

import (
	"strings"
	"testing"
)

func TestCanonical(t *testing.T) {
	good := map[string]string{"Registry.TEST.": "registry.test", "a-b_c.d": "a-b_c.d", "xn--bcher-kva.example": "xn--bcher-kva.example"}
	for in, want := range good {
		if got, err := Canonical(in); err != nil || got != want {
			t.Errorf("Canonical(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", ".", "a..b", "a.b..", "*.a.b", "a\x00b", "a%2eb", "user@host", "host:80", "bücher.de", "a b"} {
		if got, err := Canonical(in); err == nil {
			t.Errorf("Canonical(%q) = %q, want an error", in, got)
		}
	}
}

func TestIPLiteral(t *testing.T) {
	for _, s := range []string{"127.0.0.1", "127.1", "2130706433", "0x7f.1", "0x7f000001", "017700000001", "1.2.3.0x4"} {
		if !IsIPLiteral(s) {
			t.Errorf("IsIPLiteral(%q) = false", s)
		}
	}
	for _, s := range []string{"registry.test", "1.2.3.com", "0xdead.beef", "x"} {
		if IsIPLiteral(s) {
			t.Errorf("IsIPLiteral(%q) = true", s)
		}
	}
}

func TestMatch(t *testing.T) {
	p, err := Parse("allowlist", []string{"registry.test:443,80", "*.registry.test:443", "api.test"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		port uint16
		ok   bool
	}{
		{"registry.test", 443, true}, {"registry.test", 80, true}, {"registry.test", 22, false},
		{"files.registry.test", 443, true}, {"files.registry.test", 80, false},
		{"a.b.registry.test", 443, true}, {"evilregistry.test", 443, false},
		{"registry.test.evil.test", 443, false}, {"api.test", 443, true}, {"api.test", 80, true},
		{"files.api.test", 443, false}, {"203.0.113.10", 443, false},
	}
	for _, c := range cases {
		if _, ok := p.Allow(c.name, c.port); ok != c.ok {
			t.Errorf("Allow(%s, %d) = %v, want %v", c.name, c.port, ok, c.ok)
		}
	}
	if _, ok := p.AllowName("files.registry.test"); !ok {
		t.Error("AllowName(files.registry.test) = false")
	}
	if _, ok := p.AllowName("evil.test"); ok {
		t.Error("AllowName(evil.test) = true")
	}
	var blocked *Policy
	if _, ok := blocked.Allow("registry.test", 443); ok {
		t.Error("nil policy allows")
	}
	for _, bad := range [][]string{{"*.test"}, {"1.2.3.4"}, {"a.test:0"}, {"a.test:"}, {"a.test:+1"}, {"*.*.a.test"}, {"a.test:65536"}} {
		if _, err := Parse("allowlist", bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	if _, err := Parse("blocked", []string{"a.test"}); err == nil {
		t.Error("rules accepted in blocked mode")
	}
	if _, err := Parse("bogus", nil); err == nil {
		t.Error("bad mode accepted")
	}
}

func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"a.test", "*.a.test:443,80", "1.2.3.4", "a..b:1", "a.test:443 GET,HEAD /v1/*,/x", "a.test /a POST"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			return
		}
		r2, err := ParseRule(r.String())
		if err != nil || r2.String() != r.String() {
			t.Fatalf("round trip %q -> %q -> %q, %v", s, r.String(), r2.String(), err)
		}
	})
}

func TestPassthrough(t *testing.T) {
	p, err := Parse("allowlist", []string{"registry.test", "*.pinned.test:443"})
	if err != nil {
		t.Fatal(err)
	}
	q, err := p.WithPassthrough([]string{"*.pinned.test:443"})
	if err != nil {
		t.Fatal(err)
	}
	if !q.IsPassthrough("a.pinned.test", 443) || q.IsPassthrough("pinned.test", 443) || q.IsPassthrough("registry.test", 443) || p.IsPassthrough("a.pinned.test", 443) {
		t.Error("passthrough matching")
	}
	if _, err := (&Policy{Mode: Open}).WithPassthrough([]string{"a.test"}); err == nil {
		t.Error("passthrough accepted in open mode")
	}
	if _, err := p.WithPassthrough([]string{"1.2.3.4"}); err == nil {
		t.Error("IP-literal passthrough accepted")
	}
}

func TestPresets(t *testing.T) {
	p, err := Parse("allowlist", []string{"preset:debian", "preset:pypi", "preset:npm", "preset:goproxy", "preset:pypi", "api.test"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"deb.debian.org:80,443 GET,HEAD", "security.debian.org:80,443 GET,HEAD",
		"pypi.org:443 GET,HEAD", "files.pythonhosted.org:443 GET,HEAD",
		"registry.npmjs.org:443 GET,HEAD",
		"proxy.golang.org:443 GET,HEAD", "sum.golang.org:443 GET,HEAD",
		"api.test:80,443",
	}
	got := p.Strings()
	if len(got) != len(want) {
		t.Fatalf("rules = %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("rule %d = %q, want %q", i, got[i], want[i])
		}
	}
	// The expanded form parses back to itself (what the API stores).
	p2, err := Parse("allowlist", got)
	if err != nil || strings.Join(p2.Strings(), "|") != strings.Join(got, "|") {
		t.Fatalf("round trip: %q, %v", p2.Strings(), err)
	}
	if _, ok := p.AllowRequest("files.pythonhosted.org", 443, "GET", "/packages/x.whl"); !ok {
		t.Error("pypi GET refused")
	}
	if _, ok := p.AllowRequest("pypi.org", 443, "POST", "/legacy/"); ok {
		t.Error("pypi POST (upload) allowed")
	}
	if _, ok := p.AllowRequest("registry.npmjs.org", 80, "GET", "/x"); ok {
		t.Error("npm on port 80 allowed")
	}
	if !p.Inspect("deb.debian.org", 80) || p.Inspect("api.test", 443) {
		t.Error("Inspect")
	}
	for _, bad := range [][]string{{"preset:"}, {"preset:Debian"}, {"preset:maven"}, {"preset:pypi "}} {
		if _, err := Parse("allowlist", bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	if _, err := Parse("open", []string{"preset:pypi"}); err == nil {
		t.Error("preset in open mode accepted")
	}
	if _, err := ExpandPresets([]string{"npm", "npm"}); err == nil {
		t.Error("repeated preset accepted")
	}
	if got, err := ExpandPresets([]string{"npm", "goproxy"}); err != nil || len(got) != 3 || got[0] != "registry.npmjs.org:443 GET,HEAD" {
		t.Errorf("ExpandPresets = %q, %v", got, err)
	}
}

func TestMethodPathRules(t *testing.T) {
	p, err := Parse("allowlist", []string{"api.test:443 GET,HEAD /v1/*,/health", "api.test:443 POST /v1/upload", "free.test"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		port   uint16
		method string
		path   string
		ok     bool
	}{
		{"api.test", 443, "GET", "/v1/items", true},
		{"api.test", 443, "GET", "/v1/", true},
		{"api.test", 443, "GET", "/v1", true},
		{"api.test", 443, "HEAD", "/health", true},
		{"api.test", 443, "GET", "/health/x", false},
		{"api.test", 443, "GET", "/v10", false},
		{"api.test", 443, "GET", "/v2/items", false},
		{"api.test", 443, "GET", "", false}, // not normalised
		{"api.test", 443, "DELETE", "/v1/items", false},
		{"api.test", 443, "get", "/v1/items", false},
		{"api.test", 443, "POST", "/v1/upload", true},
		{"api.test", 443, "POST", "/v1/items", false},
		{"api.test", 80, "GET", "/v1/items", false},
		{"free.test", 80, "DELETE", "", true},
		{"other.test", 443, "GET", "/v1/x", false},
	}
	for _, c := range cases {
		if _, ok := p.AllowRequest(c.name, c.port, c.method, c.path); ok != c.ok {
			t.Errorf("AllowRequest(%s:%d %s %q) = %v, want %v", c.name, c.port, c.method, c.path, ok, c.ok)
		}
	}
	if got := p.Rules[0].String(); got != "api.test:443 GET,HEAD /v1/*,/health" {
		t.Errorf("String = %q", got)
	}
	r, err := ParseRule("api.test /a,/b/* HEAD,GET,GET")
	if err != nil || r.String() != "api.test:80,443 GET,HEAD /a,/b/*" {
		t.Errorf("ParseRule = %q, %v", r.String(), err)
	}
	for _, bad := range []string{
		"api.test GET GET", "api.test /a /b", "api.test get", "api.test CONNECT", "api.test TRACE",
		"api.test /a/../b", "api.test //a", "api.test a/b", "api.test /a*", "api.test /*/b", "api.test /a%2fb",
		"api.test /a?x", "api.test /a\\b", "api.test ", "api.test  GET", "api.test G-T",
	} {
		if r, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) = %q, want an error", bad, r.String())
		}
	}
	if _, err := p.WithPassthrough([]string{"api.test:443 GET"}); err == nil {
		t.Error("restricted passthrough accepted")
	}
	op, _ := Parse("open", nil)
	if _, ok := op.AllowRequest("x.test", 443, "DELETE", ""); !ok {
		t.Error("open mode refused a request")
	}
	var nilp *Policy
	if _, ok := nilp.AllowRequest("x.test", 443, "GET", "/"); ok {
		t.Error("nil policy allowed a request")
	}
}
