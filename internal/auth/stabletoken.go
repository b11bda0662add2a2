package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"time"
)

// Stable session tokens: E2B's signed file URLs hash the sandbox's access
// token ("<path>:<op>:<user>:<token>[:<exp>]"), so the server must be able
// to name the exact token the SDK holds. Rather than storing every issued
// token, a stable token is a function of the session key, the sandbox and
// a time window: the server recomputes the few that can still be valid.
// It is an ordinary session token (Verify accepts it), only its nonce is
// derived instead of random.

// stableWindows is how many windows a TTL spans: a stable token issued in
// window k expires at start(k)+ttl, so it is valid for between
// (1-1/stableWindows)·ttl and ttl after it is handed out.
const stableWindows = 8

func stableWindow(ttl time.Duration) int64 {
	w := int64(ttl/time.Second) / stableWindows
	return max(w, 1)
}

// IssueStable returns the stable token of sandboxID (of projectID) for the
// window holding now: every call in the same window returns the same token.
func (s *Sessions) IssueStable(projectID, sandboxID string, ttl time.Duration) (string, time.Time) {
	w := stableWindow(ttl)
	return s.stable(projectID, sandboxID, s.now().Unix()/w, w, ttl)
}

// StableTokens returns every stable token of sandboxID that has not
// expired yet, newest first (at most stableWindows+1).
func (s *Sessions) StableTokens(projectID, sandboxID string, ttl time.Duration) []string {
	w := stableWindow(ttl)
	now := s.now().Unix()
	var out []string
	for k := now / w; k >= 0 && len(out) <= stableWindows; k-- {
		exp := k*w + int64(ttl/time.Second)
		if exp <= now {
			break
		}
		tok, _ := s.stable(projectID, sandboxID, k, w, ttl)
		out = append(out, tok)
	}
	return out
}

func (s *Sessions) stable(projectID, sandboxID string, k, w int64, ttl time.Duration) (string, time.Time) {
	exp := time.Unix(k*w+int64(ttl/time.Second), 0).UTC()
	// The nonce is a MAC of the sandbox and window under the session key
	// (domain-separated from token MACs): unpredictable without the key.
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte("space-stable-nonce-v1\x00"))
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(k)))
	h.Write([]byte(projectID + "/" + sandboxID))
	return s.seal(tokenPrefix, sessionDomain, exp, h.Sum(nil)[:8], projectID+"/"+sandboxID), exp
}
