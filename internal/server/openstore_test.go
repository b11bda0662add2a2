package server

import (
	"context"
	"testing"
	"time"
)

// TestOpenStoreFailsWithNilStore: a database that does not answer gives
// an error and a nil store, which the server's cleanup skips. A nil
// *postgres.Store inside the interface made New panic in closeAll (seen on
// Kubernetes, the servers started before PostgreSQL).
func TestOpenStoreFailsWithNilStore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := OpenStore(ctx, "postgres://space@127.0.0.1:1/space?sslmode=disable&connect_timeout=5", t.TempDir(), "n1", nil)
	if err == nil {
		t.Fatal("OpenStore of a closed port succeeded")
	}
	if st != nil {
		t.Fatalf("OpenStore returned the store %#v with its error %v", st, err)
	}
}
