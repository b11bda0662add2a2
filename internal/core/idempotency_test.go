package core_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/core"
)

func TestFingerprint(t *testing.T) {
	a := core.Fingerprint("sandbox.create", core.CreateRequest{Template: "x", Env: map[string]string{"A": "1", "B": "2"}})
	b := core.Fingerprint("sandbox.create", core.CreateRequest{Template: "x", Env: map[string]string{"B": "2", "A": "1"}})
	if a != b || len(a) != 64 {
		t.Fatalf("the same request, two fingerprints: %s %s", a, b)
	}
	for _, other := range []string{
		core.Fingerprint("sandbox.create", core.CreateRequest{Template: "y"}),
		core.Fingerprint("sandbox.fork", core.CreateRequest{Template: "x", Env: map[string]string{"A": "1", "B": "2"}}),
		core.Fingerprint("ab", "c"), // parts are length-prefixed:
		core.Fingerprint("a", "bc"), // these two must differ too
	} {
		if other == a {
			t.Fatalf("another request has the same fingerprint")
		}
	}
	if core.Fingerprint("ab", "c") == core.Fingerprint("a", "bc") {
		t.Fatal("parts run into each other")
	}
}

func TestOperationDocumentKeepsFingerprint(t *testing.T) {
	op := core.Operation{ID: "op-1", Kind: "k", Fingerprint: "fp"}
	doc, err := core.EncodeOperation(op)
	if err != nil {
		t.Fatal(err)
	}
	got, err := core.DecodeOperation(doc)
	if err != nil || got.Fingerprint != "fp" || got.ID != "op-1" {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	// Documents written before fingerprints decode with none, and replay.
	old, err := core.DecodeOperation([]byte(`{"id":"op-2","kind":"k"}`))
	if err != nil || old.Fingerprint != "" || core.CheckReplay(old, op) != nil {
		t.Fatalf("old document: %+v %v", old, err)
	}
	// Clients never see it.
	if raw, _ := json.Marshal(op); len(raw) == 0 || strings.Contains(string(raw), `"fp"`) {
		t.Fatalf("the API form of an operation shows its fingerprint: %s", raw)
	}
}

func TestSubmitIdempotencyKeyReuse(t *testing.T) {
	e, _, _ := newEngine(t)
	ctx := context.Background()
	runs := make(chan struct{}, 10)
	fn := func(context.Context, core.Progress) (any, error) { runs <- struct{}{}; return nil, nil }
	a, err := e.Submit(ctx, e.NewOperation("p", "sandbox.pause", "sbx-1"), "k", fn)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Submit(ctx, e.NewOperation("p", "sandbox.pause", "sbx-1"), "k", fn)
	if err != nil || b.ID != a.ID {
		t.Fatalf("the same request replays: %v %v", b.ID, err)
	}
	for _, op := range []core.Operation{
		e.NewOperation("p", "sandbox.pause", "sbx-2"),  // another target
		e.NewOperation("p", "sandbox.resume", "sbx-1"), // another kind
	} {
		if _, err := e.Submit(ctx, op, "k", fn); !errors.Is(err, core.ErrIdempotencyReused) || core.ErrorCode(err) != "idempotency_key_reused" {
			t.Fatalf("%s %s with a used key: %v", op.Kind, op.Target, err)
		}
	}
	withBody := e.NewOperation("p", "template.build", "t")
	withBody.Fingerprint = core.Fingerprint("body one")
	if _, err := e.Submit(ctx, withBody, "k2", fn); err != nil {
		t.Fatal(err)
	}
	withBody2 := e.NewOperation("p", "template.build", "t")
	withBody2.Fingerprint = core.Fingerprint("body two")
	if _, err := e.Submit(ctx, withBody2, "k2", fn); !errors.Is(err, core.ErrIdempotencyReused) {
		t.Fatalf("another body with a used key: %v", err)
	}
	e.Shutdown(ctx)
	if n := len(runs); n != 2 {
		t.Fatalf("work ran %d times, want 2", n)
	}
}
