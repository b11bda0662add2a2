// Package cluster is SPACE's scale-out: the node RPC protocol between
// `space server --remote-nodes` replicas and `space node` processes, its
// request signing, the remote core.Runtime with its scheduler, and the
// heartbeat and loss monitor.
//
// Servers call nodes over HTTP+JSON. Every request carries a token signed
// with HMAC-SHA256 under the cluster secret that servers and nodes share:
// bound to the node it is for (audience), the method, the path and a hash
// of the body, valid for a short window around its timestamp, and used at
// most once (its nonce is remembered for that window).
package cluster

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MinSecretBytes is the shortest cluster secret accepted.
const MinSecretBytes = 32

// TokenWindow is how far a token's timestamp may be from the verifier's
// clock (either way).
const TokenWindow = 30 * time.Second

const tokenVersion = "v1"

// maxNonces bounds the replay cache; past it, requests are refused until
// old nonces expire (a flood of valid signed requests needs the secret).
const maxNonces = 1 << 18

// ErrBadToken is returned for every token that does not verify.
var ErrBadToken = errors.New("bad node token")

// ReadSecret reads a cluster secret from a file (surrounding white space
// trimmed) and checks its length.
func ReadSecret(path string) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster secret: %w", err)
	}
	return CheckSecret([]byte(strings.TrimSpace(string(raw))))
}

// CheckSecret checks a secret's length.
func CheckSecret(b []byte) ([]byte, error) {
	if len(b) < MinSecretBytes {
		return nil, fmt.Errorf("cluster secret: need at least %d bytes, got %d", MinSecretBytes, len(b))
	}
	return b, nil
}

// Signer makes request tokens.
type Signer struct {
	key []byte
	now func() time.Time
}

// NewSigner returns a signer under secret.
func NewSigner(secret []byte, now func() time.Time) *Signer {
	if now == nil {
		now = time.Now
	}
	return &Signer{key: secret, now: now}
}

// Sign returns the token for one request to node aud.
func (s *Signer) Sign(aud, method, path string, body []byte) string {
	return s.SignSum(aud, method, path, sha256.Sum256(body))
}

// SignSum is Sign for a body known by its SHA-256 (one streamed from a
// file).
func (s *Signer) SignSum(aud, method, path string, sum [sha256.Size]byte) string {
	var n [12]byte
	if _, err := rand.Read(n[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	payload := strings.Join([]string{tokenVersion, base64.RawURLEncoding.EncodeToString([]byte(aud)),
		strconv.FormatInt(s.now().UnixMilli(), 10), hex.EncodeToString(n[:]), hex.EncodeToString(sum[:])}, ".")
	return payload + "." + mac(s.key, method, path, payload)
}

func mac(key []byte, method, path, payload string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(method + " " + path + "\n" + payload))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// Verifier checks request tokens for one node and remembers their nonces.
type Verifier struct {
	key []byte
	aud string
	now func() time.Time

	mu     sync.Mutex
	nonces map[string]time.Time // nonce → when it may be forgotten
	swept  time.Time
}

// NewVerifier returns a verifier for tokens addressed to aud.
func NewVerifier(secret []byte, aud string, now func() time.Time) *Verifier {
	if now == nil {
		now = time.Now
	}
	return &Verifier{key: secret, aud: aud, now: now, nonces: map[string]time.Time{}}
}

// Verify checks tok for a request (method, path, body). It fails for a
// token signed under another secret, for another node, request or body,
// outside the time window, or seen before.
func (v *Verifier) Verify(tok, method, path string, body []byte) error {
	return v.VerifySum(tok, method, path, sha256.Sum256(body))
}

// VerifySum is Verify for a body known by its SHA-256: a streamed body is
// authenticated before it is read, and the caller checks that what it
// reads hashes to sum.
func (v *Verifier) VerifySum(tok, method, path string, sum [sha256.Size]byte) error {
	if len(tok) > 512 {
		return fmt.Errorf("token too long: %w", ErrBadToken)
	}
	i := strings.LastIndexByte(tok, '.')
	if i < 0 {
		return fmt.Errorf("malformed: %w", ErrBadToken)
	}
	payload, sig := tok[:i], tok[i+1:]
	if !hmac.Equal([]byte(sig), []byte(mac(v.key, method, path, payload))) {
		return fmt.Errorf("signature: %w", ErrBadToken)
	}
	f := strings.Split(payload, ".")
	if len(f) != 5 || f[0] != tokenVersion {
		return fmt.Errorf("malformed: %w", ErrBadToken)
	}
	aud, err := base64.RawURLEncoding.DecodeString(f[1])
	if err != nil || string(aud) != v.aud {
		return fmt.Errorf("token is for node %.64q, not %q: %w", aud, v.aud, ErrBadToken)
	}
	ms, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return fmt.Errorf("malformed time: %w", ErrBadToken)
	}
	now := v.now()
	at := time.UnixMilli(ms)
	if at.Before(now.Add(-TokenWindow)) || at.After(now.Add(TokenWindow)) {
		return fmt.Errorf("token time %s outside ±%v of %s: %w", at.UTC().Format(time.RFC3339), TokenWindow, now.UTC().Format(time.RFC3339), ErrBadToken)
	}
	if f[4] != hex.EncodeToString(sum[:]) {
		return fmt.Errorf("body does not match: %w", ErrBadToken)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if now.Sub(v.swept) > time.Second {
		for k, exp := range v.nonces {
			if now.After(exp) {
				delete(v.nonces, k)
			}
		}
		v.swept = now
	}
	if _, seen := v.nonces[f[3]]; seen {
		return fmt.Errorf("replayed: %w", ErrBadToken)
	}
	if len(v.nonces) >= maxNonces {
		return fmt.Errorf("replay cache full: %w", ErrBadToken)
	}
	v.nonces[f[3]] = at.Add(TokenWindow)
	return nil
}
