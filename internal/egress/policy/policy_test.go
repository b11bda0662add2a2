package policy

import "testing"

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
	for _, s := range []string{"a.test", "*.a.test:443,80", "1.2.3.4", "a..b:1"} {
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
