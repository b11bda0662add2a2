package core_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/audit"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/logx"
)

type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) find(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.b.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not JSON: %q", sc.Text())
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// An operation's end is a record with the request id of the request that
// made it; an operation a crash left running is a warn record when
// Recover fails it.
func TestEngineLogsOperations(t *testing.T) {
	e, _, st := newEngine(t)
	var buf logBuf
	l, _ := logx.New(&buf, "json", "info")
	e.SetLogger(l)
	ctx := audit.WithRequestID(context.Background(), "req-00000000000000aa")
	op, err := e.Submit(ctx, e.NewOperation("p", "sandbox.create", "sbx-1"), "", func(ctx context.Context, _ core.Progress) (any, error) {
		if audit.RequestID(ctx) != "req-00000000000000aa" {
			t.Errorf("the work's context carries request id %q", audit.RequestID(ctx))
		}
		return nil, core.ErrConflict
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := e.Wait(context.Background(), "p", op.ID, 5*time.Second); got.State != core.OpFailed {
		t.Fatalf("operation: %+v", got)
	}
	var ended []map[string]any
	for i := 0; i < 100 && len(ended) == 0; i++ {
		ended = buf.find(t, "operation ended")
		time.Sleep(10 * time.Millisecond)
	}
	if len(ended) != 1 {
		t.Fatalf("operation ended records: %v", ended)
	}
	r := ended[0]
	for k, want := range map[string]any{"level": "WARN", "operation": op.ID, "kind": "sandbox.create", "target": "sbx-1", "project": "p",
		"state": "failed", "error_code": "conflict", "request_id": "req-00000000000000aa"} {
		if r[k] != want {
			t.Errorf("%s = %v, want %v (%v)", k, r[k], want, r)
		}
	}
	// A running operation left by a "crashed" process.
	stuck := e.NewOperation("p", "sandbox.delete", "sbx-2")
	stuck.State = core.OpRunning
	if _, _, err := st.CreateOperation(context.Background(), stuck, ""); err != nil {
		t.Fatal(err)
	}
	e2 := core.NewEngine(context.Background(), st, core.NewBroker(st, time.Now), time.Now, nil)
	e2.SetLogger(l)
	if _, err := e2.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	in := buf.find(t, "operation interrupted")
	if len(in) != 1 || in[0]["operation"] != stuck.ID || in[0]["level"] != "WARN" || in[0]["kind"] != "sandbox.delete" || in[0]["state"] != "running" {
		t.Fatalf("interrupted records: %v", in)
	}
}
