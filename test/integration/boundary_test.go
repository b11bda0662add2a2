package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// auditHas waits briefly for an audit event (a JSON line of the server's
// audit log) with every given field and returns whether one came.
func (e *env) auditHas(t *testing.T, fields map[string]string) bool {
	t.Helper()
	for i := 0; i < 50; i++ {
		b, _ := os.ReadFile(filepath.Join(e.DataDir, "audit.log"))
	line:
		for _, l := range strings.Split(string(b), "\n") {
			var ev map[string]any
			if json.Unmarshal([]byte(l), &ev) != nil {
				continue
			}
			for k, v := range fields {
				if s, _ := ev[k].(string); !strings.Contains(s, v) {
					continue line
				}
			}
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// TestBoundaryEdges is issue 22's item 4: an empty template name, a bad
// --max-output-bytes, audit events for data-plane refusals and a bounded
// /dev/shm (whole-MiB disk limits are in TestDiskQuota).
func TestBoundaryEdges(t *testing.T) {
	e := need(t)
	t.Run("empty template name", func(t *testing.T) {
		st, m, err := e.call("POST", "/v1/sandboxes", e.key, map[string]any{"template": ""})
		if err != nil || st != 400 || !strings.Contains(fmt.Sprint(m), "template must not be empty") {
			t.Fatalf("template \"\": %d %v %v, want 400", st, m, err)
		}
	})
	t.Run("max-output-bytes below the minimum", func(t *testing.T) {
		dir := t.TempDir()
		out, err := exec.Command(e.Bin, "server", "--max-output-bytes", "1M", "--data-dir", dir, "--run-dir", dir,
			"--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0", "--builtins", "").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "--max-output-bytes") || !strings.Contains(string(out), "minimum") {
			t.Fatalf("space server --max-output-bytes 1M: %v\n%s", err, out)
		}
	})
	a, b := e.create(t, nil), e.create(t, nil)
	defer a.delete(t)
	defer b.delete(t)
	t.Run("session token on another sandbox is audited", func(t *testing.T) {
		st, _, _ := doJSON("GET", a.Data+"/v1/sandboxes/"+b.ID+"/commands", map[string]string{"Authorization": "Bearer " + a.Token}, nil)
		if st != 404 {
			t.Fatalf("A's token on B: %d, want 404", st)
		}
		if !e.auditHas(t, map[string]string{"outcome": "denied", "target": b.ID, "reason": a.ID}) {
			t.Errorf("no audit event for A's token used on B")
		}
	})
	t.Run("port token on another sandbox is audited", func(t *testing.T) {
		st, m, err := e.call("POST", "/v1/sandboxes/"+a.ID+"/ports/8000/url", e.key, map[string]any{})
		if err != nil || st != 200 {
			t.Fatalf("signed URL: %d %v %v", st, m, err)
		}
		tok := strings.SplitN(m["path_url"].(string), "space_token=", 2)[1]
		resp, err := httpc.Get(b.Data + "/v1/sandboxes/" + b.ID + "/ports/8000/?space_token=" + tok)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Fatalf("A's port token on B: %d, want 404", resp.StatusCode)
		}
		if !e.auditHas(t, map[string]string{"action": "port forward", "outcome": "denied", "target": b.ID + ":8000"}) {
			t.Errorf("no audit event for A's port token used on B")
		}
	})
	t.Run("files 403 is audited", func(t *testing.T) {
		// /root is 0700: the default user may not list it.
		if st, m, _ := a.dp("GET", "/files/list?path=/root&user=user", nil); st != 403 {
			t.Fatalf("list /root as user: %d %v, want 403", st, m)
		}
		if !e.auditHas(t, map[string]string{"outcome": "denied", "target": a.ID, "reason": "permission_denied"}) {
			t.Errorf("no audit event for a files request refused with 403")
		}
	})
	t.Run("/dev/shm is bounded", func(t *testing.T) {
		out, ex := a.sh(t, "df -k /dev/shm | tail -1")
		f := strings.Fields(out)
		if ex.Code != 0 || len(f) < 2 {
			t.Fatalf("df /dev/shm: %+v %q", ex, out)
		}
		if f[1] != "65536" {
			t.Errorf("/dev/shm is %s KiB, want 65536 (64 MiB)", f[1])
		}
		small := e.create(t, map[string]any{"limits": map[string]any{"memory_bytes": 64 << 20}})
		defer small.delete(t)
		out, _ = small.sh(t, "df -k /dev/shm | tail -1")
		if f := strings.Fields(out); len(f) < 2 || f[1] != "32768" {
			t.Errorf("/dev/shm with a 64 MiB memory limit: %q, want 32768 KiB", out)
		}
	})
}
