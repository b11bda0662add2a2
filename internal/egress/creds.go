package egress

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"path"
	"sort"
	"strings"

	"github.com/space-sandbox/space/internal/egress/policy"
)

// PlaceholderPrefix starts every credential placeholder. The gateway
// refuses any request that carries it (in any header or the request
// target) unless it substitutes it, so a placeholder sent to the wrong
// place is caught and logged (R13).
const PlaceholderPrefix = "space-cred-"

// Credential is a secret bound to one upstream slot (R13). The sandbox
// holds only Placeholder; the gateway puts Prefix+Secret into Header, in
// place of Prefix+Placeholder, only on a TLS connection it terminated,
// whose upstream it dialled to an address it resolved itself and whose
// certificate it verified for Host, when port, method and path match.
type Credential struct {
	ID          string
	Host        string   // canonical, exact (no wildcard)
	Port        uint16   // default 443
	Header      string   // the slot, e.g. "Authorization"
	Prefix      string   // e.g. "Bearer "; the value is Prefix+Secret
	Methods     []string // allowed methods (upper case); empty: any but TRACE, OPTIONS, CONNECT
	PathPrefix  string   // "" or an absolute, normalised path; matched on a segment boundary
	Placeholder string   // what the sandbox sends
	Secret      []byte
}

// forbiddenSlots are headers a credential may never be written to.
var forbiddenSlots = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Upgrade": true, "Te": true, "Trailer": true, "Expect": true, "Proxy-Authorization": true,
	"Forwarded": true, "X-Forwarded-For": true, "X-Forwarded-Host": true, "Content-Type": true,
}

// ValidateCredential checks a binding's shape; it returns the binding in
// canonical form (the API layer and the gateway use this same function).
func ValidateCredential(c Credential) (Credential, error) {
	host, err := policy.Canonical(c.Host)
	if err != nil || policy.IsIPLiteral(host) {
		return c, fmt.Errorf("credential %s: host must be a host name (got %.80q)", c.ID, c.Host)
	}
	c.Host = host
	if c.Port == 0 {
		c.Port = 443
	}
	if c.Header == "" {
		c.Header = "Authorization"
	}
	if !validToken(c.Header) {
		return c, fmt.Errorf("credential %s: bad header name %.64q", c.ID, c.Header)
	}
	c.Header = textproto.CanonicalMIMEHeaderKey(c.Header)
	if forbiddenSlots[c.Header] {
		return c, fmt.Errorf("credential %s: header %s cannot carry a credential", c.ID, c.Header)
	}
	if !headerSafe(c.Prefix) || len(c.Prefix) > 64 {
		return c, fmt.Errorf("credential %s: bad prefix", c.ID)
	}
	if len(c.Secret) < 8 || len(c.Secret) > 8192 || !headerSafe(string(c.Secret)) || strings.TrimSpace(string(c.Secret)) != string(c.Secret) {
		return c, fmt.Errorf("credential %s: the secret must be 8..8192 printable bytes without surrounding spaces", c.ID)
	}
	if !strings.HasPrefix(c.Placeholder, PlaceholderPrefix) || !validToken(c.Placeholder) {
		return c, fmt.Errorf("credential %s: placeholder must start with %s", c.ID, PlaceholderPrefix)
	}
	if strings.Contains(string(c.Secret), PlaceholderPrefix) {
		return c, fmt.Errorf("credential %s: the secret contains the placeholder prefix", c.ID)
	}
	ms := make([]string, 0, len(c.Methods))
	for _, m := range c.Methods {
		m = strings.ToUpper(m)
		switch {
		case !validToken(m):
			return c, fmt.Errorf("credential %s: bad method %.16q", c.ID, m)
		case m == http.MethodTrace || m == http.MethodOptions || m == http.MethodConnect:
			return c, fmt.Errorf("credential %s: method %s never carries a credential", c.ID, m)
		}
		ms = append(ms, m)
	}
	sort.Strings(ms)
	c.Methods = ms
	if c.PathPrefix != "" {
		if !normalPath(c.PathPrefix) || strings.ContainsAny(c.PathPrefix, "%?#\\") {
			return c, fmt.Errorf("credential %s: path_prefix must be an absolute, normalised path without %%, ?, # or \\", c.ID)
		}
	}
	return c, nil
}

