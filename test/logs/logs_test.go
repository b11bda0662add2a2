// Package logs reads the JSON log of a real `space server --log-format
// json` and checks one record per operational event: the access log of the
// control API and of the data plane (method, pattern, status, bytes,
// duration, request id, project, key id or sandbox), the request id carried
// from an API request into its operation's record, a command killed by the
// OOM killer, a refused cross-project request, an operation interrupted by
// a stop (failed at the next start), and the shutdown's beginning and end.
// It needs root (namespace driver).
package logs

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/sqlite"
	"github.com/space-sandbox/space/test/testenv"
)

type record map[string]any

// records parses the server log; every line must be a JSON object.
func records(t *testing.T, s *testenv.Server) []record {
	t.Helper()
	raw, err := os.ReadFile(s.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	var out []record
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if line == "" {
			continue
		}
		var r record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("a log line is not a JSON object: %q: %v", line, err)
		}
		if r["time"] == nil || r["level"] == nil || r["msg"] == nil {
			t.Fatalf("a record without time, level or msg: %v", r)
		}
		out = append(out, r)
	}
	return out
}

// wait returns the first record with msg that matches every field in want,
// waiting up to 20 s for it to be written.
func wait(t *testing.T, s *testenv.Server, msg string, want record) record {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, r := range records(t, s) {
			if r["msg"] != msg {
				continue
			}
			ok := true
			for k, v := range want {
				if fmt.Sprint(r[k]) != fmt.Sprint(v) {
					ok = false
					break
				}
			}
			if ok {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q record with %v in the log:\n%s", msg, want, s.LogTail(8000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func call(t *testing.T, method, url string, hdr map[string]string, body any) (int, map[string]any) {
	t.Helper()
	st, m, err := testenv.DoJSON(method, url, hdr, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return st, m
}

func waitOp(t *testing.T, s *testenv.Server, key, id string) map[string]any {
	t.Helper()
	for i := 0; i < 10; i++ {
		st, m := call(t, "GET", s.Ctrl+"/v1/operations/"+id+"?wait=30s", map[string]string{"X-API-Key": key}, nil)
		if st != 200 {
			t.Fatalf("operation %s: %d %v", id, st, m)
		}
		if core.OpState(fmt.Sprint(m["state"])).Done() {
			return m
		}
	}
	t.Fatalf("operation %s not done", id)
	return nil
}

// exitOf follows a command's events until its exit event.
func exitOf(t *testing.T, url, token string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	typ := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			typ = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && typ == "exit":
			var ex map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ex); err != nil {
				t.Fatalf("exit event: %v", err)
			}
			return ex
		}
	}
	t.Fatalf("no exit event: %v", sc.Err())
	return nil
}

