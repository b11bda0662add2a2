// Package auth issues and checks SPACE's two kinds of credentials: API keys
// for the control API (random secrets, stored only as SHA-256 hashes) and
// session tokens for the data connection (HMAC-signed, bound to one sandbox,
// expiring). The two formats have different prefixes, so one can never pass
// for the other.
package auth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/logx"
)

const (
	keyPrefix   = "space_"
	tokenPrefix = "sst_"
	metaHMACKey = "session_hmac_key"
	maxCredLen  = 512
)

// Errors. Both wrap core.ErrUnauthorized so the API maps them to 401.
var (
	ErrInvalid = fmt.Errorf("invalid credentials: %w", core.ErrUnauthorized)
	ErrExpired = fmt.Errorf("credentials expired: %w", core.ErrUnauthorized)
)

// Principal is who an API key speaks for.
type Principal struct {
	KeyID     string
	ProjectID string
	// Admin keys are the operator's: they also publish public templates,
	// run template GC and list across projects.
	Admin bool
}

// Keys manages API keys.
type Keys struct {
	store core.Store
	now   func() time.Time
}

// NewKeys returns a key manager.
func NewKeys(store core.Store, now func() time.Time) *Keys { return &Keys{store: store, now: now} }

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return fmt.Sprintf("%x", b)
}

// Create makes a project key and returns its one-time plaintext.
func (k *Keys) Create(ctx context.Context, projectID, name string) (core.APIKey, string, error) {
	return k.CreateKey(ctx, projectID, name, false)
}

// CreateKey makes a key, an operator's (admin) key if admin, and returns
// its one-time plaintext.
func (k *Keys) CreateKey(ctx context.Context, projectID, name string, admin bool) (core.APIKey, string, error) {
	if !validName(projectID) {
		return core.APIKey{}, "", fmt.Errorf("project must be 1-64 of [a-z0-9_-]: %w", core.ErrInvalid)
	}
	if len(name) > 128 {
		return core.APIKey{}, "", fmt.Errorf("name longer than 128 bytes: %w", core.ErrInvalid)
	}
	id := randHex(6)
	secret := randHex(24)
	sum := sha256.Sum256([]byte(secret))
	key := core.APIKey{ID: id, ProjectID: projectID, Name: name, Admin: admin, Hash: sum[:], CreatedAt: k.now().UTC()}
	if err := k.store.CreateAPIKey(ctx, key); err != nil {
		return core.APIKey{}, "", err
	}
	return key, keyPrefix + id + "_" + secret, nil
}

// Verify checks a plaintext key.
func (k *Keys) Verify(ctx context.Context, plaintext string) (Principal, error) {
	if len(plaintext) > maxCredLen || !strings.HasPrefix(plaintext, keyPrefix) {
		return Principal{}, ErrInvalid
	}
	id, secret, ok := strings.Cut(strings.TrimPrefix(plaintext, keyPrefix), "_")
	if !ok || id == "" || secret == "" {
		return Principal{}, ErrInvalid
	}
	key, err := k.store.GetAPIKey(ctx, id)
	if errors.Is(err, core.ErrNotFound) {
		return Principal{}, ErrInvalid
	}
	if err != nil {
		return Principal{}, err
	}
	sum := sha256.Sum256([]byte(secret))
	if subtle.ConstantTimeCompare(sum[:], key.Hash) != 1 || key.RevokedAt != nil {
		return Principal{}, ErrInvalid
	}
	logx.SetPrincipal(ctx, logx.Principal{Project: key.ProjectID, KeyID: key.ID}) // the request's access-log line
	return Principal{KeyID: key.ID, ProjectID: key.ProjectID, Admin: key.Admin}, nil
}

func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Session is what a valid session token grants: one sandbox until Expires.
type Session struct {
	SandboxID string
	ProjectID string
	Expires   time.Time
}

// Sessions signs and checks session tokens.
type Sessions struct {
	key []byte
	now func() time.Time
}

// NewSessions loads (or creates on first use) the signing key from the store,
// so tokens stay valid across restarts and across servers sharing a store.
func NewSessions(ctx context.Context, store core.Store, now func() time.Time) (*Sessions, error) {
	fresh := make([]byte, 32)
	if _, err := rand.Read(fresh); err != nil {
		return nil, fmt.Errorf("session key: %w", err)
	}
	key, err := store.PutMetaIfAbsent(ctx, metaHMACKey, fresh)
	if err != nil {
		return nil, fmt.Errorf("session key: %w", err)
	}
	return &Sessions{key: key, now: now}, nil
}

// Issue returns a token for one sandbox, valid for ttl.
func (s *Sessions) Issue(projectID, sandboxID string, ttl time.Duration) (string, time.Time) {
	exp := s.now().Add(ttl).UTC().Truncate(time.Second)
	return s.seal(tokenPrefix, sessionDomain, exp, randomNonce(), projectID+"/"+sandboxID), exp
}

// randomNonce makes tokens issued in the same second for the same grant
// differ.
func randomNonce() []byte {
	nonce := make([]byte, 8)
	if _, err := rand.Read(nonce); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return nonce
}

// seal makes a token: prefix, then base64 of expiry (8 bytes), nonce (8
// bytes) and grant, a dot, and the MAC of that payload under domain.
func (s *Sessions) seal(prefix, domain string, exp time.Time, nonce []byte, grant string) string {
	payload := make([]byte, 0, 16+len(grant))
	payload = binary.BigEndian.AppendUint64(payload, uint64(exp.Unix()))
	payload = append(payload, nonce[:8]...)
	payload = append(payload, grant...)
	enc := base64.RawURLEncoding
	return prefix + enc.EncodeToString(payload) + "." + enc.EncodeToString(s.mac(domain, payload))
}

// Signing domains: a token of one kind never verifies as another.
const (
	sessionDomain = "space-session-v1\x00"
	portDomain    = "space-port-v1\x00"
)

func (s *Sessions) mac(domain string, payload []byte) []byte {
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte(domain))
	h.Write(payload)
	return h.Sum(nil)
}

// open checks a token's prefix and signature and returns its payload:
// expiry (8 bytes), nonce (8 bytes), then the grant.
func (s *Sessions) open(token, prefix, domain string) ([]byte, error) {
	if len(token) > maxCredLen || !strings.HasPrefix(token, prefix) {
		return nil, ErrInvalid
	}
	p, m, ok := strings.Cut(strings.TrimPrefix(token, prefix), ".")
	if !ok {
		return nil, ErrInvalid
	}
	enc := base64.RawURLEncoding
	payload, err1 := enc.DecodeString(p)
	mac, err2 := enc.DecodeString(m)
	if err1 != nil || err2 != nil || len(payload) < 17 {
		return nil, ErrInvalid
	}
	if !hmac.Equal(mac, s.mac(domain, payload)) {
		return nil, ErrInvalid
	}
	return payload, nil
}

// Verify checks a token and returns the session it grants.
func (s *Sessions) Verify(token string) (Session, error) {
	payload, err := s.open(token, tokenPrefix, sessionDomain)
	if err != nil {
		return Session{}, err
	}
	exp := time.Unix(int64(binary.BigEndian.Uint64(payload[:8])), 0).UTC()
	project, sandbox, ok := strings.Cut(string(payload[16:]), "/")
	if !ok {
		return Session{}, ErrInvalid
	}
	if !s.now().Before(exp) {
		return Session{}, ErrExpired
	}
	return Session{SandboxID: sandbox, ProjectID: project, Expires: exp}, nil
}
