package egress_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

// TestEgressRealTools: allowed traffic with the tools people actually use,
// from a Debian sandbox (the "base" template of the shared test-template
// cache, built by mmdebstrap: apt, python3, ca-certificates; no curl, no
// pip) with an allowlist, through the terminating gateway:
//
//   - curl: the host's own /usr/bin/curl and the shared libraries it links
//     (the base template has no curl; same Debian release), uploaded
//     through the agent's file API into /opt/hostcurl;
//   - apt-get update + apt-get download from a Debian repository on
//     registry.test (Release with checksums, Packages(.gz), a real .deb),
//     over HTTPS verified with the CA the server installed;
//   - a pip-download-shaped fetch with python3's standard library (PEP 503
//     simple index, then the wheel, its sha256 checked): pip itself is not
//     in the template;
//   - a credential injected for api.test reaches the fake upstream (its
//     checker) while the sandbox never sees it: env, files and responses.
//
// Needs SPACE_TEST_BASE=1 and the Debian "base" template in
// SPACE_TEMPLATE_CACHE.
func TestEgressRealTools(t *testing.T) {
	if os.Getenv("SPACE_TEST_BASE") == "" {
		t.Skip("set SPACE_TEST_BASE=1 (and SPACE_TEMPLATE_CACHE) to run against the Debian base template")
	}
	cache := testenv.TemplateCache()
	if _, err := os.Stat(filepath.Join(cache, "names", "base.json")); err != nil {
		t.Skipf("no base template in %s: %v", cache, err)
	}
	e := startOpts(t, startOptions{templateDir: cache})
	var cred struct{ ID, Placeholder string }
	if code := e.api(t, "POST", "/v1/credentials", map[string]any{"name": "tools api token", "secret": e.wan.canary, "host": "api.test",
		"prefix": "Bearer ", "methods": []string{"GET"}, "path_prefix": "/v1/", "env": "API_TOKEN"}, &cred); code != http.StatusCreated {
		t.Fatalf("create credential: %d", code)
	}
	// The registry as a preset would have it (read-only, download paths),
	// written in the JSON-object rule form.
	pol := map[string]any{"mode": "allowlist", "credentials": []string{cred.ID}, "allow": []any{
		map[string]any{"host": "registry.test", "ports": []int{443}, "methods": []string{"GET", "HEAD"}, "paths": []string{"/debian/*", "/simple/*", "/packages/*"}},
		"api.test:443",
	}}
	sb := e.create(t, pol)
	var rec struct {
		Network struct{ Allow []string } `json:"network"`
	}
	e.api(t, "GET", "/v1/sandboxes/"+sb.ID, nil, &rec)
	if got := strings.Join(rec.Network.Allow, "|"); got != "registry.test:443 GET,HEAD /debian/*,/simple/*,/packages/*|api.test:443" {
		t.Errorf("stored allow rules = %q", got)
	}
	var outputs []string
	root := func(script string) string {
		out := e.execAs(t, sb, "root", script)
		outputs = append(outputs, out)
		return out
	}

	t.Run("curl", func(t *testing.T) {
		if err := e.uploadCurl(t, sb); err != nil {
			t.Skipf("cannot provide curl: %v", err)
		}
		curl := "LD_LIBRARY_PATH=/opt/hostcurl/lib /opt/hostcurl/bin/curl -sS --max-time 10"
		out := root(curl + " https://registry.test/simple/space-demo/")
		if !strings.Contains(out, "space_demo-1.0-py3-none-any.whl") {
			t.Errorf("curl https://registry.test/simple/space-demo/: %s", out)
		}
		before := e.wan.count("api.test credential-ok GET /v1/echo/headers")
		out = root(curl + ` -H "Authorization: Bearer $API_TOKEN" https://api.test/v1/echo/headers`)
		if e.wan.count("api.test credential-ok GET /v1/echo/headers") != before+1 {
			t.Errorf("curl with the placeholder: the real credential did not reach api.test: %s", out)
		}
		if !strings.Contains(out, cred.Placeholder) || strings.Contains(out, e.wan.canary) {
			t.Errorf("api.test's echo, as the sandbox saw it, must show the placeholder only: %s", out)
		}
		// Not allowed by the rule: a write, and a path outside the lists.
		out = root(curl + ` -o /dev/null -w '%{http_code}\n' -X PUT --data x https://registry.test/debian/x; ` + curl + ` -o /dev/null -w '%{http_code}\n' https://registry.test/proxy/evil.test/`)
		if strings.Count(out, "403") != 2 || e.wan.sawEvent("edge registry PUT") || e.wan.sawEvent("relay-through") {
			t.Errorf("write / relay through the registry rule: %s", out)
		}
	})

	t.Run("apt-get", func(t *testing.T) {
		out := root(`set -e
echo 'deb [trusted=yes] https://registry.test/debian stable main' >/etc/apt/sources.list.d/space.list
O="-o Dir::Etc::SourceList=/etc/apt/sources.list.d/space.list -o Dir::Etc::SourceParts=/nonexistent -o Acquire::Retries=0"
apt-get $O update 2>&1
cd /tmp && apt-get $O download space-demo 2>&1
dpkg-deb -f /tmp/space-demo_1.0_all.deb Package Version
echo APT-DONE`)
		if !strings.Contains(out, "APT-DONE") || !strings.Contains(out, "Package: space-demo") {
			t.Errorf("apt-get update/download through the gateway: %s", out)
		}
		for _, p := range []string{"/debian/dists/stable/Release", "/debian/pool/main/s/space-demo/space-demo_1.0_all.deb"} {
			if !e.wan.sawEvent("GET registry.test " + p) {
				t.Errorf("the registry never served %s", p)
			}
		}
	})

	t.Run("pip-download", func(t *testing.T) {
		script := `import hashlib, re, sys, urllib.request, zipfile, io
base = "https://registry.test"
index = urllib.request.urlopen(base + "/simple/space-demo/", timeout=10).read().decode()
href = re.search(r'href="([^"#]+)#sha256=([0-9a-f]+)"', index)
whl = urllib.request.urlopen(base + href.group(1), timeout=10).read()
assert hashlib.sha256(whl).hexdigest() == href.group(2), "sha256 mismatch"
meta = zipfile.ZipFile(io.BytesIO(whl)).read("space_demo-1.0.dist-info/METADATA").decode()
open("/tmp/" + href.group(1).rsplit("/", 1)[1], "wb").write(whl)
print("WHEEL-OK", meta.splitlines()[1])
`
		out := root("python3 -c '" + strings.ReplaceAll(script, "'", `'"'"'`) + "' 2>&1")
		if !strings.Contains(out, "WHEEL-OK Name: space-demo") {
			t.Errorf("pip-style download through the gateway: %s", out)
		}
	})

	t.Run("secret-never-in-sandbox", func(t *testing.T) {
		out := root(`env; echo ---; grep -rasoh 'space-canary-[0-9a-f]*' / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev 2>/dev/null | head; echo END`)
		if !strings.Contains(out, "API_TOKEN="+cred.Placeholder) || !strings.Contains(out, "END") {
			t.Errorf("sandbox env: %s", out)
		}
		for _, o := range outputs {
			for _, enc := range encodings(e.wan.canary) {
				if strings.Contains(o, enc) {
					t.Errorf("the credential (or an encoding of it) reached the sandbox: %s", o)
				}
			}
		}
		if e.wan.attackerSaw(e.wan.canary) || e.wan.sawEvent(e.wan.canary) {
			t.Errorf("the credential reached a fake server's log")
		}
	})
}

