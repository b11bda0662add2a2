// Package portfwd forwards HTTP requests (HTTP/1.1 and HTTP/2 from the
// client, WebSockets, server-sent events, any body size, nothing buffered)
// to a TCP port inside a sandbox. The bytes travel over the agent's stream
// transport (node.Sandbox.DialPort): the host never dials into a sandbox's
// network, so forwarding works the same for every driver.
//
// A request names its target one of three ways:
//
//   - Host "<port>-<sandbox-id>.<domain>" (wildcard DNS; E2B's getHost);
//   - headers E2b-Sandbox-Id and E2b-Sandbox-Port (E2B SDKs with
//     E2B_SANDBOX_URL, e.g. the code interpreter on port 49999);
//   - path "/v1/sandboxes/{id}/ports/{port}/..." (no wildcard DNS).
package portfwd

import (
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// EnvdPort is E2B's envd port: requests for it are the envd front door's,
// never forwarded.
const EnvdPort = 49983

// Target is the sandbox port a request is for.
type Target struct {
	SandboxID string
	Port      int
	// Prefix is the path prefix of the path form ("/v1/sandboxes/ID/ports/P"),
	// stripped before forwarding; "" for the host and header forms.
	Prefix string
}

// Match finds the target of a request on the data listener. domain is the
// sandbox domain ("" accepts any host whose first label has the form).
func Match(r *http.Request, domain string) (Target, bool) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		// E2B's header routing: envd unless another port is named.
		port, ok := parsePort(r.Header.Get("E2b-Sandbox-Port"))
		if !ok || port == EnvdPort || !validID(id) {
			return Target{}, false
		}
		return Target{SandboxID: id, Port: port}, true
	}
	if t, ok := matchHost(r.Host, domain); ok {
		return t, true
	}
	return matchPath(r.URL.Path)
}

// matchHost parses "<port>-<id>.<domain>[:listener port]".
func matchHost(host, domain string) (Target, bool) {
	host = strings.ToLower(host)
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	label, rest, ok := strings.Cut(name, ".")
	if !ok {
		return Target{}, false
	}
	if domain != "" {
		domain = strings.ToLower(domain)
		// A domain with a port must match the Host with its port; one
		// without matches the name whatever port the client used.
		got := rest
		if strings.Contains(domain, ":") {
			_, got, _ = strings.Cut(host, ".")
		}
		if got != domain {
			return Target{}, false
		}
	}
	p, id, ok := strings.Cut(label, "-")
	if !ok {
		return Target{}, false
	}
	port, ok := parsePort(p)
	if !ok || port == EnvdPort || !validID(id) {
		return Target{}, false
	}
	return Target{SandboxID: id, Port: port}, true
}

// matchPath parses "/v1/sandboxes/{id}/ports/{port}" and what follows it.
func matchPath(p string) (Target, bool) {
	rest, ok := strings.CutPrefix(p, "/v1/sandboxes/")
	if !ok {
		return Target{}, false
	}
	id, rest, ok := strings.Cut(rest, "/")
	if !ok || !validID(id) {
		return Target{}, false
	}
	rest, ok = strings.CutPrefix(rest, "ports/")
	if !ok {
		return Target{}, false
	}
	ps, _, _ := strings.Cut(rest, "/")
	port, ok := parsePort(ps)
	if !ok {
		return Target{}, false
	}
	return Target{SandboxID: id, Port: port, Prefix: "/v1/sandboxes/" + id + "/ports/" + ps}, true
}

// parsePort accepts 1-65535 in canonical decimal form.
func parsePort(s string) (int, bool) {
	if len(s) == 0 || len(s) > 5 || s[0] == '0' {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, false
	}
	return n, true
}

// validID accepts what sandbox ids are made of; anything else is no match
// (a Host label like "www-data" is not a sandbox).
func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// DefaultDomain derives the sandbox domain from the data plane's public
// URL when no --sandbox-domain is set: "localhost:<port>" for an address
// or localhost (browsers resolve every *.localhost to loopback), else the
// URL's host.
func DefaultDomain(dataURL string) string {
	u, err := url.Parse(dataURL)
	if err != nil || u.Host == "" {
		return "localhost"
	}
	host, port := u.Hostname(), u.Port()
	if net.ParseIP(host) != nil || host == "localhost" {
		host = "localhost"
	}
	if port == "" || (u.Scheme == "http" && port == "80") || (u.Scheme == "https" && port == "443") {
		return host
	}
	return host + ":" + port
}

// URLs builds the public URLs of forwarded ports.
type URLs struct {
	Scheme  string // "http" or "https"
	Domain  string // sandbox domain (host form)
	DataURL string // data plane base URL (path form)
}

// NewURLs returns the URL builder for a data plane URL and sandbox domain
// ("" = DefaultDomain(dataURL)).
func NewURLs(dataURL, domain string) URLs {
	scheme := "http"
	if u, err := url.Parse(dataURL); err == nil && u.Scheme == "https" {
		scheme = "https"
	}
	if domain == "" {
		domain = DefaultDomain(dataURL)
	}
	return URLs{Scheme: scheme, Domain: domain, DataURL: strings.TrimSuffix(dataURL, "/")}
}

// Host is the host-form URL of a port ("http://8000-sbx-1.localhost:3001/").
func (u URLs) Host(id string, port int) string {
	return u.Scheme + "://" + strconv.Itoa(port) + "-" + id + "." + u.Domain + "/"
}

// Path is the path-form URL of a port.
func (u URLs) Path(id string, port int) string {
	return u.DataURL + "/v1/sandboxes/" + id + "/ports/" + strconv.Itoa(port) + "/"
}
