// Package policy parses and matches per-sandbox egress policies. It has no
// dependencies so that the API layer can validate what the gateway enforces
// with the very same code (R8: one canonical name everywhere).
package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Mode is a sandbox's egress mode.
type Mode string

// Modes.
const (
	// Blocked: nothing leaves the sandbox, DNS included (the default).
	Blocked Mode = "blocked"
	// Allowlist: only (name, port) pairs in the rules.
	Allowlist Mode = "allowlist"
	// Open: any public destination; internal ones never.
	Open Mode = "open"
)

// Limits on policies.
const (
	MaxRules   = 256
	maxNameLen = 253
	maxLabel   = 63
)

// ErrInvalid marks a policy or name that does not parse.
var ErrInvalid = errors.New("invalid egress policy")

// Rule allows one name (or every proper subdomain of it) on some ports.
type Rule struct {
	Name     string   // canonical, without "*."
	Wildcard bool     // "*.name": proper subdomains only, on a label boundary
	Ports    []uint16 // sorted, never empty
	// Methods, when set, are the only request methods allowed (upper
	// case); Paths, when set, the only request paths ("/exact" or
	// "/prefix/*"). A rule with either is enforced per HTTP request, so
	// its TLS is always terminated.
	Methods []string
	Paths   []string
}

// Restricted reports whether the rule limits methods or paths.
func (r Rule) Restricted() bool { return len(r.Methods) > 0 || len(r.Paths) > 0 }

// String renders the rule in the form it is written in.
func (r Rule) String() string {
	ps := make([]string, len(r.Ports))
	for i, p := range r.Ports {
		ps[i] = strconv.Itoa(int(p))
	}
	n := r.Name
	if r.Wildcard {
		n = "*." + n
	}
	n += ":" + strings.Join(ps, ",")
	if len(r.Methods) > 0 {
		n += " " + strings.Join(r.Methods, ",")
	}
	if len(r.Paths) > 0 {
		n += " " + strings.Join(r.Paths, ",")
	}
	return n
}

// Policy is a parsed, immutable policy. Swap whole values to change one.
type Policy struct {
	Mode  Mode
	Rules []Rule
	// Passthrough names allowlisted TLS that is relayed as is; any other
	// allowlisted TLS is terminated with the sandbox's CA (R10).
	Passthrough []Rule
}

// DefaultPorts apply to a rule written without ports.
var DefaultPorts = []uint16{80, 443}

// Parse validates a mode and its allow rules ("host", "host:443",
// "*.host:80,443"). An empty mode means blocked. Rules are only allowed in
// allowlist mode.
func Parse(mode string, allow []string) (*Policy, error) {
	p := &Policy{Mode: Mode(mode)}
	switch p.Mode {
	case "":
		p.Mode = Blocked
	case Blocked, Allowlist, Open:
	default:
		return nil, fmt.Errorf("%w: mode must be blocked, allowlist or open", ErrInvalid)
	}
	if p.Mode != Allowlist && len(allow) > 0 {
		return nil, fmt.Errorf("%w: allow rules need mode allowlist", ErrInvalid)
	}
	if len(allow) > MaxRules {
		return nil, fmt.Errorf("%w: at most %d rules", ErrInvalid, MaxRules)
	}
	for _, a := range allow {
		if name, ok := strings.CutPrefix(a, PresetPrefix); ok {
			rs, err := PresetRules(name)
			if err != nil {
				return nil, err
			}
			for _, r := range rs {
				if !slicesContainsRule(p.Rules, r) {
					p.Rules = append(p.Rules, r)
				}
			}
			continue
		}
		r, err := ParseRule(a)
		if err != nil {
			return nil, err
		}
		p.Rules = append(p.Rules, r)
	}
	if len(p.Rules) > MaxRules {
		return nil, fmt.Errorf("%w: at most %d rules after preset expansion", ErrInvalid, MaxRules)
	}
	return p, nil
}

func slicesContainsRule(rs []Rule, r Rule) bool {
	for _, x := range rs {
		if x.String() == r.String() {
			return true
		}
	}
	return false
}

// PresetPrefix marks an allow entry naming a registry preset
// ("preset:pypi"); Parse expands it into its rules.
const PresetPrefix = "preset:"

