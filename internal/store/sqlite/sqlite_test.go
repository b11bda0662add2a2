package sqlite

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) core.Store { return openTest(t) })
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

// TestPrunePlans: every prune batch walks an index from its oldest row;
// none scans a whole table (a prune must stay cheap however many live
// rows there are).
func TestPrunePlans(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, q := range pruneQueries {
		rows, err := s.db.QueryContext(ctx, "EXPLAIN QUERY PLAN "+q.sql, int64(1), 10)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		for _, d := range plan {
			if strings.HasPrefix(d, "SCAN ") && !strings.Contains(d, "USING") {
				t.Errorf("prune %s scans a table: %q\nplan: %q", q.what, d, plan)
			}
			if strings.Contains(d, "TEMP B-TREE") {
				t.Errorf("prune %s sorts: %q\nplan: %q", q.what, d, plan)
			}
		}
		t.Logf("%s: %q", q.what, plan)
	}
}

// A store from before retention with ended records migrates: what had
// ended counts as ended at the upgrade, so it is pruned one retention
// window later, not at once; live records are untouched.
func TestMigrateRetention(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(schema + `
INSERT INTO sandboxes(id,project_id,state,doc) VALUES
  ('sbx-old','p1','deleted','{"id":"sbx-old","project_id":"p1","state":"deleted"}'),
  ('sbx-run','p1','running','{"id":"sbx-run","project_id":"p1","state":"running"}');
INSERT INTO operations(id,project_id,state,doc) VALUES
  ('op-old','p1','succeeded','{"id":"op-old","project_id":"p1","kind":"sandbox.create","target":"sbx-old","state":"succeeded"}'),
  ('op-run','p1','running','{"id":"op-run","project_id":"p1","kind":"sandbox.delete","target":"sbx-run","state":"running"}');
INSERT INTO events(project_id,doc) VALUES ('p1','{"project_id":"p1","type":"x","data":{}}');`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var target string
	if err := s.db.QueryRowContext(ctx, `SELECT target FROM operations WHERE id='op-run'`).Scan(&target); err != nil || target != "sbx-run" {
		t.Fatalf("backfilled target: %q %v", target, err)
	}
	storetest.CheckMigratedRetention(t, s)
}
