// Package replicas runs two `space server` replicas on one PostgreSQL
// database (each with its own data dir and in-process node) and checks that
// they work together: both list every sandbox, lifecycle events published by
// one reach SSE followers and long-polls on the other (LISTEN/NOTIFY), and a
// replica restarting leaves the other's sandboxes and operations alone.
package replicas

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/store/postgres/pgtest"
	"github.com/space-sandbox/space/test/testenv"
)

func start(t *testing.T, prefix, dsn string) *testenv.Server {
	t.Helper()
	s, err := testenv.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(); s.RemoveCgroupBase(); s.Remove() })
	s.Args = []string{"--store", dsn, "--builtins", "minimal"}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	return s
}

func call(t *testing.T, s *testenv.Server, method, path, key string, body any) map[string]any {
	t.Helper()
	st, m, err := testenv.DoJSON(method, s.Ctrl+path, map[string]string{"X-API-Key": key}, body)
	if err != nil || st/100 != 2 {
		t.Fatalf("%s %s on %s: %d %v %v", method, path, s.Ctrl, st, m, err)
	}
	return m
}

func waitOp(t *testing.T, s *testenv.Server, key, id string) map[string]any {
	t.Helper()
	for i := 0; i < 10; i++ {
		m := call(t, s, "GET", "/v1/operations/"+id+"?wait=30s", key, nil)
		if st := m["state"]; st == "succeeded" || st == "failed" || st == "cancelled" {
			return m
		}
	}
	t.Fatalf("operation %s not done", id)
	return nil
}

// follow streams /v1/events of s after lastID: (type, data, id) of each event.
func follow(t *testing.T, s *testenv.Server, key, lastID string) <-chan [3]any {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", s.Ctrl+"/v1/events", nil)
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Last-Event-ID", lastID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("events on %s: %v %v", s.Ctrl, resp, err)
	}
	out := make(chan [3]any, 256)
	go func() {
		defer resp.Body.Close()
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		typ, id := "", ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "id: "):
				id = line[4:]
			case strings.HasPrefix(line, "event: "):
				typ = line[7:]
			case strings.HasPrefix(line, "data: "):
				var d map[string]any
				if json.Unmarshal([]byte(line[6:]), &d) == nil {
					out <- [3]any{typ, d, id}
				}
			}
		}
	}()
	return out
}

// states collects sandbox.state events of id from ch until want are seen,
// and returns the last event id.
// The limit is well under the SSE handler's 15 s re-read, so only a
// cross-replica wake-up (NOTIFY) can deliver them in time.
func states(t *testing.T, ch <-chan [3]any, id string, want ...string) string {
	t.Helper()
	var got []string
	last := ""
	timeout := time.After(10 * time.Second)
	for len(got) < len(want) {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("event stream ended; got %v", got)
			}
			last = ev[2].(string)
			if ev[0] != "sandbox.state" {
				continue
			}
			data, _ := ev[1].(map[string]any)["data"].(map[string]any)
			if data["id"] == id {
				got = append(got, data["state"].(string))
			}
		case <-timeout:
			t.Fatalf("sandbox.state events for %s on the other replica: got %v, want %v", id, got, want)
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("sandbox.state events %v, want %v", got, want)
	}
	return last
}

func listIDs(t *testing.T, s *testenv.Server, key string) map[string]string {
	t.Helper()
	m := call(t, s, "GET", "/v1/sandboxes", key, nil)
	out := map[string]string{}
	for _, x := range m["sandboxes"].([]any) {
		sb := x.(map[string]any)
		out[sb["id"].(string)] = sb["state"].(string)
	}
	return out
}

func TestTwoReplicas(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (the namespace driver)")
	}
	dsn := pgtest.FreshDSN(t)
	a := start(t, "space-replica-a", dsn)
	b := start(t, "space-replica-b", dsn)
	out, err := exec.Command(a.Bin, "keys", "create", "--store", dsn, "--project", "p1").Output()
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	key := strings.TrimSpace(string(out))
	for _, s := range []*testenv.Server{a, b} {
		if err := s.WaitTemplate(key, "minimal", 5*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	onB := follow(t, b, key, "0")
	time.Sleep(200 * time.Millisecond)

	// Created on A; B's follower sees it come up, B's long-poll sees the
	// operation finish, B's list has it.
	m := call(t, a, "POST", "/v1/sandboxes", key, map[string]any{"template": "minimal"})
	id := m["sandbox"].(map[string]any)["id"].(string)
	opID := m["operation"].(map[string]any)["id"].(string)
	last := states(t, onB, id, "creating", "running")
	if done := waitOp(t, b, key, opID); done["state"] != "succeeded" {
		t.Fatalf("create operation seen from B: %v", done)
	}
	for _, s := range []*testenv.Server{a, b} {
		if got := listIDs(t, s, key)[id]; got != "running" {
			t.Fatalf("%s lists %s as %q", s.Ctrl, id, got)
		}
	}
	// The sandbox works on A's node, through the data URL its session names.
	sess := m["session"].(map[string]any)
	if !strings.HasPrefix(sess["data_url"].(string), a.Data) {
		t.Fatalf("session data_url %v, want A's %s", sess["data_url"], a.Data)
	}

	// Restarting B must not fail A's work or mark A's sandbox lost.
	b.Stop()
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	if got := listIDs(t, b, key)[id]; got != "running" {
		t.Fatalf("after B restarted, %s is %q (B must leave A's sandboxes alone); B log:\n%s", id, got, b.LogTail(4000))
	}
	onB = follow(t, b, key, last)
	time.Sleep(200 * time.Millisecond)

	// B cannot act on A's sandbox: it answers 409 instead of marking it
	// deleted while it keeps running on A.
	if st, m, _ := testenv.DoJSON("DELETE", b.Ctrl+"/v1/sandboxes/"+id, map[string]string{"X-API-Key": key}, nil); st != 409 {
		t.Fatalf("DELETE of A's sandbox on B: %d %v, want 409", st, m)
	}
	if got := listIDs(t, a, key)[id]; got != "running" {
		t.Fatalf("after a refused delete on B, %s is %q", id, got)
	}
	// Deleted on A: a long-poll on B returns as soon as the operation ends,
	// and B's follower sees the sandbox go.
	d := call(t, a, "DELETE", "/v1/sandboxes/"+id, key, nil)
	t0 := time.Now()
	if done := waitOp(t, b, key, d["operation"].(map[string]any)["id"].(string)); done["state"] != "succeeded" {
		t.Fatalf("delete operation seen from B: %v", done)
	}
	if el := time.Since(t0); el > 10*time.Second {
		t.Fatalf("long-poll on B took %v: not woken by A's events", el)
	}
	states(t, onB, id, "deleting", "deleted")
	if _, ok := listIDs(t, b, key)[id]; ok {
		t.Fatalf("B still lists deleted %s", id)
	}
}
