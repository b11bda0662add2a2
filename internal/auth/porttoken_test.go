package auth

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPortTokens(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := &Sessions{key: []byte("0123456789abcdef0123456789abcdef"), now: func() time.Time { return now }}
	tok, exp := s.IssuePort("p1", "sbx-a", 8000, time.Minute)
	if !exp.Equal(now.Add(time.Minute)) {
		t.Fatalf("expiry %v", exp)
	}
	g, err := s.VerifyPort(tok)
	if err != nil {
		t.Fatal(err)
	}
	if !g.Covers("sbx-a", 8000) || g.Covers("sbx-a", 8001) || g.Covers("sbx-b", 8000) || g.ProjectID != "p1" {
		t.Fatalf("grant %+v", g)
	}
	any, _ := s.IssuePort("p1", "sbx-a", AnyPort, time.Minute)
	if g, err := s.VerifyPort(any); err != nil || !g.Covers("sbx-a", 1) || !g.Covers("sbx-a", 65535) || g.Covers("sbx-b", 1) {
		t.Fatalf("any-port grant %+v %v", g, err)
	}
	// A session token is not a port token and a port token is not a
	// session token, though both are signed with the same key.
	sess, _ := s.Issue("p1", "sbx-a", time.Minute)
	if _, err := s.VerifyPort(sess); !errors.Is(err, ErrInvalid) {
		t.Fatalf("session token as port token: %v", err)
	}
	if _, err := s.Verify(tok); !errors.Is(err, ErrInvalid) {
		t.Fatalf("port token as session token: %v", err)
	}
	forged := "sst_" + strings.TrimPrefix(tok, "spt_")
	if _, err := s.Verify(forged); !errors.Is(err, ErrInvalid) {
		t.Fatalf("port token re-prefixed as a session token: %v", err)
	}
	// Tampering with the payload (another port) breaks the signature.
	p, m, _ := strings.Cut(strings.TrimPrefix(tok, "spt_"), ".")
	if _, err := s.VerifyPort("spt_" + p[:len(p)-2] + "AA." + m); !errors.Is(err, ErrInvalid) {
		t.Fatalf("tampered: %v", err)
	}
	for _, bad := range []string{"", "spt_", "spt_x.y", strings.Repeat("a", 600), tok + "x"} {
		if _, err := s.VerifyPort(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
	now = now.Add(2 * time.Minute)
	if _, err := s.VerifyPort(tok); !errors.Is(err, ErrExpired) {
		t.Fatalf("expired: %v", err)
	}
}