// execAs runs a shell script in the sandbox as user and returns its
// stdout and stderr.
func (e *env) execAs(t *testing.T, sb sbx, user, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	body, _ := json.Marshal(map[string]any{"argv": []string{"/bin/sh", "-c", script}, "user": user, "cwd": "/"})
	req, _ := http.NewRequestWithContext(ctx, "POST", sb.DataURL+"/v1/sandboxes/"+url.PathEscape(sb.ID)+"/commands", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("start command: %v", err)
	}
	var cmd struct{ ID string }
	json.NewDecoder(resp.Body).Decode(&cmd)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("start command: %d", resp.StatusCode)
	}
	var out bytes.Buffer
	res, err := e.cl.Follow(ctx, sb.Sandbox, cmd.ID, func(b []byte) { out.Write(b) })
	if err != nil {
		t.Fatalf("command: %v", err)
	}
	s := strings.TrimSpace(out.String() + string(res.Stderr))
	t.Logf("[%s] %s\n-> %s", user, script, s)
	return s
}

// uploadCurl puts the host's curl and every shared library it links (as
// ldd resolves them) under /opt/hostcurl in the sandbox, through the
// agent's file API, as root (/opt is root's).
func (e *env) uploadCurl(t *testing.T, sb sbx) error {
	bin, err := exec.LookPath("curl")
	if err != nil {
		return err
	}
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return fmt.Errorf("ldd curl: %w", err)
	}
	files := map[string]string{"/opt/hostcurl/bin/curl": bin}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/") {
			files["/opt/hostcurl/lib/"+filepath.Base(f[0])] = f[2]
		}
	}
	for dst, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "PUT", sb.DataURL+"/v1/sandboxes/"+url.PathEscape(sb.ID)+"/files?user=root&mode=0755&path="+url.QueryEscape(dst), bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+sb.Token)
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("upload %s: HTTP %d", dst, resp.StatusCode)
		}
	}
	return nil
}
