package portfwd

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestMatch(t *testing.T) {
	cases := []struct {
		host, path, domain string
		hdr                map[string]string
		want               Target
		ok                 bool
	}{
		{host: "8000-sbx-1.localhost:3001", want: Target{SandboxID: "sbx-1", Port: 8000}, ok: true},
		{host: "8000-SBX-1.LOCALHOST:3001", want: Target{SandboxID: "sbx-1", Port: 8000}, ok: true},
		{host: "8000-sbx-1.sb.example.com", domain: "sb.example.com", want: Target{SandboxID: "sbx-1", Port: 8000}, ok: true},
		{host: "8000-sbx-1.sb.example.com:443", domain: "sb.example.com", want: Target{SandboxID: "sbx-1", Port: 8000}, ok: true},
		{host: "8000-sbx-1.evil.com", domain: "sb.example.com"},
		{host: "8000-sbx-1.localhost:3002", domain: "localhost:3001"},
		{host: "8000-sbx-1.localhost:3001", domain: "localhost:3001", want: Target{SandboxID: "sbx-1", Port: 8000}, ok: true},
		{host: "49983-sbx-1.localhost"}, // envd
		{host: "0800-sbx-1.localhost"},  // not canonical
		{host: "70000-sbx-1.localhost"}, // out of range
		{host: "www-data.localhost"},    // not a port
		{host: "8000-.localhost"},       // no id
		{host: "8000-sbx_1.localhost"},  // bad id
		{host: "127.0.0.1:3001"},        // the plain listener
		{host: "8000-sbx-1"},            // no domain at all
		{host: "127.0.0.1", path: "/v1/sandboxes/sbx-1/ports/8000", want: Target{SandboxID: "sbx-1", Port: 8000, Prefix: "/v1/sandboxes/sbx-1/ports/8000"}, ok: true},
		{host: "127.0.0.1", path: "/v1/sandboxes/sbx-1/ports/8000/a/b", want: Target{SandboxID: "sbx-1", Port: 8000, Prefix: "/v1/sandboxes/sbx-1/ports/8000"}, ok: true},
		{host: "127.0.0.1", path: "/v1/sandboxes/sbx-1/ports"},
		{host: "127.0.0.1", path: "/v1/sandboxes/sbx-1/ports/"},
		{host: "127.0.0.1", path: "/v1/sandboxes/sbx-1/ports/x/"},
		{host: "127.0.0.1", path: "/v1/sandboxes/sbx-1/files"},
		{host: "127.0.0.1", hdr: map[string]string{"E2b-Sandbox-Id": "sbx-1", "E2b-Sandbox-Port": "49999"}, want: Target{SandboxID: "sbx-1", Port: 49999}, ok: true},
		{host: "127.0.0.1", hdr: map[string]string{"E2b-Sandbox-Id": "sbx-1", "E2b-Sandbox-Port": "49983"}},
		{host: "127.0.0.1", hdr: map[string]string{"E2b-Sandbox-Id": "sbx-1"}},
		// The E2B headers decide over the Host: envd stays envd.
		{host: "8000-sbx-1.localhost", hdr: map[string]string{"E2b-Sandbox-Id": "sbx-1", "E2b-Sandbox-Port": "49983"}},
	}
	for _, c := range cases {
		path := c.path
		if path == "" {
			path = "/"
		}
		r := httptest.NewRequest("GET", "http://x"+path, nil)
		r.Host = c.host
		for k, v := range c.hdr {
			r.Header.Set(k, v)
		}
		got, ok := Match(r, c.domain)
		if ok != c.ok || got != c.want {
			t.Errorf("Match(host %q, path %q, domain %q, %v) = %+v %v, want %+v %v", c.host, c.path, c.domain, c.hdr, got, ok, c.want, c.ok)
		}
	}
}

func TestDefaultDomain(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:3001":        "localhost:3001",
		"http://[::1]:3001":            "localhost:3001",
		"http://localhost:3001/":       "localhost:3001",
		"https://data.example.com":     "data.example.com",
		"https://data.example.com:443": "data.example.com",
		"http://data.example.com:8080": "data.example.com:8080",
		"::bad":                        "localhost",
	} {
		if got := DefaultDomain(in); got != want {
			t.Errorf("DefaultDomain(%q) = %q, want %q", in, got, want)
		}
	}
	u := NewURLs("https://d.example.com/", "")
	if u.Host("sbx-1", 80) != "https://80-sbx-1.d.example.com/" || u.Path("sbx-1", 80) != "https://d.example.com/v1/sandboxes/sbx-1/ports/80/" {
		t.Errorf("urls %+v: %s %s", u, u.Host("sbx-1", 80), u.Path("sbx-1", 80))
	}
}

func TestCookieRewrites(t *testing.T) {
	for in, want := range map[string]string{
		"a=1; Domain=localhost; Path=/":      "a=1; Path=/",
		"a=1; domain=.example.com; HttpOnly": "a=1; HttpOnly",
		"a=1":                                "a=1",
		"a=1; Path=/; DOMAIN = x":            "a=1; Path=/",
	} {
		if got := dropDomain(in); got != want {
			t.Errorf("dropDomain(%q) = %q, want %q", in, got, want)
		}
	}
	h := http.Header{}
	h.Add("Cookie", "x=1; space_port_token=abc; y=2")
	h.Add("Cookie", "space_port_token=def")
	stripCookie(h)
	if got := h.Values("Cookie"); len(got) != 1 || got[0] != "x=1; y=2" {
		t.Errorf("stripCookie: %q", got)
	}
	h = http.Header{"Cookie": {"space_port_token=abc"}}
	stripCookie(h)
	if _, ok := h["Cookie"]; ok {
		t.Errorf("an empty Cookie header is left: %q", h)
	}
}
