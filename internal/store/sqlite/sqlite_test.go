package sqlite

import (
	"context"
	"database/sql"
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

// A store made before admin keys existed opens, and its keys are project
// keys.
func TestMigrateAdminColumn(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE api_keys (id TEXT PRIMARY KEY, project_id TEXT NOT NULL, name TEXT NOT NULL, hash BLOB NOT NULL,
  created_at INTEGER NOT NULL, revoked_at INTEGER);
INSERT INTO api_keys VALUES('old','p1','n',x'01',1,NULL);`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	for i := 0; i < 2; i++ { // the second open finds the column already there
		s, err := Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		k, err := s.GetAPIKey(ctx, "old")
		if err != nil || k.ProjectID != "p1" || k.Admin {
			t.Fatalf("old key after migration: %+v %v", k, err)
		}
		s.Close()
	}
}
