package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

// A refusal is also a warn record of the operational log (cross_project
// when another project owns the object); other audit events are not.
func TestAlsoWarn(t *testing.T) {
	var auditBuf, ops bytes.Buffer
	l := New(&auditBuf)
	l.AlsoWarn(slog.New(slog.NewJSONHandler(&ops, nil)))
	ctx := WithRequestID(context.Background(), "req-1")
	l.Record(ctx, Event{Action: "GET /v1/sandboxes/{id}", Outcome: "denied", ProjectID: "p2", KeyID: "k2", Kind: "sandbox",
		Target: "sbx-1", Owner: "p1", Reason: "object of another project"})
	l.Record(ctx, Event{Action: "key.create", Outcome: "succeeded", ProjectID: "p1"})
	lines := strings.Split(strings.TrimSpace(ops.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("operational records: %q", lines)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"level": "WARN", "msg": "request refused", "project": "p2", "key_id": "k2", "owner": "p1",
		"target": "sbx-1", "cross_project": true, "request_id": "req-1", "action": "GET /v1/sandboxes/{id}"} {
		if m[k] != want {
			t.Errorf("%s = %v, want %v (%v)", k, m[k], want, m)
		}
	}
	if n := strings.Count(auditBuf.String(), "\n"); n != 2 {
		t.Errorf("the audit log keeps both events: %d lines", n)
	}
}
