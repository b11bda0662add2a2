package e2b

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
)

func TestMapNetwork(t *testing.T) {
	internal := func(p netip.Prefix) bool {
		for _, s := range []string{"10.0.0.0/8", "169.254.0.0/16", "192.168.0.0/16"} {
			if q := netip.MustParsePrefix(s); q.Contains(p.Addr()) && q.Bits() <= p.Bits() {
				return true
			}
		}
		return false
	}
	yes, no := true, false
	for _, c := range []struct {
		name     string
		allow    *bool
		allowSet bool
		body     string // network JSON
		want     string // policy JSON, "" = nil, "400 ..." = error containing
	}{
		{"nothing", nil, true, ``, ""},
		{"v1 default true", &yes, false, ``, ""},
		{"v2 true", &yes, true, ``, `{"mode":"open"}`},
		{"false", &no, false, ``, `{"mode":"blocked"}`},
		{"false with names", &no, true, `{"allowOut":["api.example.com","*.pypi.org"]}`, `{"mode":"allowlist","allow":["api.example.com","*.pypi.org"]}`},
		{"deny all with names", nil, true, `{"allowOut":["api.example.com"],"denyOut":["0.0.0.0/0"]}`, `{"mode":"allowlist","allow":["api.example.com"]}`},
		{"deny all", nil, true, `{"denyOut":["0.0.0.0/0","::/0"]}`, `{"mode":"blocked"}`},
		{"allow all wins", &no, true, `{"allowOut":["0.0.0.0/0"],"denyOut":["0.0.0.0/0"]}`, `{"mode":"open"}`},
		{"names alone", nil, true, `{"allowOut":["api.example.com"]}`, `{"mode":"allowlist","allow":["api.example.com"]}`},
		{"v2 true and names", &yes, true, `{"allowOut":["api.example.com"]}`, `{"mode":"open"}`},
		{"deny internal", nil, true, `{"denyOut":["10.0.0.0/8","169.254.169.254","192.168.1.0/24"]}`, `{"mode":"open"}`},
		{"deny public", nil, true, `{"denyOut":["8.8.8.8/32"]}`, "400 8.8.8.8/32: SPACE cannot deny a public range"},
		{"allow address", nil, true, `{"allowOut":["1.1.1.1"],"denyOut":["0.0.0.0/0"]}`, "400 \"1.1.1.1\": SPACE allows destinations by host name"},
		{"allow cidr", nil, true, `{"allowOut":["8.8.8.0/24"]}`, "400 \"8.8.8.0/24\""},
		{"allow inet_aton", nil, true, `{"allowOut":["0x7f.1"]}`, "400 \"0x7f.1\""},
		{"deny name", nil, true, `{"denyOut":["evil.example.com"]}`, "400 \"evil.example.com\": not an address"},
		{"rules", nil, true, `{"allowOut":["api.example.com"],"rules":{"api.example.com":[{"transform":{"headers":{"A":"b"}}}]}}`, "400 network.rules"},
		{"empty rules", nil, true, `{"rules":{}}`, ""},
		{"proxy", nil, true, `{"egressProxy":{"address":"p:1080"}}`, "400 network.egressProxy"},
		{"null proxy, ingress fields", nil, true, `{"egressProxy":null,"allowPublicTraffic":false,"httpsPorts":[3000]}`, ""},
	} {
		var n *e2bNetwork
		if c.body != "" {
			n = &e2bNetwork{}
			if err := json.Unmarshal([]byte(c.body), n); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		}
		got, err := mapNetwork(c.allow, c.allowSet, n, internal)
		switch {
		case strings.HasPrefix(c.want, "400 "):
			if st, _, msg := httpx.StatusOf(err); st != 400 || !strings.Contains(msg, c.want[4:]) {
				t.Errorf("%s: %d %v, want 400 with %q", c.name, st, err, c.want[4:])
			}
		case err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want == "":
			if got != nil {
				t.Errorf("%s: %+v, want none", c.name, got)
			}
		default:
			var want core.NetworkPolicy
			json.Unmarshal([]byte(c.want), &want)
			if got == nil || !reflect.DeepEqual(*got, want) {
				t.Errorf("%s: %+v, want %+v", c.name, got, want)
			}
		}
	}
	if _, err := mapNetwork(nil, true, &e2bNetwork{DenyOut: []string{"10.0.0.0/8"}}, nil); err == nil {
		t.Error("denyOut accepted with no internal-range check")
	}
}

func TestNetworkInfo(t *testing.T) {
	for _, c := range []struct {
		p     *core.NetworkPolicy
		allow string
		info  string
	}{
		{nil, "false", `{"denyOut":["0.0.0.0/0"]}`},
		{&core.NetworkPolicy{Mode: "blocked"}, "false", `{"denyOut":["0.0.0.0/0"]}`},
		{&core.NetworkPolicy{Mode: "open"}, "true", `{}`},
		{&core.NetworkPolicy{Mode: "allowlist", Allow: core.AllowRules{"api.test:443 GET /v1/*", "*.pypi.org"}}, "null", `{"allowOut":["api.test","*.pypi.org"],"denyOut":["0.0.0.0/0"]}`},
	} {
		a, n := networkInfo(c.p)
		ab, _ := json.Marshal(a)
		nb, _ := json.Marshal(n)
		if string(ab) != c.allow || string(nb) != c.info {
			t.Errorf("%+v: %s %s, want %s %s", c.p, ab, nb, c.allow, c.info)
		}
	}
}
