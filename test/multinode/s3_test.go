package multinode

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// sharedSnapshotStore serves an in-memory S3 bucket on loopback for the
// test's nodes (gofakes3) and returns their --snapshot-store; the nodes
// inherit the credentials from the environment.
func sharedSnapshotStore(t *testing.T) string {
	t.Helper()
	mem := s3mem.New()
	if err := mem.CreateBucket("space-snapshots"); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gofakes3.New(mem).Server(), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	// Closed after the processes stop (cleanups run last-registered first).
	t.Cleanup(func() { srv.Close() })
	t.Setenv("AWS_ACCESS_KEY_ID", "multinode")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "multinode-secret")
	return "s3://space-snapshots/cluster?endpoint=http://" + ln.Addr().String()
}
