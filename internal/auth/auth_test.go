package auth

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

func newStore(t *testing.T) core.Store {
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestKeys(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	k := NewKeys(st, time.Now)
	key, plain, err := k.Create(ctx, "proj", "ci")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(key.Hash), plain) {
		t.Fatal("plaintext stored")
	}
	p, err := k.Verify(ctx, plain)
	if err != nil || p.ProjectID != "proj" {
		t.Fatalf("verify: %+v %v", p, err)
	}
	for _, bad := range []string{"", plain + "x", plain[:len(plain)-1], "space_" + key.ID + "_", "sst_abc.def", strings.Repeat("a", 10000)} {
		if _, err := k.Verify(ctx, bad); !errors.Is(err, core.ErrUnauthorized) {
			t.Errorf("Verify(%.20q) = %v, want unauthorized", bad, err)
		}
	}
	if err := st.RevokeAPIKey(ctx, "proj", key.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Verify(ctx, plain); !errors.Is(err, core.ErrUnauthorized) {
		t.Fatalf("revoked key accepted: %v", err)
	}
	if _, _, err := k.Create(ctx, "Bad Project!", ""); !errors.Is(err, core.ErrInvalid) {
		t.Fatalf("bad project accepted: %v", err)
	}
}

func TestSessions(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	now := time.Now()
	clock := func() time.Time { return now }
	s, err := NewSessions(ctx, st, clock)
	if err != nil {
		t.Fatal(err)
	}
	tok, exp := s.Issue("p", "sbx-a", time.Minute)
	sess, err := s.Verify(tok)
	if err != nil || sess.SandboxID != "sbx-a" || sess.ProjectID != "p" || !sess.Expires.Equal(exp) {
		t.Fatalf("verify: %+v %v", sess, err)
	}
	// Same store → same key → tokens survive a restart.
	s2, _ := NewSessions(ctx, st, clock)
	if _, err := s2.Verify(tok); err != nil {
		t.Fatalf("token not valid after restart: %v", err)
	}
	// A different store's key rejects it.
	s3, _ := NewSessions(ctx, newStore(t), clock)
	if _, err := s3.Verify(tok); !errors.Is(err, ErrInvalid) {
		t.Fatalf("foreign key accepted: %v", err)
	}
	// Tampering with the payload (changing the sandbox) breaks the MAC.
	tampered := strings.Replace(tok, tok[10:12], "AA", 1)
	if tampered != tok {
		if _, err := s.Verify(tampered); err == nil {
			t.Fatal("tampered token accepted")
		}
	}
	now = now.Add(2 * time.Minute)
	if _, err := s.Verify(tok); !errors.Is(err, ErrExpired) {
		t.Fatalf("expired token: %v", err)
	}
}

func FuzzSessionVerify(f *testing.F) {
	st, err := sqlite.Open(context.Background(), filepath.Join(f.TempDir(), "db"))
	if err != nil {
		f.Fatal(err)
	}
	defer st.Close()
	s, _ := NewSessions(context.Background(), st, time.Now)
	tok, _ := s.Issue("p", "sbx-0123456789abcdef", time.Hour)
	f.Add(tok)
	f.Add("sst_.")
	f.Add("sst_AAAA.BBBB")
	f.Fuzz(func(t *testing.T, in string) {
		sess, err := s.Verify(in)
		if err == nil && in != tok {
			// Only a correctly signed token may pass; the fuzzer cannot forge one.
			if sess.SandboxID != "sbx-0123456789abcdef" {
				t.Fatalf("forged token accepted: %q", in)
			}
		}
	})
}
