package credstore

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

func newKey(t *testing.T, b byte) string {
	t.Helper()
	return hex.EncodeToString(bytes.Repeat([]byte{b}, 32))
}

func mustKeyring(t *testing.T, text string) *Keyring {
	t.Helper()
	k, err := ParseKeyring(text)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestSharedEnvelope runs the shared store on a real SQLite database:
// secrets sealed per record, keys rotated and rewrapped, nothing secret in
// the database, edited records refused.
func TestSharedEnvelope(t *testing.T) {
	ctx := context.Background()
	dbPath := filepath.Join(t.TempDir(), "space.db")
	st, err := sqlite.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	k1, k2 := newKey(t, 1), newKey(t, 2)
	var deleted []string
	s1 := NewShared(st, mustKeyring(t, k1), func(_ context.Context, id string) { deleted = append(deleted, id) })
	const secret = "space-canary-0123456789abcdef"
	req := core.CredentialRequest{Name: "api", Secret: secret, Host: "api.test", Prefix: "Bearer ", Methods: []string{"GET"}, PathPrefix: "/v1/", Env: "API_TOKEN"}
	c1, err := s1.CreateCredential(ctx, "p1", req)
	if err != nil {
		t.Fatal(err)
	}
	if c1.Port != 443 || c1.Header != "Authorization" || !strings.HasPrefix(c1.Placeholder, "space-cred-") {
		t.Fatalf("binding defaults: %+v", c1)
	}
	// The same validation as the file store.
	for _, bad := range []core.CredentialRequest{
		{Secret: "x", Host: ""},
		{Secret: "", Host: "api.test"},
		{Secret: "x", Host: "api.test", Env: "1BAD"},
		{Secret: "x", Host: "api.test", Header: "Host"},
	} {
		if _, err := s1.CreateCredential(ctx, "p1", bad); !errors.Is(err, core.ErrInvalid) {
			t.Errorf("%+v: %v, want invalid", bad, err)
		}
	}
	if l, err := s1.ListCredentials(ctx, "p1"); err != nil || len(l) != 1 || l[0].ID != c1.ID {
		t.Fatalf("list: %v %v", l, err)
	}
	if _, err := s1.GetCredential(ctx, "p2", c1.ID); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("another project: %v", err)
	}
	if s1.CredentialOwner(c1.ID) != "p1" {
		t.Fatal("owner")
	}
	creds, infos, err := s1.Resolve(ctx, "p1", []string{c1.ID})
	if err != nil || len(creds) != 1 || string(creds[0].Secret) != secret || infos[0].ID != c1.ID || creds[0].Host != "api.test" {
		t.Fatalf("resolve: %v %v", infos, err)
	}
	if _, _, err := s1.Resolve(ctx, "p2", []string{c1.ID}); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("resolve from another project: %v", err)
	}
	// A record with its binding edited (here: copied under another host)
	// does not open.
	rec, _ := st.GetCredentialRecord(ctx, "p1", c1.ID)
	forged := rec
	forged.Credential.Host = "evil.test"
	forged.Credential.ID = "cred-00000000000000ff"
	if err := st.InsertCredential(ctx, forged, MaxPerProject); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s1.Resolve(ctx, "p1", []string{forged.Credential.ID}); err == nil {
		t.Fatal("a forged record opened")
	}
	st.DeleteCredentialRecord(ctx, "p1", forged.Credential.ID)

	// Rotation: k2 first seals, k1 still opens.
	s12 := NewShared(st, mustKeyring(t, k2+"\n"+k1+" # the old key\n"), nil)
	c2, err := s12.CreateCredential(ctx, "p1", req)
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := st.GetCredentialRecord(ctx, "p1", c2.ID); r.KeyID != KeyID(mustHex(t, k2)) {
		t.Fatalf("new record under %s, want the first key", r.KeyID)
	}
	if _, _, err := s12.Resolve(ctx, "p1", []string{c1.ID, c2.ID}); err != nil {
		t.Fatalf("resolve across keys: %v", err)
	}
	// Without k1, c1 cannot be opened (and says why), c2 can.
	s2 := NewShared(st, mustKeyring(t, k2), nil)
	if _, _, err := s2.Resolve(ctx, "p1", []string{c1.ID}); !errors.Is(err, core.ErrUnavailable) || !strings.Contains(err.Error(), "does not have") {
		t.Fatalf("old record without its key: %v", err)
	}
	if moved, missing, err := s2.Rewrap(ctx); err != nil || moved != 0 || missing != 1 {
		t.Fatalf("rewrap without the old key: %d %d %v", moved, missing, err)
	}
	if moved, missing, err := s12.Rewrap(ctx); err != nil || moved != 1 || missing != 0 {
		t.Fatalf("rewrap: %d moved, %d missing, %v", moved, missing, err)
	}
	if moved, _, _ := s12.Rewrap(ctx); moved != 0 {
		t.Fatalf("second rewrap moved %d", moved)
	}
	if creds, _, err := s2.Resolve(ctx, "p1", []string{c1.ID, c2.ID}); err != nil || string(creds[0].Secret) != secret {
		t.Fatalf("after rewrap, the new key alone: %v", err)
	}

	// Delete: gone for everyone, and the callback told.
	if err := s2.DeleteCredential(ctx, "p1", c1.ID); err != nil {
		t.Fatal(err)
	}
	if len(deleted) != 0 {
		t.Fatal("another store's callback ran")
	}
	if err := s1.DeleteCredential(ctx, "p1", c2.ID); err != nil || len(deleted) != 1 || deleted[0] != c2.ID {
		t.Fatalf("delete: %v %v", err, deleted)
	}
	if _, err := s1.GetCredential(ctx, "p1", c2.ID); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}

	// Nothing secret is in the database: neither the secret nor a key.
	st.Close()
	for _, p := range []string{dbPath, dbPath + "-wal"} {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, s := range [][]byte{[]byte(secret), []byte(k1), []byte(k2), mustHex(t, k1), mustHex(t, k2)} {
			if bytes.Contains(raw, s) {
				t.Fatalf("%s holds a secret or a key", p)
			}
		}
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestKeyring(t *testing.T) {
	for _, bad := range []string{"", "# only a comment\n", "abcd", newKey(t, 1) + "zz", strings.Repeat("0", 62)} {
		if _, err := ParseKeyring(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	k := mustKeyring(t, newKey(t, 3)+","+newKey(t, 4))
	if k.ActiveID() != KeyID(bytes.Repeat([]byte{3}, 32)) || len(k.IDs()) != 2 || k.IDs()[0] != k.ActiveID() {
		t.Fatalf("ids %v active %s", k.IDs(), k.ActiveID())
	}
	if KeyID(bytes.Repeat([]byte{3}, 32)) == KeyID(bytes.Repeat([]byte{4}, 32)) {
		t.Fatal("key ids collide")
	}
	f := filepath.Join(t.TempDir(), "keys")
	os.WriteFile(f, []byte(newKey(t, 5)+"\n"), 0o644)
	if _, err := KeyringFromFile(f); err == nil || !strings.Contains(err.Error(), "readable by others") {
		t.Fatalf("world-readable key file: %v", err)
	}
	os.Chmod(f, 0o600)
	if _, err := KeyringFromFile(f); err != nil {
		t.Fatal(err)
	}
}
