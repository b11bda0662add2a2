package gvisor

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// An image records the host id range it was captured under; a restore
// under another base of the same size relaxes runsc's spec validation
// (the mapping differs by design), every other restore enforces it.
func TestRestoreArgsIDMap(t *testing.T) {
	d := &Driver{opts: Options{UIDBase: 200000, UIDCount: 65536, Logf: t.Logf}}
	const relax = "--restore-spec-validation=warning"
	img := t.TempDir()
	if args := d.restoreArgs(img, "/b", "sbx-0000000000000001", 200000); slices.Contains(args, relax) || args[0] != "restore" {
		t.Fatalf("an image without a recorded map: %v", args)
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
		args := d.restoreArgs(img, "/b", "sbx-0000000000000001", 200000)
		if got := slices.Contains(args, relax); got != tc.relax || !tc.relax && args[0] != "restore" || tc.relax && args[1] != "restore" {
			t.Errorf("captured under %+v: %v", tc.m, args)
		}
	}
	if err := os.WriteFile(filepath.Join(img, idMapFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if args := d.restoreArgs(img, "/b", "sbx-0000000000000001", 200000); slices.Contains(args, relax) {
		t.Fatalf("a garbled map: %v", args)
	}
}
