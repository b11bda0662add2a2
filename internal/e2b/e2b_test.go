package e2b

import (
	"encoding/base64"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/agent"
	fspb "github.com/space-sandbox/space/internal/e2b/gen/filesystem"
)

func TestParseMetadataQuery(t *testing.T) {
	// What the SDK sends for {"a b": "c&d=e", "k": "v"}, after the HTTP
	// layer's own decoding of the query parameter.
	inner := url.Values{}
	inner.Set(url.QueryEscape("a b"), url.QueryEscape("c&d=e"))
	inner.Set("k", "v")
	got, err := parseMetadataQuery(inner.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"a b": "c&d=e", "k": "v"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"%zz", "novalue", "a=%zz", strings.Repeat("a", 9<<10)} {
		if _, err := parseMetadataQuery(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func FuzzParseMetadataQuery(f *testing.F) {
	f.Add("a%3Db%26c%3Dd")
	f.Add("%25")
	f.Fuzz(func(t *testing.T, s string) {
		md, err := parseMetadataQuery(s)
		if err == nil && len(md) > 64 {
			t.Fatalf("%d entries", len(md))
		}
	})
}

func TestResolvePath(t *testing.T) {
	for _, c := range []struct{ in, user, want string }{
		{"/a/../../etc/passwd", "", "/etc/passwd"},
		{"x.txt", "", "/home/user/x.txt"},
		{"x.txt", "root", "/root/x.txt"},
		{"~/d/", "alice", "/home/alice/d"},
		{"../../..", "", "/"},
	} {
		got, err := resolvePath(c.in, c.user)
		if err != nil || got != c.want {
			t.Errorf("resolvePath(%q, %q) = %q, %v; want %q", c.in, c.user, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "/a\x00b", "/" + strings.Repeat("a", 5000)} {
		if _, err := resolvePath(bad, ""); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func FuzzResolvePath(f *testing.F) {
	f.Add("/a/../b", "user")
	f.Fuzz(func(t *testing.T, p, user string) {
		got, err := resolvePath(p, user)
		if err == nil && (!strings.HasPrefix(got, "/") || strings.Contains(got, "/../")) {
			t.Fatalf("resolvePath(%q) = %q", p, got)
		}
	})
}

func TestSandboxIDOf(t *testing.T) {
	r := httptest.NewRequest("GET", "/health", nil)
	r.Header.Set("E2b-Sandbox-Id", "sbx-1")
	if got := sandboxIDOf(r); got != "sbx-1" {
		t.Fatalf("header: %q", got)
	}
	r = httptest.NewRequest("GET", "http://49983-sbx-0123456789abcdef.space.local:8080/health", nil)
	if got := sandboxIDOf(r); got != "sbx-0123456789abcdef" {
		t.Fatalf("host: %q", got)
	}
	r = httptest.NewRequest("GET", "http://127.0.0.1:8080/health", nil)
	if got := sandboxIDOf(r); got != "" {
		t.Fatalf("ip host: %q", got)
	}
}

func TestBasicUser(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("root:")))
	if u, ok := basicUser(r); !ok || u != "root" {
		t.Fatalf("got %q %v", u, ok)
	}
	for _, bad := range []string{"Bearer x", "Basic !!!", "Basic " + base64.StdEncoding.EncodeToString([]byte(":")),
		"Basic " + base64.StdEncoding.EncodeToString([]byte("../x:"))} {
		r.Header.Set("Authorization", bad)
		if u, ok := basicUser(r); ok {
			t.Errorf("%q: accepted as %q", bad, u)
		}
	}
}

func TestEndEvent(t *testing.T) {
	for _, c := range []struct {
		ex         agent.Exit
		code       int32
		exited     bool
		status     string
		wantErrMsg bool
	}{
		{agent.Exit{Code: 0}, 0, true, "exit status 0", false},
		{agent.Exit{Code: 2}, 2, true, "exit status 2", true},
		{agent.Exit{Code: -1, Signal: "SIGKILL"}, -1, false, "signal: killed", true},
		{agent.Exit{Code: -1, Signal: "SIGWINCH"}, -1, false, "signal: winch", true},
		{agent.Exit{Code: -1, Error: "exec failed"}, -1, true, "exec failed", true},
	} {
		end := endEvent(&c.ex).GetEnd()
		if end.ExitCode != c.code || end.Exited != c.exited || end.Status != c.status || (end.Error != nil) != c.wantErrMsg {
			t.Errorf("%+v: got %+v", c.ex, end)
		}
	}
}

func TestDiff(t *testing.T) {
	st := func(typ string, size, mtime int64, mode uint32) fileState {
		return fileState{info: agent.FileInfo{Type: typ, Size: size, ModTime: mtime, Mode: mode}, path: "/w/x"}
	}
	old := snapshot{"same": st("file", 1, 1, 0o644), "grow": st("file", 1, 1, 0o644), "chmod": st("file", 1, 1, 0o644), "gone": st("file", 1, 1, 0o644)}
	cur := snapshot{"same": st("file", 1, 1, 0o644), "grow": st("file", 2, 2, 0o644), "chmod": st("file", 1, 1, 0o600),
		"new": st("file", 3, 3, 0o644), "newdir": st("dir", 0, 3, 0o755)}
	var got []string
	for _, ev := range diff(old, cur, true) {
		got = append(got, ev.Name+":"+strings.TrimPrefix(ev.Type.String(), "EVENT_TYPE_"))
		if ev.Type != fspb.EventType_EVENT_TYPE_REMOVE && ev.Entry == nil {
			t.Errorf("%s: no entry", ev.Name)
		}
	}
	want := []string{"chmod:CHMOD", "grow:WRITE", "new:CREATE", "new:WRITE", "newdir:CREATE", "gone:REMOVE"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestRouting(t *testing.T) {
	for p, want := range map[string]bool{"/sandboxes": true, "/sandboxes/x/connect": true, "/v2/sandboxes": true,
		"/v1/sandboxes": false, "/sandboxesx": false, "/healthz": false} {
		if IsAPIPath(p) != want {
			t.Errorf("IsAPIPath(%q) != %v", p, want)
		}
	}
	for p, want := range map[string]bool{"/health": true, "/files": true, "/process.Process/Start": true,
		"/filesystem.Filesystem/Stat": true, "/v1/sandboxes/x/files": false, "/healthz": false} {
		if IsEnvdRequest(httptest.NewRequest("GET", p, nil)) != want {
			t.Errorf("IsEnvdRequest(%q) != %v", p, want)
		}
	}
}
