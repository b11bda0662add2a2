package credstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/core"
)

const secret = "ghp_canary-secret-value-123"

func open(t *testing.T, dir string, key []byte) (*Store, *[]string) {
	t.Helper()
	var deleted []string
	s, err := Open(dir, key, func(id string) { deleted = append(deleted, id) })
	if err != nil {
		t.Fatal(err)
	}
	return s, &deleted
}

func TestStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	key, err := KeyFromFile(filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := KeyFromFile(filepath.Join(dir, "key")); !bytes.Equal(again, key) {
		t.Fatal("key file not reused")
	}
	if st, _ := os.Stat(filepath.Join(dir, "key")); st.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v", st.Mode())
	}
	s, deleted := open(t, filepath.Join(dir, "creds"), key)
	c, err := s.CreateCredential(ctx, "p1", core.CredentialRequest{Name: "gh", Secret: secret, Host: "API.GitHub.com",
		Prefix: "Bearer ", Methods: []string{"get"}, PathPrefix: "/repos/", Env: "GH_TOKEN"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Host != "api.github.com" || c.Port != 443 || c.Header != "Authorization" || !strings.HasPrefix(c.Placeholder, "space-cred-") {
		t.Errorf("created %+v", c)
	}
	if b, _ := json.Marshal(c); bytes.Contains(b, []byte(secret)) {
		t.Fatal("secret in the API view")
	}
	// At rest: sealed, never in the clear.
	raw, err := os.ReadFile(filepath.Join(dir, "creds", c.ID+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(secret)) {
		t.Fatal("secret stored in the clear")
	}
	// Projects are separate.
	if _, err := s.GetCredential(ctx, "p2", c.ID); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("other project reads it: %v", err)
	}
	if l, _ := s.ListCredentials(ctx, "p2"); len(l) != 0 {
		t.Errorf("other project lists it: %v", l)
	}
	if _, _, err := s.Resolve(ctx, "p2", []string{c.ID}); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("other project resolves it: %v", err)
	}
	gw, _, err := s.Resolve(ctx, "p1", []string{c.ID})
	if err != nil || len(gw) != 1 || string(gw[0].Secret) != secret || gw[0].Placeholder != c.Placeholder {
		t.Fatalf("resolve: %v %+v", err, gw)
	}
	// A binding edited on disk no longer decrypts.
	edited := bytes.Replace(raw, []byte(`"host":"api.github.com"`), []byte(`"host":"evil.test"`), 1)
	os.WriteFile(filepath.Join(dir, "creds", c.ID+".json"), edited, 0o600)
	if _, _, err := s.Resolve(ctx, "p1", []string{c.ID}); err == nil {
		t.Fatal("edited binding still decrypts")
	}
	os.WriteFile(filepath.Join(dir, "creds", c.ID+".json"), raw, 0o600)
	// Another key cannot open it.
	other, _ := open(t, filepath.Join(dir, "creds"), bytes.Repeat([]byte{1}, 32))
	if _, _, err := other.Resolve(ctx, "p1", []string{c.ID}); err == nil {
		t.Fatal("wrong key decrypts")
	}
	for _, bad := range []core.CredentialRequest{
		{Secret: secret, Host: "*.github.com"},
		{Secret: secret, Host: "1.2.3.4"},
		{Secret: "short", Host: "a.test"},
		{Secret: secret, Host: "a.test", Header: "Host"},
		{Secret: secret, Host: "a.test", Env: "1BAD"},
		{Secret: secret, Host: "a.test", Methods: []string{"TRACE"}},
	} {
		if _, err := s.CreateCredential(ctx, "p1", bad); !errors.Is(err, core.ErrInvalid) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	if err := s.DeleteCredential(ctx, "p2", c.ID); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("other project deletes it: %v", err)
	}
	if err := s.DeleteCredential(ctx, "p1", c.ID); err != nil {
		t.Fatal(err)
	}
	if len(*deleted) != 1 || (*deleted)[0] != c.ID {
		t.Errorf("onDelete: %v", *deleted)
	}
	if l, _ := s.ListCredentials(ctx, "p1"); len(l) != 0 {
		t.Errorf("after delete: %v", l)
	}
	if _, err := s.GetCredential(ctx, "p1", "../../etc/passwd"); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("path id: %v", err)
	}
}

type meta struct{ m map[string][]byte }

func (m *meta) PutMetaIfAbsent(_ context.Context, k string, v []byte) ([]byte, error) {
	if cur, ok := m.m[k]; ok {
		return cur, nil
	}
	m.m[k] = v
	return v, nil
}

func TestKeyFromMeta(t *testing.T) {
	m := &meta{m: map[string][]byte{}}
	a, err := KeyFromMeta(context.Background(), m)
	if err != nil || len(a) != 32 {
		t.Fatal(err)
	}
	b, _ := KeyFromMeta(context.Background(), m)
	if !bytes.Equal(a, b) {
		t.Fatal("meta key not stable")
	}
}