// presets are the registry host sets (R20): read-only (GET, HEAD) access
// to the public package registries.
var presets = map[string][]string{
	"debian":  {"deb.debian.org:80,443 GET,HEAD", "security.debian.org:80,443 GET,HEAD"},
	"pypi":    {"pypi.org:443 GET,HEAD", "files.pythonhosted.org:443 GET,HEAD"},
	"npm":     {"registry.npmjs.org:443 GET,HEAD"},
	"goproxy": {"proxy.golang.org:443 GET,HEAD", "sum.golang.org:443 GET,HEAD"},
}

// PresetNames lists the known registry presets, sorted.
func PresetNames() []string {
	out := make([]string, 0, len(presets))
	for k := range presets {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// PresetRules returns the rules a registry preset expands to.
func PresetRules(name string) ([]Rule, error) {
	src, ok := presets[name]
	if !ok {
		return nil, fmt.Errorf("%w: unknown preset %.40q (known: %s)", ErrInvalid, name, strings.Join(PresetNames(), ", "))
	}
	out := make([]Rule, 0, len(src))
	for _, s := range src {
		r, err := ParseRule(s)
		if err != nil {
			panic("policy: bad preset rule " + s + ": " + err.Error())
		}
		out = append(out, r)
	}
	return out, nil
}

// ExpandPresets returns the allow entries (rule syntax) that presets
// expand to, for an API that takes presets as a separate list.
func ExpandPresets(names []string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			return nil, fmt.Errorf("%w: preset %.40q repeated", ErrInvalid, n)
		}
		seen[n] = true
		rs, err := PresetRules(n)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			out = append(out, r.String())
		}
	}
	return out, nil
}

// Limits on method/path restrictions.
const (
	maxMethods = 16
	maxPaths   = 32
	maxPathLen = 512
)

// ParseRule parses one allow rule: "host[:port[,port]]", optionally
// followed by a space and a comma-separated method list ("GET,HEAD")
// and/or a space and a comma-separated path list ("/v1/*,/health").
func ParseRule(s string) (Rule, error) {
	var r Rule
	if len(s) > 1<<15 { // the parts have their own, smaller limits
		return r, fmt.Errorf("%w: rule too long", ErrInvalid)
	}
	fields := strings.Split(s, " ")
	s = fields[0]
	for _, f := range fields[1:] {
		var err error
		switch {
		case strings.HasPrefix(f, "/"):
			if r.Paths != nil {
				return r, fmt.Errorf("%w: rule %.80q: more than one path list", ErrInvalid, s)
			}
			r.Paths, err = parsePaths(f)
		default:
			if r.Methods != nil {
				return r, fmt.Errorf("%w: rule %.80q: more than one method list", ErrInvalid, s)
			}
			r.Methods, err = parseMethods(f)
		}
		if err != nil {
			return r, fmt.Errorf("%w: rule %.80q: %v", ErrInvalid, s, err)
		}
	}
	if len(s) > maxNameLen+64 {
		return r, fmt.Errorf("%w: rule too long", ErrInvalid)
	}
	host, ports := s, ""
	if i := strings.IndexByte(s, ':'); i >= 0 {
		host, ports = s[:i], s[i+1:]
		if ports == "" {
			return r, fmt.Errorf("%w: rule %.80q: empty port list", ErrInvalid, s)
		}
	}
	if strings.HasPrefix(host, "*.") {
		r.Wildcard = true
		host = host[2:]
	}
	name, err := Canonical(host)
	if err != nil {
		return r, fmt.Errorf("%w: rule %.80q: %v", ErrInvalid, s, err)
	}
	if IsIPLiteral(name) {
		return r, fmt.Errorf("%w: rule %.80q: IP literals are not allowed (R7)", ErrInvalid, s)
	}
	if r.Wildcard && !strings.Contains(name, ".") {
		return r, fmt.Errorf("%w: rule %.80q: a wildcard needs at least two labels", ErrInvalid, s)
	}
	r.Name = name
	if ports == "" {
		r.Ports = append([]uint16(nil), DefaultPorts...)
		return r, nil
	}
	seen := map[uint16]bool{}
	for _, ps := range strings.Split(ports, ",") {
		n, err := strconv.ParseUint(ps, 10, 16)
		if err != nil || n == 0 || strconv.FormatUint(n, 10) != ps {
			return r, fmt.Errorf("%w: rule %.80q: bad port %.8q", ErrInvalid, s, ps)
		}
		if !seen[uint16(n)] {
			seen[uint16(n)] = true
			r.Ports = append(r.Ports, uint16(n))
		}
	}
	sort.Slice(r.Ports, func(i, j int) bool { return r.Ports[i] < r.Ports[j] })
	return r, nil
}