func TestLogEvents(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespace driver)")
	}
	s, err := testenv.New("spacelogs")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Remove()
	s.Args = []string{"--builtins", "minimal", "--log-format", "json", "--audit-log", filepath.Join(s.Work, "audit.log")}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { s.Stop(); s.RemoveCgroupBase() }()
	keyA, err := s.CreateKey("p1")
	if err != nil {
		t.Fatal(err)
	}
	keyB, err := s.CreateKey("p2")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WaitTemplate(keyA, "minimal", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	keyAID := strings.SplitN(strings.TrimPrefix(keyA, "space_"), "_", 2)[0]

	// Control-plane access record; the request id reaches the operation's.
	st, m := call(t, "POST", s.Ctrl+"/v1/sandboxes", map[string]string{"X-API-Key": keyA, "X-Request-Id": "req-logs-create"},
		map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 64 << 20}})
	if st != 202 {
		t.Fatalf("create: %d %v", st, m)
	}
	sbID := m["sandbox"].(map[string]any)["id"].(string)
	sess := m["session"].(map[string]any)
	token, dataURL := sess["token"].(string), sess["data_url"].(string)
	opID := m["operation"].(map[string]any)["id"].(string)
	if done := waitOp(t, s, keyA, opID); done["state"] != "succeeded" {
		t.Fatalf("create operation: %v", done)
	}
	acc := wait(t, s, "http request", record{"plane": "control", "method": "POST", "pattern": "POST /v1/sandboxes", "status": 202,
		"request_id": "req-logs-create", "project": "p1", "key_id": keyAID})
	if b, _ := acc["bytes"].(float64); b <= 0 {
		t.Errorf("access record without the response size: %v", acc)
	}
	if _, ok := acc["duration_ms"].(float64); !ok {
		t.Errorf("access record without duration_ms: %v", acc)
	}
	wait(t, s, "operation ended", record{"operation": opID, "kind": "sandbox.create", "target": sbID, "state": "succeeded",
		"request_id": "req-logs-create", "project": "p1"})

	// Data-plane access record, and the OOM kill of a memory hog.
	st, m = call(t, "POST", dataURL+"/v1/sandboxes/"+sbID+"/commands", map[string]string{"Authorization": "Bearer " + token, "X-Request-Id": "req-logs-hog"},
		map[string]any{"argv": []string{"sh", "-c", `awk 'BEGIN{s="x"; while(1){s=s s}}'`}, "user": "root"})
	if st != 201 {
		t.Fatalf("start command: %d %v", st, m)
	}
	cid := m["id"].(string)
	wait(t, s, "http request", record{"plane": "data", "method": "POST", "pattern": "POST /v1/sandboxes/{id}/commands", "status": 201,
		"request_id": "req-logs-hog", "project": "p1", "sandbox": sbID})
	if ex := exitOf(t, dataURL+"/v1/sandboxes/"+sbID+"/commands/"+cid+"/events", token); ex["oom_killed"] != true {
		t.Fatalf("memory hog exit: %v, want oom_killed", ex)
	}
	oom := wait(t, s, "command killed by the OOM killer", record{"sandbox": sbID, "command": cid, "program": "sh", "level": "WARN"})
	t.Logf("OOM record: %v", oom)

	// A refused cross-project request: p2 asks for p1's sandbox.
	if st, _ := call(t, "GET", s.Ctrl+"/v1/sandboxes/"+sbID, map[string]string{"X-API-Key": keyB, "X-Request-Id": "req-logs-cross"}, nil); st != 404 {
		t.Fatalf("cross-project get: %d, want 404", st)
	}
	wait(t, s, "request refused", record{"level": "WARN", "project": "p2", "owner": "p1", "target": sbID, "cross_project": true,
		"request_id": "req-logs-cross", "outcome": "denied"})
	wait(t, s, "http request", record{"plane": "control", "pattern": "GET /v1/sandboxes/{id}", "status": 404, "project": "p2", "request_id": "req-logs-cross"})

	// Shutdown: its beginning and end, with the sandbox it leaves running.
	s.Stop()
	wait(t, s, "shutdown begun", record{"process": "server", "sandboxes_running": 1})
	wait(t, s, "shutdown complete", record{"process": "server", "sandboxes_left": 1, "operations_left": 0})

	// An operation left running (as by a crash) is failed at the next
	// start, one record each.
	store, err := sqlite.Open(context.Background(), filepath.Join(s.DataDir, "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	stuck := core.Operation{ID: core.NewID("op-"), ProjectID: "p1", Kind: "template.build", Target: "never-built", State: core.OpRunning,
		CreatedAt: now, UpdatedAt: now}
	if _, _, err := store.CreateOperation(context.Background(), stuck, ""); err != nil {
		t.Fatal(err)
	}
	store.Close()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	wait(t, s, "operation interrupted", record{"operation": stuck.ID, "kind": "template.build", "target": "never-built", "level": "WARN"})
	if done := waitOp(t, s, keyA, stuck.ID); done["state"] != "failed" {
		t.Fatalf("interrupted operation: %v", done)
	}
	st, m = call(t, "DELETE", s.Ctrl+"/v1/sandboxes/"+sbID, map[string]string{"X-API-Key": keyA}, nil)
	if st != 202 {
		t.Fatalf("delete: %d %v", st, m)
	}
	waitOp(t, s, keyA, m["operation"].(map[string]any)["id"].(string))
	// Every line of the whole run was a JSON record (records checks).
	t.Logf("%d records", len(records(t, s)))
}
