package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// testCredentials checks core.CredentialStore: insert, the per-project
// bound (also under concurrent inserts), project scoping, paging, delete
// and the conditional rewrap.
func testCredentials(t *testing.T, st core.Store) {
	cs, ok := st.(core.CredentialStore)
	if !ok {
		t.Skip("the store keeps no credentials")
	}
	ctx := context.Background()
	rec := func(project, id string) core.SealedCredential {
		return core.SealedCredential{
			Credential: core.Credential{ID: id, ProjectID: project, Name: "n " + id, Host: "api.test", Port: 443, Header: "Authorization",
				Prefix: "Bearer ", Methods: []string{"GET"}, PathPrefix: "/v1/", Env: "TOKEN", Placeholder: "space-cred-" + id,
				CreatedAt: time.Unix(1700000000, 0).UTC()},
			KeyID: "k1", WrappedKey: []byte("wrapped-" + id), Sealed: []byte{0, 1, 2, 0xff},
		}
	}
	a := rec("p1", "cred-000000000000000a")
	if err := cs.InsertCredential(ctx, a, 3); err != nil {
		t.Fatal(err)
	}
	if err := cs.InsertCredential(ctx, a, 3); !errors.Is(err, core.ErrConflict) {
		t.Fatalf("duplicate id: %v", err)
	}
	got, err := cs.GetCredentialRecord(ctx, "p1", a.Credential.ID)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got.Credential) != fmt.Sprint(a.Credential) || got.KeyID != "k1" || !bytes.Equal(got.WrappedKey, a.WrappedKey) || !bytes.Equal(got.Sealed, a.Sealed) {
		t.Fatalf("read back %+v, want %+v", got, a)
	}
	if _, err := cs.GetCredentialRecord(ctx, "p2", a.Credential.ID); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("another project read it: %v", err)
	}
	if _, err := cs.GetCredentialRecord(ctx, "", a.Credential.ID); err != nil {
		t.Fatalf("unscoped read: %v", err)
	}
	// The bound holds under concurrent inserts (3 per project: 2 more fit).
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = cs.InsertCredential(ctx, rec("p1", fmt.Sprintf("cred-00000000000001%02d", i)), 3)
		}(i)
	}
	wg.Wait()
	okN, exhausted := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			okN++
		case errors.Is(err, core.ErrExhausted):
			exhausted++
		default:
			t.Fatalf("concurrent insert: %v", err)
		}
	}
	if okN != 2 || exhausted != 4 {
		t.Fatalf("concurrent inserts: %d stored, %d refused; want 2 and 4", okN, exhausted)
	}
	if err := cs.InsertCredential(ctx, rec("p2", "cred-000000000000000b"), 3); err != nil {
		t.Fatalf("another project's bound: %v", err)
	}
	// Paging, per project and across projects.
	l, err := cs.ListCredentialRecords(ctx, "p1", "", 2)
	if err != nil || len(l) != 2 || l[0].Credential.ID != a.Credential.ID {
		t.Fatalf("page 1: %v %v", l, err)
	}
	l2, err := cs.ListCredentialRecords(ctx, "p1", l[1].Credential.ID, 10)
	if err != nil || len(l2) != 1 {
		t.Fatalf("page 2: %v %v", l2, err)
	}
	all, err := cs.ListCredentialRecords(ctx, "", "", 100)
	if err != nil || len(all) != 4 {
		t.Fatalf("all: %d %v", len(all), err)
	}
	// Rewrap only from the key it is wrapped by.
	if ok, err := cs.RewrapCredential(ctx, a.Credential.ID, "k0", "k2", []byte("x")); err != nil || ok {
		t.Fatalf("rewrap from the wrong key: %v %v", ok, err)
	}
	if ok, err := cs.RewrapCredential(ctx, a.Credential.ID, "k1", "k2", []byte("new")); err != nil || !ok {
		t.Fatalf("rewrap: %v %v", ok, err)
	}
	got, _ = cs.GetCredentialRecord(ctx, "p1", a.Credential.ID)
	if got.KeyID != "k2" || string(got.WrappedKey) != "new" || !bytes.Equal(got.Sealed, a.Sealed) {
		t.Fatalf("after rewrap: %+v", got)
	}
	// Delete is scoped to the project.
	if err := cs.DeleteCredentialRecord(ctx, "p2", a.Credential.ID); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("another project deleted it: %v", err)
	}
	if err := cs.DeleteCredentialRecord(ctx, "p1", a.Credential.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.GetCredentialRecord(ctx, "", a.Credential.ID); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if err := cs.DeleteCredentialRecord(ctx, "p1", a.Credential.ID); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}