func parseMethods(f string) ([]string, error) {
	ms := strings.Split(f, ",")
	if len(ms) > maxMethods {
		return nil, fmt.Errorf("at most %d methods", maxMethods)
	}
	var out []string
	for _, m := range ms {
		if m == "" || len(m) > 16 {
			return nil, fmt.Errorf("bad method %.20q", m)
		}
		for _, c := range m {
			if c < 'A' || c > 'Z' {
				return nil, fmt.Errorf("bad method %.20q (upper-case letters only)", m)
			}
		}
		if m == "CONNECT" || m == "TRACE" {
			return nil, fmt.Errorf("method %s is never allowed", m)
		}
		if !containsString(out, m) {
			out = append(out, m)
		}
	}
	sort.Strings(out)
	return out, nil
}

func parsePaths(f string) ([]string, error) {
	ps := strings.Split(f, ",")
	if len(ps) > maxPaths {
		return nil, fmt.Errorf("at most %d paths", maxPaths)
	}
	var out []string
	for _, p := range ps {
		if len(p) > maxPathLen {
			return nil, errors.New("path too long")
		}
		base := p
		if strings.HasSuffix(p, "/*") {
			base = p[:len(p)-1]
		}
		if !NormalPath(base) || strings.ContainsAny(base, "%?#\\*") {
			return nil, fmt.Errorf("bad path %.60q: absolute and normalised, no %%, ?, #, \\; '*' only as a final \"/*\"", p)
		}
		if !containsString(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// NormalPath reports whether p is absolute with no empty, "." or ".."
// segments (a trailing slash is allowed).
func NormalPath(p string) bool {
	if !strings.HasPrefix(p, "/") {
		return false
	}
	if p == "/" {
		return true
	}
	return path.Clean(p) == strings.TrimSuffix(p, "/") && !strings.HasSuffix(p, "//")
}

// matchPath matches a normalised request path against "/exact" or
// "/prefix/*" (the prefix itself, with or without its slash, and
// everything below it).
func matchPath(pattern, p string) bool {
	if pre, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(p, pre) || p == strings.TrimSuffix(pre, "/")
	}
	return p == pattern
}

// Canonical returns the one spelling of a host name used everywhere (R8):
// lower case, one trailing dot removed, LDH labels (plus '_') of 1..63
// bytes, at most 253 bytes. Anything else (NUL, '%', '@', ':', '*',
// non-ASCII, empty labels) is an error: U-labels must arrive as A-labels.
func Canonical(s string) (string, error) {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > maxNameLen {
		return "", errors.New("name is empty or longer than 253 bytes")
	}
	b := []byte(s)
	label := 0
	for i, c := range b {
		switch {
		case c >= 'A' && c <= 'Z':
			b[i] = c + 'a' - 'A'
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
		case c == '.':
			if label == 0 {
				return "", errors.New("empty label")
			}
			label = 0
			continue
		default:
			return "", fmt.Errorf("byte %q not allowed in a host name", c)
		}
		label++
		if label > maxLabel {
			return "", errors.New("label longer than 63 bytes")
		}
	}
	if label == 0 {
		return "", errors.New("empty label")
	}
	return string(b), nil
}

// IsIPLiteral reports whether a canonical name is an IP address in any
// spelling inet_aton accepts (R7): dotted, shortened ("127.1"), decimal
// ("2130706433"), hex or octal parts. No real TLD is all digits or 0x-hex,
// so a numeric last label is enough to tell.
func IsIPLiteral(name string) bool {
	if _, err := netip.ParseAddr(name); err == nil {
		return true
	}
	last := name
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		last = name[i+1:]
	}
	if last == "" {
		return false
	}
	if strings.HasPrefix(last, "0x") {
		for _, c := range last[2:] {
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
		return true
	}
	for _, c := range last {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// matchName reports whether a canonical name is covered by r.
func (r Rule) matchName(name string) bool {
	if r.Wildcard {
		return len(name) > len(r.Name)+1 && strings.HasSuffix(name, r.Name) && name[len(name)-len(r.Name)-1] == '.'
	}
	return name == r.Name
}

// AllowName reports whether any rule covers name on some port: the
// resolver recurses only for such names. It returns the matching rule.
func (p *Policy) AllowName(name string) (Rule, bool) {
	if p == nil {
		return Rule{}, false
	}
	switch p.Mode {
	case Open:
		return Rule{Name: "*"}, true
	case Allowlist:
		for _, r := range p.Rules {
			if r.matchName(name) {
				return r, true
			}
		}
	}
	return Rule{}, false
}

// Allow reports whether a connection to name:port is allowed, and by which
// rule. IP literals never match a rule (R7).
func (p *Policy) Allow(name string, port uint16) (Rule, bool) {
	if p == nil {
		return Rule{}, false
	}
	switch p.Mode {
	case Open:
		return Rule{Name: "*"}, true
	case Allowlist:
		if IsIPLiteral(name) {
			return Rule{}, false
		}
		for _, r := range p.Rules {
			if !r.matchName(name) {
				continue
			}
			for _, rp := range r.Ports {
				if rp == port {
					return r, true
				}
			}
		}
	}
	return Rule{}, false
}

// Inspect reports whether some rule for name:port limits methods or
// paths: such connections must be terminated and checked per request.
func (p *Policy) Inspect(name string, port uint16) bool {
	if p == nil || p.Mode != Allowlist {
		return false
	}
	for _, r := range p.Rules {
		if r.Restricted() && r.matchName(name) && containsPort(r.Ports, port) {
			return true
		}
	}
	return false
}

func containsPort(ps []uint16, port uint16) bool {
	for _, x := range ps {
		if x == port {
			return true
		}
	}
	return false
}

// AllowRequest decides one HTTP request to name:port. reqPath is the
// request's decoded path, or "" when it is not normalised or carries an
// encoded slash, backslash or dot (then only rules without paths match).
// In open mode, and for rules without methods and paths, any request
// passes.
func (p *Policy) AllowRequest(name string, port uint16, method, reqPath string) (Rule, bool) {
	if p == nil {
		return Rule{}, false
	}
	switch p.Mode {
	case Open:
		return Rule{Name: "*"}, true
	case Allowlist:
		if IsIPLiteral(name) {
			return Rule{}, false
		}
		for _, r := range p.Rules {
			if !r.matchName(name) || !containsPort(r.Ports, port) {
				continue
			}
			if len(r.Methods) > 0 && !containsString(r.Methods, method) {
				continue
			}
			if len(r.Paths) > 0 {
				ok := false
				for _, pat := range r.Paths {
					if reqPath != "" && matchPath(pat, reqPath) {
						ok = true
						break
					}
				}
				if !ok {
					continue
				}
			}
			return r, true
		}
	}
	return Rule{}, false
}

// Strings renders the rules back (for the API).
func (p *Policy) Strings() []string {
	out := make([]string, len(p.Rules))
	for i, r := range p.Rules {
		out[i] = r.String()
	}
	return out
}

// WithPassthrough returns a copy of p whose TLS connections to names
// matching these rules (same syntax as allow rules) are relayed without
// termination. Only allowlist policies have any: in open mode nothing is
// terminated except hosts with bound credentials.
func (p *Policy) WithPassthrough(rules []string) (*Policy, error) {
	if len(rules) == 0 {
		return p, nil
	}
	if p.Mode != Allowlist {
		return nil, fmt.Errorf("%w: passthrough rules need mode allowlist", ErrInvalid)
	}
	if len(rules) > MaxRules {
		return nil, fmt.Errorf("%w: at most %d passthrough rules", ErrInvalid, MaxRules)
	}
	out := *p
	out.Passthrough = nil
	for _, s := range rules {
		r, err := ParseRule(s)
		if err != nil {
			return nil, err
		}
		if r.Restricted() {
			return nil, fmt.Errorf("%w: passthrough rule %.80q: methods and paths need termination", ErrInvalid, s)
		}
		out.Passthrough = append(out.Passthrough, r)
	}
	return &out, nil
}

// IsPassthrough reports whether TLS to name:port is left unterminated.
func (p *Policy) IsPassthrough(name string, port uint16) bool {
	if p == nil {
		return false
	}
	for _, r := range p.Passthrough {
		if r.matchName(name) {
			for _, rp := range r.Ports {
				if rp == port {
					return true
				}
			}
		}
	}
	return false
}

// PassthroughStrings renders the passthrough rules back (for the API).
func (p *Policy) PassthroughStrings() []string {
	out := make([]string, len(p.Passthrough))
	for i, r := range p.Passthrough {
		out[i] = r.String()
	}
	return out
}
