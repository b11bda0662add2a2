package auth

import (
	"context"
	"slices"
	"testing"
	"time"
)

func TestStableTokens(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	s, err := NewSessions(ctx, st, clock)
	if err != nil {
		t.Fatal(err)
	}
	ttl := 8 * time.Hour // windows of one hour
	a, expA := s.IssueStable("p1", "sbx-1", ttl)
	if b, _ := s.IssueStable("p1", "sbx-1", ttl); b != a {
		t.Fatal("two tokens in one window differ")
	}
	if left := expA.Sub(now); left <= 7*time.Hour || left > ttl {
		t.Errorf("token valid for %v of a %v ttl", left, ttl)
	}
	sess, err := s.Verify(a)
	if err != nil || sess.ProjectID != "p1" || sess.SandboxID != "sbx-1" {
		t.Fatalf("verify: %+v %v", sess, err)
	}
	for _, other := range [][2]string{{"p2", "sbx-1"}, {"p1", "sbx-2"}} {
		if tok, _ := s.IssueStable(other[0], other[1], ttl); tok == a {
			t.Errorf("%v has the same token", other)
		}
	}
	// Another server with the same key (store) computes the same token;
	// one with another key does not.
	s2, _ := NewSessions(ctx, st, clock)
	if b, _ := s2.IssueStable("p1", "sbx-1", ttl); b != a {
		t.Error("same key, other token")
	}
	s3, _ := NewSessions(ctx, newStore(t), clock)
	if b, _ := s3.IssueStable("p1", "sbx-1", ttl); b == a {
		t.Error("other key, same token")
	}
	// Later windows issue new tokens; the old one is a candidate while
	// it is valid, and not after.
	now = now.Add(3 * time.Hour)
	b, _ := s.IssueStable("p1", "sbx-1", ttl)
	cands := s.StableTokens("p1", "sbx-1", ttl)
	if b == a || cands[0] != b || !slices.Contains(cands, a) || len(cands) > stableWindows+1 {
		t.Errorf("candidates after 3h: %d, newest ok %v, old ok %v", len(cands), cands[0] == b, slices.Contains(cands, a))
	}
	now = expA
	if slices.Contains(s.StableTokens("p1", "sbx-1", ttl), a) {
		t.Error("expired token still a candidate")
	}
	if _, err := s.Verify(a); err == nil {
		t.Error("expired token verifies")
	}
}
