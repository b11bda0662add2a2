package gvisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// An image records the host id range it was captured under; a restore
// under another base of the same size relaxes runsc's spec validation
// (the mapping differs by design), every other restore enforces it.
func TestRestoreArgsIDMap(t *testing.T) {
	d := &Driver{opts: Options{UIDBase: 200000, UIDCount: 65536, Logf: t.Logf}}
	const relax = "--restore-spec-validation=warning"
	img := t.TempDir()
	if args := d.restoreArgs(img, "/b", "sbx-0000000000000001", 200000, "/b/runsc.pid"); slices.Contains(args, relax) || args[0] != "restore" {
		t.Fatalf("an image without a recorded map: %v", args)
	} else if i := slices.Index(args, "-pid-file"); i < 0 || i+1 >= len(args) || args[i+1] != "/b/runsc.pid" || args[len(args)-1] != "sbx-0000000000000001" {
		t.Fatalf("want -pid-file /b/runsc.pid before the id, last: %v", args)
	}
	for _, tc := range []struct {
		m     idMap
		relax bool
	}{
		{idMap{UIDBase: 200000, UIDCount: 65536}, false}, // the range it restores under
		{idMap{UIDBase: 100000, UIDCount: 65536}, true},  // another range (node or block)
		{idMap{UIDBase: 100000, UIDCount: 1000}, false},  // another size: runsc decides
	} {
		if err := writeJSON(filepath.Join(img, idMapFile), tc.m); err != nil {
			t.Fatal(err)
		}
		args := d.restoreArgs(img, "/b", "sbx-0000000000000001", 200000, "/b/runsc.pid")
		if got := slices.Contains(args, relax); got != tc.relax || !tc.relax && args[0] != "restore" || tc.relax && args[1] != "restore" {
			t.Errorf("captured under %+v: %v", tc.m, args)
		}
	}
	if err := os.WriteFile(filepath.Join(img, idMapFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if args := d.restoreArgs(img, "/b", "sbx-0000000000000001", 200000, "/b/runsc.pid"); slices.Contains(args, relax) {
		t.Fatalf("a garbled map: %v", args)
	}
}

// TestStartSlot: creates past MaxStarting wait for a slot and give up with
// their context, saying why.
func TestStartSlot(t *testing.T) {
	d := &Driver{opts: Options{MaxStarting: 1, Logf: t.Logf}, starting: make(chan struct{}, 1)}
	release, err := d.startSlot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := d.startSlot(ctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "start slot") {
		t.Fatalf("second slot: %v, want a deadline error naming the start slot", err)
	}
	got := make(chan error, 1)
	go func() {
		r, err := d.startSlot(context.Background())
		if err == nil {
			r()
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	release()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting create did not get the slot released")
	}
}
