package multinode

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/store/postgres/pgtest"
	"github.com/space-sandbox/space/test/testenv"
)

// TestServerSnapshotStoreOutlivesDataDir runs one `space server` (its
// in-process node, PostgreSQL) with `--snapshot-store dir:…`: a sandbox is
// hibernated, the server stops and comes back with an empty data dir (a
// replaced disk), and the resume restores the sandbox's files from the
// shared directory store.
func TestServerSnapshotStoreOutlivesDataDir(t *testing.T) {
	if os.Getenv(pgtest.EnvDSN) == "" {
		t.Skipf("needs PostgreSQL: set %s (export %s=$(bash scripts/postgres.sh))", pgtest.EnvDSN, pgtest.EnvDSN)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (the namespace driver)")
	}
	dsn := pgtest.FreshDSN(t)
	env, err := testenv.New("space-snapstore")
	if err != nil {
		if env != nil {
			env.Remove()
		}
		t.Fatal(err)
	}
	shared := filepath.Join(env.Work, "shared-snapshots")
	env.Args = []string{"--store", dsn, "--node-name", "solo", "--builtins", "minimal", "--snapshot-store", "dir:" + shared}
	dataDirs := []string{env.DataDir}
	t.Cleanup(func() {
		env.Stop()
		for _, d := range dataDirs {
			env.DataDir = d
			env.RemoveCgroupBase()
		}
		if t.Failed() {
			t.Logf("server log:\n%s", env.LogTail(6000))
			return
		}
		env.Remove()
	})
	if err := env.Start(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(env.Bin, "keys", "create", "--store", dsn, "--project", "p1").Output()
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	key := strings.TrimSpace(string(out))
	if err := env.WaitTemplate(key, "minimal", 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	hdr := map[string]string{"X-API-Key": key}
	call := func(method, path string, body any) map[string]any {
		t.Helper()
		st, m, err := testenv.DoJSON(method, env.Ctrl+path, hdr, body)
		if err != nil || st/100 != 2 {
			t.Fatalf("%s %s: %d %v %v", method, path, st, m, err)
		}
		return m
	}
	wait := func(m map[string]any) {
		t.Helper()
		id := opID(m)
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
			op := call("GET", "/v1/operations/"+id+"?wait=5s", nil)
			switch op["state"] {
			case "succeeded":
				return
			case "failed", "cancelled":
				t.Fatalf("operation %s: %v", id, op)
			}
		}
		t.Fatalf("operation %s not done", id)
	}
	m := call("POST", "/v1/sandboxes", map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 32 << 20}})
	id := m["sandbox"].(map[string]any)["id"].(string)
	wait(m)
	sess := call("POST", "/v1/sandboxes/"+id+"/session", nil)
	if out, code, err := exec1(sess["data_url"].(string), sess["token"].(string), id, "sh", "-c", "mkdir -p /tmp && echo outlives > /tmp/o"); err != nil || code != 0 {
		t.Fatalf("write: %q %d %v", out, code, err)
	}
	wait(call("POST", "/v1/sandboxes/"+id+"/hibernate", nil))
	if chunks, _ := filepath.Glob(filepath.Join(shared, "chunks", "*", "*")); len(chunks) == 0 {
		t.Fatal("no chunk in the shared store after the hibernation")
	}
	if manifests, _ := filepath.Glob(filepath.Join(shared, "manifests", "*")); len(manifests) == 0 {
		t.Fatal("no manifest in the shared store after the hibernation")
	}

	// The disk is replaced: same node name, empty data dir.
	env.Stop()
	old := env.DataDir
	env.DataDir = filepath.Join(env.Work, "data-replaced")
	dataDirs = append(dataDirs, env.DataDir)
	if err := os.RemoveAll(filepath.Join(old, "snapshots")); err != nil {
		t.Fatal(err)
	}
	if err := env.Start(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	wait(call("POST", "/v1/sandboxes/"+id+"/resume", nil))
	t.Logf("resumed from the shared store with an empty data dir in %v", time.Since(t0).Round(time.Millisecond))
	sess = call("POST", "/v1/sandboxes/"+id+"/session", nil)
	if out, code, err := exec1(sess["data_url"].(string), sess["token"].(string), id, "cat", "/tmp/o"); err != nil || code != 0 || out != "outlives\n" {
		t.Fatalf("after the resume: %q %d %v", out, code, err)
	}
	wait(call("DELETE", "/v1/sandboxes/"+id, nil))
}
