package integration

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestFilesAsUser: the data plane's file routes act as the user the
// request names (query parameter user), by default the sandbox's default
// user ("user" in minimal), with that user's permissions: what they write
// is that user's, and what a command of that user could not do (write into
// /root, 0700) they refuse with 403 permission_denied.
func TestFilesAsUser(t *testing.T) { filesAsUser(t, need(t)) }

// TestFilesAsUserGvisor: the same under gVisor (the agent's per-thread
// setresuid/setgroups run on the Sentry).
func TestFilesAsUserGvisor(t *testing.T) { filesAsUser(t, gvisorEnv(t)) }

func filesAsUser(t *testing.T, e *env) {
	sb := e.create(t, nil)
	defer sb.delete(t)
	owner := func(p string) string {
		t.Helper()
		out, ex := sb.sh(t, "stat -c %U:%G "+p)
		if ex.Code != 0 {
			t.Fatalf("stat %s: %+v %s", p, ex, out)
		}
		return strings.TrimSpace(out)
	}
	put := func(query, body string) (int, map[string]any) {
		t.Helper()
		st, m, err := doRaw(sb, "PUT", "/files?"+query, body)
		if err != nil {
			t.Fatalf("PUT %s: %v", query, err)
		}
		return st, m
	}
	errCode := func(m map[string]any) string {
		e, _ := m["error"].(map[string]any)
		c, _ := e["code"].(string)
		return c
	}

	// The default user.
	if st, m := put("path=/tmp/by-default/f.txt", "d"); st != 204 {
		t.Fatalf("upload as the default user: %d %v", st, m)
	}
	if o := owner("/tmp/by-default/f.txt"); o != "user:user" {
		t.Errorf("default user's file owned by %s", o)
	}
	if o := owner("/tmp/by-default"); o != "user:user" {
		t.Errorf("default user's new directory owned by %s", o)
	}
	if st, _, _ := sb.dp("POST", "/files/mkdir", map[string]any{"path": "/home/user/made"}); st != 204 {
		t.Errorf("mkdir in the default user's home: %d", st)
	} else if o := owner("/home/user/made"); o != "user:user" {
		t.Errorf("mkdir: owned by %s", o)
	}
	// root, when asked for.
	if st, m := put("path=/root/r.txt&user=root", "r"); st != 204 {
		t.Fatalf("upload as root into /root: %d %v", st, m)
	}
	if o := owner("/root/r.txt"); o != "root:root" {
		t.Errorf("root's file owned by %s", o)
	}
	// An unprivileged user cannot reach into /root, as its commands cannot.
	if out, _, ex := sb.run(t, map[string]any{"shell": "echo x > /root/cmd.txt", "user": "user"}); ex.Code == 0 {
		t.Fatalf("a command of user wrote into /root: %s", out)
	}
	for _, q := range []string{"path=/root/u.txt", "path=/root/u.txt&user=user", "path=/root/sub/u.txt&user=user"} {
		if st, m := put(q, "u"); st != 403 || errCode(m) != "permission_denied" {
			t.Errorf("PUT %s: %d %v, want 403 permission_denied", q, st, m)
		}
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/files?path=/root/r.txt"},
		{"GET", "/files/stat?path=/root/r.txt&user=user"},
		{"GET", "/files/list?path=/root"},
		{"DELETE", "/files?path=/root/r.txt"},
	} {
		if st, m, _ := sb.dp(c.method, c.path, nil); st != 403 || errCode(m) != "permission_denied" {
			t.Errorf("%s %s: %d %v, want 403 permission_denied", c.method, c.path, st, m)
		}
	}
	if st, m, _ := sb.dp("POST", "/files/mkdir?user=user", map[string]any{"path": "/root/d"}); st != 403 || errCode(m) != "permission_denied" {
		t.Errorf("mkdir in /root as user: %d %v", st, m)
	}
	if st, m := put("path=/home/user/mv.txt", "m"); st != 204 {
		t.Fatalf("upload into the default user's home: %d %v", st, m)
	}
	if st, m, _ := sb.dp("POST", "/files/move", map[string]any{"from": "/home/user/mv.txt", "to": "/root/mv.txt"}); st != 403 || errCode(m) != "permission_denied" {
		t.Errorf("move into /root as user: %d %v", st, m)
	}
	// Nothing got in; root can still read its file.
	if out, _ := sb.sh(t, "ls /root | tr '\\n' ' '"); strings.TrimSpace(out) != "r.txt" {
		t.Errorf("/root holds %q", out)
	}
	req, _ := newReq(sb, "GET", "/files?path=/root/r.txt&user=root")
	resp, err := httpc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "r" {
		t.Errorf("download as root: %d %q", resp.StatusCode, b)
	}
	if st, m := put("path=/tmp/x&user=nosuchuser", "x"); st != 400 || errCode(m) != "unknown_user" {
		t.Errorf("unknown user: %d %v", st, m)
	}
}
