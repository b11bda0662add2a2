package egress

import (
	"bufio"
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"testing/iotest"
)

func testCred() Credential {
	return Credential{ID: "cred-1", Host: "API.test.", Port: 443, Header: "authorization", Prefix: "Bearer ",
		Methods: []string{"get", "POST"}, PathPrefix: "/v1/", Placeholder: "space-cred-0123456789abcdef", Secret: []byte("s3cr3t-canary-value")}
}

func req(t *testing.T, raw string) *http.Request {
	t.Helper()
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestValidateCredential(t *testing.T) {
	c, err := ValidateCredential(testCred())
	if err != nil {
		t.Fatal(err)
	}
	if c.Host != "api.test" || c.Header != "Authorization" || strings.Join(c.Methods, ",") != "GET,POST" {
		t.Errorf("not canonical: %+v", c)
	}
	bad := []func(*Credential){
		func(c *Credential) { c.Host = "*.api.test" },
		func(c *Credential) { c.Host = "10.0.0.1" },
		func(c *Credential) { c.Host = "0x7f.1" },
		func(c *Credential) { c.Header = "Host" },
		func(c *Credential) { c.Header = "Bad Header" },
		func(c *Credential) { c.Secret = []byte("short") },
		func(c *Credential) { c.Secret = []byte("line\r\nInjected: yes") },
		func(c *Credential) { c.Secret = []byte("contains space-cred-xyz") },
		func(c *Credential) { c.Methods = []string{"TRACE"} },
		func(c *Credential) { c.PathPrefix = "/v1/../admin" },
		func(c *Credential) { c.PathPrefix = "/v1%2f" },
		func(c *Credential) { c.Placeholder = "token" },
		func(c *Credential) { c.Prefix = "Bearer\n" },
	}
	for i, f := range bad {
		c := testCred()
		f(&c)
		if _, err := ValidateCredential(c); err == nil {
			t.Errorf("case %d accepted: %+v", i, c)
		}
	}
}

func TestInject(t *testing.T) {
	c, _ := ValidateCredential(testCred())
	cs := &credSet{creds: []Credential{c}}
	ph := c.Placeholder
	basic := base64.StdEncoding.EncodeToString([]byte("user:" + ph))
	for _, tc := range []struct {
		name, raw, host string
		port            uint16
		verified        bool
		want            string // "inject", "" (nothing to do) or a refusal reason
	}{
		{"exact", "GET /v1/x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n", "api.test", 443, true, "inject"},
		{"prefix boundary", "GET /v1 HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n", "api.test", 443, true, "credential_path"},
		{"no placeholder", "GET /v1/x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer abc\r\n\r\n", "api.test", 443, true, ""},
		{"other host", "GET /v1/x HTTP/1.1\r\nHost: evil.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n", "evil.test", 443, true, "credential_host"},
		{"sibling host", "GET /v1/x HTTP/1.1\r\nHost: files.api.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n", "files.api.test", 443, true, "credential_host"},
		{"other port", "GET /v1/x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n", "api.test", 8443, true, "credential_host"},
		{"unverified", "GET /v1/x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n", "api.test", 443, false, "credential_unverified"},
		{"method", "DELETE /v1/x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n", "api.test", 443, true, "credential_method"},
		{"trace", "TRACE /v1/x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n", "api.test", 443, true, "credential_method"},
		{"path", "GET /admin HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n", "api.test", 443, true, "credential_path"},
		{"dot segments", "GET /v1/../admin HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n", "api.test", 443, true, "credential_path"},
		{"encoded slash", "GET /v1%2f..%2fadmin HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n", "api.test", 443, true, "credential_path"},
		{"wrong slot", "GET /v1/x HTTP/1.1\r\nHost: api.test\r\nX-Token: " + ph + "\r\n\r\n", "api.test", 443, true, "credential_misuse"},
		{"no prefix", "GET /v1/x HTTP/1.1\r\nHost: api.test\r\nAuthorization: " + ph + "\r\n\r\n", "api.test", 443, true, "credential_misuse"},
		{"twice", "GET /v1/x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph + "\r\nAuthorization: Bearer " + ph + "\r\n\r\n", "api.test", 443, true, "credential_misuse"},
		{"also in query", "GET /v1/x?k=" + ph + " HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n", "api.test", 443, true, "credential_misuse"},
		{"basic auth", "GET /v1/x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Basic " + basic + "\r\n\r\n", "api.test", 443, true, "credential_misuse"},
		{"percent-encoded", "GET /v1/x?k=" + url.QueryEscape(strings.ToUpper(ph[:1])+ph[1:]) + " HTTP/1.1\r\nHost: api.test\r\n\r\n", "api.test", 443, true, "credential_misuse"},
		{"unknown placeholder", "GET /v1/x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer space-cred-ffffffffffffffff\r\n\r\n", "api.test", 443, true, "credential_misuse"},
	} {
		r := req(t, tc.raw)
		used, reason := cs.inject(r, tc.host, tc.port, tc.verified)
		got := reason
		if len(used) > 0 {
			got = "inject"
			if v := r.Header.Get("Authorization"); v != "Bearer s3cr3t-canary-value" {
				t.Errorf("%s: header %q", tc.name, v)
			}
		}
		if got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
		if got != "inject" && strings.Contains(strings.Join(r.Header.Values("Authorization"), ""), "s3cr3t") {
			t.Errorf("%s: secret written into a refused request", tc.name)
		}
	}
	// No credentials attached: any placeholder is refused.
	if _, reason := (*credSet)(nil).inject(req(t, "GET / HTTP/1.1\r\nHost: a.test\r\nCookie: x="+ph+"\r\n\r\n"), "a.test", 443, true); reason != "credential_misuse" {
		t.Errorf("nil set: %q", reason)
	}
}

func TestScrubber(t *testing.T) {
	c, _ := ValidateCredential(testCred())
	sec := string(c.Secret)
	body := "raw=" + sec + " b64=" + base64.StdEncoding.EncodeToString([]byte("Bearer "+sec)) +
		" b64url=" + base64.RawURLEncoding.EncodeToString([]byte("x:"+sec)) + " url=" + url.QueryEscape(sec+"/") +
		` json="` + sec + `" end`
	resp := &http.Response{ProtoMajor: 1, ProtoMinor: 1, StatusCode: 200, Header: http.Header{"X-Echo": {"Bearer " + sec}},
		Body: io.NopCloser(iotest.OneByteReader(strings.NewReader(body))), ContentLength: int64(len(body))}
	if !scrubResponse(resp, []Credential{c}) {
		t.Fatal("refused an identity response")
	}
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(out, []byte(sec)) || strings.Contains(resp.Header.Get("X-Echo"), sec) {
		t.Fatalf("secret left: %s / %s", out, resp.Header.Get("X-Echo"))
	}
	for _, f := range secretForms(sec) {
		if bytes.Contains(out, []byte(f)) {
			t.Errorf("form %q left in %s", f, out)
		}
	}
	if !strings.HasPrefix(string(out), "raw="+c.Placeholder+" ") || !strings.HasSuffix(string(out), " end") {
		t.Errorf("scrubbed body: %s", out)
	}
	gz := &http.Response{Header: http.Header{"Content-Encoding": {"gzip"}}, Body: http.NoBody}
	if scrubResponse(gz, []Credential{c}) {
		t.Error("a compressed response must be refused (R14)")
	}
}

func TestSandboxCA(t *testing.T) {
	ca, err := newSandboxCA("inst-1")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.leaf("registry.test")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca.pem) {
		t.Fatal("CA PEM does not parse")
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "registry.test", Roots: pool}); err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "evil.test", Roots: pool}); err == nil {
		t.Fatal("leaf valid for another name")
	}
	again, _ := ca.leaf("registry.test")
	if again != leaf {
		t.Error("leaf not cached")
	}
	other, _ := newSandboxCA("inst-2")
	pool2 := x509.NewCertPool()
	pool2.AppendCertsFromPEM(other.pem)
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "registry.test", Roots: pool2}); err == nil {
		t.Fatal("one sandbox's CA vouches for another's certificates")
	}
}

func FuzzHasPlaceholder(f *testing.F) {
	f.Add("GET /?a=space-cred-1 HTTP/1.1\r\nHost: a\r\n\r\n")
	f.Add("GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Basic dXNlcjpzcGFjZS1jcmVkLTE=\r\n\r\n")
	f.Fuzz(func(t *testing.T, raw string) {
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return
		}
		c, _ := ValidateCredential(testCred())
		(&credSet{creds: []Credential{c}}).inject(r, "api.test", 443, true)
	})
}