func validToken(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func headerSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// normalPath reports whether p is absolute with no empty, "." or ".."
// segments (a trailing slash is allowed).
func normalPath(p string) bool {
	if !strings.HasPrefix(p, "/") {
		return false
	}
	if p == "/" {
		return true
	}
	return path.Clean(p) == strings.TrimSuffix(p, "/") && !strings.HasSuffix(p, "//")
}

// credSet is a sandbox's attached credentials, swapped as a whole.
type credSet struct {
	creds []Credential
}

// SetCredentials replaces the credentials attached to a sandbox. New
// requests see the new set at once.
func (g *Gateway) SetCredentials(id string, creds []Credential) error {
	s, err := g.get(id)
	if err != nil {
		return err
	}
	set := &credSet{}
	for _, c := range creds {
		v, err := ValidateCredential(c)
		if err != nil {
			return err
		}
		v.Secret = append([]byte(nil), v.Secret...)
		set.creds = append(set.creds, v)
	}
	s.creds.Store(set)
	return nil
}

// bound reports whether some credential is bound to name:port (its TLS
// is then always terminated, so the placeholder can be substituted).
func (cs *credSet) bound(name string, port uint16) bool {
	if cs == nil {
		return false
	}
	for _, c := range cs.creds {
		if c.Host == name && c.Port == port {
			return true
		}
	}
	return false
}

// hasPlaceholder reports whether a request carries a credential
// placeholder anywhere the gateway looks: the request target and every
// header name and value, also inside base64 tokens (Basic auth) and
// percent-encoding. Bodies are not scanned.
func hasPlaceholder(r *http.Request) bool {
	if containsPlaceholder(r.RequestURI) || containsPlaceholder(r.URL.String()) {
		return true
	}
	for k, vs := range r.Header {
		if containsPlaceholder(k) {
			return true
		}
		for _, v := range vs {
			if containsPlaceholder(v) {
				return true
			}
		}
	}
	return false
}

func containsPlaceholder(s string) bool {
	if s == "" {
		return false
	}
	if strings.Contains(strings.ToLower(s), PlaceholderPrefix) {
		return true
	}
	if u, err := url.PathUnescape(s); err == nil && u != s && strings.Contains(strings.ToLower(u), PlaceholderPrefix) {
		return true
	}
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' || r == ';' }) {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			if b, err := enc.DecodeString(f); err == nil && strings.Contains(strings.ToLower(string(b)), PlaceholderPrefix) {
				return true
			}
		}
	}
	return false
}

// inject substitutes the placeholders of the credentials bound to this
// exact request (R13) on a gateway-terminated TLS connection. verified
// says the upstream was dialled to an address the gateway resolved for
// name and its certificate verified. It returns the credentials used, or a
// reason to refuse the request: a placeholder that is left anywhere after
// substitution is a misuse.
func (cs *credSet) inject(r *http.Request, name string, port uint16, verified bool) ([]Credential, string) {
	if !hasPlaceholder(r) {
		return nil, ""
	}
	var used []Credential
	reason := "credential_misuse"
	if cs != nil {
		for _, c := range cs.creds {
			vals := r.Header.Values(c.Header)
			if len(vals) != 1 || vals[0] != c.Prefix+c.Placeholder {
				continue
			}
			switch {
			case c.Host != name || c.Port != port:
				reason = "credential_host"
				continue
			case !verified:
				reason = "credential_unverified"
				continue
			case !methodOK(c, r.Method):
				reason = "credential_method"
				continue
			case !pathOK(c, r):
				reason = "credential_path"
				continue
			}
			r.Header.Set(c.Header, c.Prefix+string(c.Secret))
			used = append(used, c)
		}
	}
	if hasPlaceholderExcept(r, used) {
		for _, c := range used {
			r.Header.Set(c.Header, c.Prefix+c.Placeholder) // refused: take the secret back out
		}
		return nil, reason
	}
	return used, ""
}

// hasPlaceholderExcept is hasPlaceholder ignoring the slots just filled.
func hasPlaceholderExcept(r *http.Request, used []Credential) bool {
	if len(used) == 0 {
		return hasPlaceholder(r)
	}
	saved := map[string][]string{}
	for _, c := range used {
		saved[c.Header] = r.Header.Values(c.Header)
		r.Header.Del(c.Header)
	}
	found := hasPlaceholder(r)
	for k, v := range saved {
		r.Header[k] = v
	}
	return found
}

func methodOK(c Credential, m string) bool {
	if m == http.MethodTrace || m == http.MethodOptions || m == http.MethodConnect {
		return false
	}
	if len(c.Methods) == 0 {
		return true
	}
	for _, x := range c.Methods {
		if x == m {
			return true
		}
	}
	return false
}

// pathOK matches the request path against the binding's prefix on a
// segment boundary. The path must be normalised and carry no encoded
// slash, backslash or dot, so what is matched is what the upstream sees.
func pathOK(c Credential, r *http.Request) bool {
	if c.PathPrefix == "" {
		return true
	}
	raw := r.URL.EscapedPath()
	low := strings.ToLower(raw)
	if strings.Contains(low, "%2f") || strings.Contains(low, "%5c") || strings.Contains(low, "%2e") || strings.Contains(raw, "\\") {
		return false
	}
	p := r.URL.Path
	if !normalPath(p) {
		return false
	}
	pre := c.PathPrefix
	if p == pre || strings.HasSuffix(pre, "/") && strings.HasPrefix(p, pre) {
		return true
	}
	return strings.HasPrefix(p, pre) && p[len(pre)] == '/'
}

// scrubber replaces a secret, in every encoding R14 names, by its
// placeholder in a response stream, across read boundaries.
type scrubber struct {
	pats [][]byte // longest first
	repl [][]byte
	max  int
}

