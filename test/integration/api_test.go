package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestIdempotencyPaginationTimeout(t *testing.T) {
	e := need(t)
	body := map[string]any{"template": "minimal", "metadata": map[string]string{"suite": "api"}}
	hdr := map[string]string{"X-API-Key": e.key, "Idempotency-Key": "create-once-" + time.Now().Format("150405.000000")}
	st1, m1, _ := doJSON("POST", e.Ctrl+"/v1/sandboxes", hdr, body)
	st2, m2, _ := doJSON("POST", e.Ctrl+"/v1/sandboxes", hdr, body)
	if st1 != 202 || st2 != 202 {
		t.Fatalf("creates: %d %d", st1, st2)
	}
	op1 := m1["operation"].(map[string]any)["id"]
	if op1 != m2["operation"].(map[string]any)["id"] || m1["sandbox"].(map[string]any)["id"] != m2["sandbox"].(map[string]any)["id"] {
		t.Fatalf("same Idempotency-Key made two sandboxes: %v / %v", m1["sandbox"], m2["sandbox"])
	}
	e.waitOp(t, op1.(string))
	first := &sandbox{e: e, ID: m1["sandbox"].(map[string]any)["id"].(string)}
	defer first.delete(t)
	more := []*sandbox{e.create(t, map[string]any{"metadata": map[string]string{"suite": "api"}}),
		e.create(t, map[string]any{"metadata": map[string]string{"suite": "api"}})}
	for _, sb := range more {
		defer sb.delete(t)
	}
	// Pages of 2 walk all three exactly once.
	seen := map[string]bool{}
	token := ""
	for page := 0; page < 5; page++ {
		url := "/v1/sandboxes?metadata.suite=api&state=running&limit=2"
		if token != "" {
			url += "&page_token=" + token
		}
		st, m, _ := e.call("GET", url, e.key, nil)
		if st != 200 {
			t.Fatalf("list: %d %v", st, m)
		}
		for _, s := range m["sandboxes"].([]any) {
			id := s.(map[string]any)["id"].(string)
			if seen[id] {
				t.Fatalf("sandbox %s on two pages", id)
			}
			seen[id] = true
		}
		if token = m["next_page_token"].(string); token == "" {
			break
		}
	}
	if len(seen) != 3 {
		t.Fatalf("pagination saw %d sandboxes, want 3", len(seen))
	}
	// A sandbox past its timeout is removed by the server.
	short := e.create(t, map[string]any{"timeout_seconds": 1})
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, m, _ := e.call("GET", "/v1/sandboxes/"+short.ID, e.key, nil)
		if m["state"] == "deleted" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox not removed after its timeout: %v", m)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Setting a timeout of 0 keeps a sandbox alive.
	st, m, _ := e.call("POST", "/v1/sandboxes/"+first.ID+"/timeout", e.key, map[string]any{"timeout_seconds": 0})
	if st != 200 || m["expires_at"] != nil {
		t.Fatalf("timeout 0: %d %v", st, m)
	}
}

// sseEvents reads up to n events of the given type from an SSE URL.
func sseEvents(t *testing.T, url, key, lastID string, want func(typ string, data map[string]any) bool) chan map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("X-API-Key", key)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		cancel()
		t.Fatalf("sse %s: %v %v", url, resp, err)
	}
	out := make(chan map[string]any, 64)
	go func() {
		defer cancel()
		defer resp.Body.Close()
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		typ := ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				typ = line[7:]
			case strings.HasPrefix(line, "data: "):
				var d map[string]any
				if json.Unmarshal([]byte(line[6:]), &d) == nil && want(typ, d) {
					out <- d
				}
			}
		}
	}()
	return out
}

func TestLifecycleEventStreams(t *testing.T) {
	e := need(t)
	states := sseEvents(t, e.Ctrl+"/v1/events", e.key, "", func(typ string, d map[string]any) bool { return typ == "sandbox.state" })
	time.Sleep(100 * time.Millisecond)
	sb := e.create(t, nil)
	sb.delete(t)
	var got []string
	timeout := time.After(20 * time.Second)
	for len(got) < 4 {
		select {
		case ev, ok := <-states:
			if !ok {
				t.Fatalf("event stream ended; got %v", got)
			}
			data := ev["data"].(map[string]any)
			if data["id"] == sb.ID {
				got = append(got, data["state"].(string))
			}
		case <-timeout:
			t.Fatalf("lifecycle events for %s: got %v", sb.ID, got)
		}
	}
	if strings.Join(got, ",") != "creating,running,deleting,deleted" {
		t.Fatalf("lifecycle events %v", got)
	}
	// Another project's stream sees none of it.
	other := sseEvents(t, e.Ctrl+"/v1/events", e.key2, "0", func(string, map[string]any) bool { return true })
	select {
	case ev, ok := <-other:
		if ok {
			t.Fatalf("project p2 sees p1's event: %v", ev)
		}
	case <-time.After(500 * time.Millisecond):
	}
	// An operation's own stream ends with its final state.
	st, m, _ := e.call("POST", "/v1/sandboxes", e.key, map[string]any{"template": "minimal"})
	if st != 202 {
		t.Fatalf("create: %d", st)
	}
	opID := m["operation"].(map[string]any)["id"].(string)
	opEvents := sseEvents(t, e.Ctrl+"/v1/operations/"+opID+"/events", e.key, "", func(string, map[string]any) bool { return true })
	last := ""
	for ev := range opEvents {
		var op map[string]any
		raw, _ := json.Marshal(ev["data"])
		json.Unmarshal(raw, &op)
		last, _ = op["state"].(string)
	}
	if last != "succeeded" {
		t.Fatalf("operation stream ended in state %q", last)
	}
	(&sandbox{e: e, ID: m["sandbox"].(map[string]any)["id"].(string)}).delete(t)
}

func TestCLI(t *testing.T) {
	e := need(t)
	space := func(args ...string) (string, error) {
		cmd := exec.Command(e.Bin, args...)
		cmd.Env = append(cmd.Environ(), "SPACE_URL="+e.Ctrl, "SPACE_API_KEY="+e.key)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := space("sandbox", "create", "--template", "minimal", "--json")
	if err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	var created map[string]any
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &created); err != nil {
		t.Fatalf("create --json output %q: %v", out, err)
	}
	id, _ := created["id"].(string)
	if id == "" {
		if sb, ok := created["sandbox"].(map[string]any); ok {
			id, _ = sb["id"].(string)
		}
	}
	if id == "" {
		t.Fatalf("no id in %v", created)
	}
	out, err = space("sandbox", "exec", id, "--", "sh", "-c", "echo from-cli; exit 3")
	if !strings.Contains(out, "from-cli") {
		t.Fatalf("exec output %q", out)
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Fatalf("exec exit: %v", err)
	}
	if out, err = space("sandbox", "list"); err != nil || !strings.Contains(out, id) {
		t.Fatalf("list: %v\n%s", err, out)
	}
	if out, err = space("sandbox", "get", id, "--json"); err != nil || !strings.Contains(out, `"running"`) {
		t.Fatalf("get: %v\n%s", err, out)
	}
	if out, err = space("template", "list"); err != nil || !strings.Contains(out, "minimal") {
		t.Fatalf("template list: %v\n%s", err, out)
	}
	if out, err = space("sandbox", "rm", id); err != nil {
		t.Fatalf("rm: %v\n%s", err, out)
	}
	if out, err = space("keys", "list", "--data-dir", e.DataDir); err != nil || !strings.Contains(out, "p2") {
		t.Fatalf("keys list: %v\n%s", err, out)
	}
}
