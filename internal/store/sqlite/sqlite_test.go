package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) core.Store {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "space.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestFileMode: the database holds signing and encryption keys, so it and
// its WAL files are the owner's only, also when an older server created
// the file world-readable.
func TestFileMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "space.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.GetMeta(context.Background(), "nothing"); err == nil {
		t.Fatal("GetMeta of a missing key succeeded")
	}
	if _, err := s.PutMetaIfAbsent(context.Background(), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		st, err := os.Stat(p)
		if err != nil {
			if os.IsNotExist(err) && p != path {
				continue
			}
			t.Fatal(err)
		}
		if st.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s has mode %v: readable by others", p, st.Mode().Perm())
		}
	}
}