func newScrubber(creds []Credential) *scrubber {
	s := &scrubber{}
	type pr struct{ p, r string }
	var all []pr
	seen := map[string]bool{}
	for _, c := range creds {
		for _, f := range secretForms(string(c.Secret)) {
			if len(f) >= 4 && !seen[f] {
				seen[f] = true
				all = append(all, pr{f, c.Placeholder})
			}
		}
	}
	sort.Slice(all, func(i, j int) bool { return len(all[i].p) > len(all[j].p) })
	for _, x := range all {
		s.pats = append(s.pats, []byte(x.p))
		s.repl = append(s.repl, []byte(x.r))
		s.max = max(s.max, len(x.p))
	}
	return s
}

// secretForms is the secret raw, URL-encoded, JSON-escaped and in base64
// and base64url at every byte alignment (the part of the encoding that
// only the secret determines, so it is found inside longer encodings such
// as Basic "user:secret").
func secretForms(sec string) []string {
	forms := []string{sec, url.QueryEscape(sec), url.PathEscape(sec)}
	if j, err := json.Marshal(sec); err == nil {
		forms = append(forms, string(j[1:len(j)-1]))
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for off := 0; off < 3; off++ {
			e := enc.EncodeToString(append(make([]byte, off), sec...))
			// Character i encodes bits 6i..6i+5: bytes 6i/8 .. (6i+5)/8.
			start, end := -1, -1
			for i := 0; i*6 < (off+len(sec))*8; i++ {
				if (6*i)/8 >= off && (6*i+5)/8 <= off+len(sec)-1 {
					if start < 0 {
						start = i
					}
					end = i
				}
			}
			if start >= 0 && end < len(e) {
				forms = append(forms, e[start:end+1])
			}
		}
	}
	return forms
}

// process scrubs buf; unless final, it keeps back a tail that could be
// the start of a secret continued in the next read.
func (s *scrubber) process(buf []byte, final bool) (out, rest []byte) {
	limit := len(buf)
	if !final {
		limit = len(buf) - (s.max - 1)
	}
	i := 0
	for i < limit {
		hit := false
		for k, p := range s.pats {
			if bytes.HasPrefix(buf[i:], p) {
				out = append(out, s.repl[k]...)
				i += len(p)
				hit = true
				break
			}
		}
		if !hit {
			out = append(out, buf[i])
			i++
		}
	}
	return out, buf[i:]
}

func (s *scrubber) string(v string) string {
	out, _ := s.process([]byte(v), true)
	return string(out)
}

// reader wraps a response body.
func (s *scrubber) reader(r io.ReadCloser) io.ReadCloser {
	return &scrubReader{s: s, r: r}
}

type scrubReader struct {
	s       *scrubber
	r       io.ReadCloser
	pending []byte
	out     []byte
	eof     bool
	err     error
}

func (sr *scrubReader) Read(p []byte) (int, error) {
	for len(sr.out) == 0 {
		if sr.eof {
			return 0, sr.err
		}
		buf := make([]byte, 32<<10)
		n, err := sr.r.Read(buf)
		sr.pending = append(sr.pending, buf[:n]...)
		if err != nil {
			sr.eof = true
			sr.err = err
			if errors.Is(err, io.EOF) {
				sr.err = io.EOF
			}
		}
		sr.out, sr.pending = sr.s.process(sr.pending, sr.eof)
		sr.pending = append([]byte(nil), sr.pending...)
	}
	n := copy(p, sr.out)
	sr.out = sr.out[n:]
	return n, nil
}

func (sr *scrubReader) Close() error { return sr.r.Close() }

// scrubResponse applies R14 to a response to a credential-bearing request:
// headers and body are scrubbed; an encoded body that cannot be scanned is
// refused (false).
func scrubResponse(resp *http.Response, used []Credential) bool {
	s := newScrubber(used)
	if ce := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding"))); ce != "" && ce != "identity" {
		return false
	}
	for k, vs := range resp.Header {
		for i, v := range vs {
			vs[i] = s.string(v)
		}
		resp.Header[k] = vs
	}
	if resp.Body != nil && resp.Body != http.NoBody && resp.ContentLength != 0 {
		resp.Body = s.reader(resp.Body)
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
		if resp.ProtoAtLeast(1, 1) {
			resp.TransferEncoding = []string{"chunked"}
		}
	}
	return true
}

// Revoke removes a credential from every sandbox it is attached to.
func (g *Gateway) Revoke(credID string) {
	g.mu.Lock()
	list := make([]*sandbox, 0, len(g.sbx))
	for _, s := range g.sbx {
		list = append(list, s)
	}
	g.mu.Unlock()
	for _, s := range list {
		for {
			cur := s.creds.Load()
			next := &credSet{}
			for _, c := range cur.creds {
				if c.ID != credID {
					next.creds = append(next.creds, c)
				}
			}
			if len(next.creds) == len(cur.creds) || s.creds.CompareAndSwap(cur, next) {
				break
			}
		}
	}
}
