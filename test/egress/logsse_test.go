package egress_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sseDecision is one "decision" event of the followed decision log.
type sseDecision struct {
	ID      uint64
	Name    string `json:"name"`
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
}

// followLog opens the decision log of sb as SSE (after Last-Event-ID
// lastID) and sends each decision on the returned channel until ctx ends.
func (e *env) followLog(t *testing.T, ctx context.Context, id string, lastID uint64) <-chan sseDecision {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+e.srv.Addr()+"/v1/sandboxes/"+id+"/network/log", nil)
	req.Header.Set("Authorization", "Bearer "+e.key)
	req.Header.Set("Accept", "text/event-stream")
	if lastID > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatUint(lastID, 10))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body.Close()
		t.Fatalf("follow log: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	ch := make(chan sseDecision, 64)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var d sseDecision
		var typ string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "id: "):
				d.ID, _ = strconv.ParseUint(line[4:], 10, 64)
			case strings.HasPrefix(line, "event: "):
				typ = line[7:]
			case strings.HasPrefix(line, "data: ") && typ == "decision":
				_ = json.Unmarshal([]byte(line[6:]), &d)
			case line == "" && typ != "":
				if typ == "decision" {
					select {
					case ch <- d:
					case <-ctx.Done():
						return
					}
				}
				d, typ = sseDecision{}, ""
			}
		}
	}()
	return ch
}

// decisionLogSSE: the decision log followed as SSE shows an allowed and a
// denied connection as they happen, in order, and resumes after
// Last-Event-ID without repeating one.
func decisionLogSSE(t *testing.T, e *env) {
	sb := e.create(t, map[string]any{"mode": "allowlist", "allow": []string{"registry.test:443,80"}})
	defer e.cl.Delete(context.Background(), sb.ID)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	live := e.followLog(t, ctx, sb.ID, 0)
	e.run(t, sb, "http", "registry.test:80", "registry.test", "/simple/")
	e.run(t, sb, "http", "attacker.test:80", "attacker.test", "/x")
	var got []sseDecision
	var allowed, denied bool
	for !(allowed && denied) {
		select {
		case d, ok := <-live:
			if !ok {
				t.Fatalf("stream ended; got %+v", got)
			}
			if len(got) > 0 && d.ID <= got[len(got)-1].ID {
				t.Fatalf("decision ids out of order: %+v after %+v", d, got[len(got)-1])
			}
			got = append(got, d)
			allowed = allowed || d.Verdict == "allow" && strings.HasPrefix(d.Name, "registry.test")
			denied = denied || d.Verdict == "deny" && strings.HasPrefix(d.Name, "attacker.test")
		case <-ctx.Done():
			t.Fatalf("no allowed and denied decision on the stream within 30 s; got %+v", got)
		}
	}
	// Resume after the first decision: the next one comes, not the first.
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	select {
	case d := <-e.followLog(t, rctx, sb.ID, got[0].ID):
		if d.ID != got[1].ID {
			t.Errorf("resume after %d gave %d, want %d", got[0].ID, d.ID, got[1].ID)
		}
	case <-rctx.Done():
		t.Error("resumed stream gave nothing")
	}
	t.Logf("%d decisions followed live", len(got))
}
