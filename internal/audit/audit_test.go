package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRecord(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf)
	ctx := WithRequestID(context.Background(), "req-1")
	l.Record(ctx, Event{Action: "sandbox.get", Outcome: "denied", ProjectID: "p2", KeyID: "k", Kind: "sandbox", Target: "sbx-1", Owner: "p1"})
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("%v: %q", err, buf.String())
	}
	for k, want := range map[string]any{"msg": "audit", "action": "sandbox.get", "outcome": "denied", "project": "p2", "owner": "p1", "request_id": "req-1", "admin": false} {
		if m[k] != want {
			t.Errorf("%s = %v, want %v", k, m[k], want)
		}
	}
	var nilLog *Log
	nilLog.Record(ctx, Event{}) // a nil log discards
}

func TestOpenPrivate(t *testing.T) {
	p := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	l.Record(context.Background(), Event{Action: "key.create", Outcome: "succeeded"})
	l.Close()
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v", fi.Mode(), err)
	}
	b, _ := os.ReadFile(p)
	if !strings.Contains(string(b), `"action":"key.create"`) {
		t.Fatalf("log: %q", b)
	}
}

func TestRequestIDFrom(t *testing.T) {
	if RequestIDFrom("abc-1") != "abc-1" {
		t.Error("a sane client id is kept")
	}
	for _, bad := range []string{"", "a b", strings.Repeat("x", 65), "x\n"} {
		if got := RequestIDFrom(bad); !strings.HasPrefix(got, "req-") || got == bad {
			t.Errorf("%q -> %q", bad, got)
		}
	}
}
