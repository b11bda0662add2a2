// Package pgtest gives tests a PostgreSQL database: SPACE_TEST_POSTGRES when
// set, else the throwaway cluster scripts/postgres.sh starts (without
// installing anything); tests skip with the reason when neither is there.
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN names the variable that points tests at an existing database.
const EnvDSN = "SPACE_TEST_POSTGRES"

// DSN returns the base DSN, or skips t with the reason there is none. It
// runs scripts/postgres.sh (idempotent: it starts the cluster once and
// afterwards only prints its DSN) unless EnvDSN is set.
func DSN(t testing.TB) string {
	t.Helper()
	if d := os.Getenv(EnvDSN); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "scripts", "postgres.sh")
	if _, err := os.Stat(script); err != nil {
		t.Skipf("PostgreSQL unavailable: no %s and no scripts/postgres.sh: %v", EnvDSN, err)
	}
	cmd := exec.Command("bash", script)
	cmd.Env = append(os.Environ(), "SPACE_PG_NO_INSTALL=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Skipf("PostgreSQL unavailable: no %s, and scripts/postgres.sh failed (%v): %s", EnvDSN, err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String())
}

// FreshDSN returns a DSN whose search_path is a new, empty schema that is
// dropped when t ends: every caller gets a database of its own to migrate.
func FreshDSN(t testing.TB) string {
	t.Helper()
	base := DSN(t)
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	schema := "t_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("connect %s: %v", base, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			t.Logf("drop schema %s: %v", schema, err)
		}
	})
	return WithSearchPath(t, base, schema)
}

// WithSearchPath returns dsn with its search_path set to schema.
func WithSearchPath(t testing.TB, dsn, schema string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		// key=value form
		return dsn + " search_path=" + schema
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
