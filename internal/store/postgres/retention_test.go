package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/space-sandbox/space/internal/store/postgres/pgtest"
	"github.com/space-sandbox/space/internal/store/storetest"
)

// A database from before retention (schema 3) with ended records
// migrates: what had ended counts as ended at the upgrade, so it is pruned
// one retention window later, not at once; live records are untouched.
func TestMigrateRetention(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.FreshDSN(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	steps := migrations()
	for v := 1; v <= 3; v++ {
		if _, err := conn.Exec(ctx, steps[v-1]); err != nil {
			t.Fatalf("migration %d: %v", v, err)
		}
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE space_schema (version INT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now());
INSERT INTO space_schema(version) VALUES (1),(2),(3);
INSERT INTO sandboxes(id,project_id,state,doc) VALUES
  ('sbx-old','p1','deleted','{"id":"sbx-old","project_id":"p1","state":"deleted"}'),
  ('sbx-run','p1','running','{"id":"sbx-run","project_id":"p1","state":"running"}');
INSERT INTO operations(id,project_id,state,doc) VALUES
  ('op-old','p1','succeeded','{"id":"op-old","project_id":"p1","kind":"sandbox.create","target":"sbx-old","state":"succeeded"}'),
  ('op-run','p1','running','{"id":"op-run","project_id":"p1","kind":"sandbox.delete","target":"sbx-run","state":"running"}');
UPDATE event_seq SET seq = 1;
INSERT INTO events(seq,project_id,doc) VALUES (1,'p1','{"seq":1,"project_id":"p1","type":"x","data":{}}');`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	s := open(t, dsn, Options{})
	var target string
	if err := s.pool.QueryRow(ctx, `SELECT target FROM operations WHERE id='op-run'`).Scan(&target); err != nil || target != "sbx-run" {
		t.Fatalf("backfilled target: %q %v", target, err)
	}
	storetest.CheckMigratedRetention(t, s)
}
