package credstore

// The credential store of a fleet: records in the database every replica
// shares (core.CredentialStore), envelope-encrypted. Each credential's
// secret is sealed (AES-256-GCM, its binding as additional data) under a
// data key of its own; the data key is sealed under an operator key that
// only the replicas hold (a file or the environment, never the database).
// A record names its operator key by id, so keys rotate: the first key of
// the keyring seals new records, every key opens, and Rewrap moves old
// records to the first key.

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/egress"
)

// Keyring is the operator keys: the first seals, all open.
type Keyring struct {
	active string
	keys   map[string]cipher.AEAD
}

// KeyID names an operator key: a hash of it (domain-separated), which says
// nothing usable about the key.
func KeyID(key []byte) string {
	h := sha256.Sum256(append([]byte("space-credential-key-id\x00"), key...))
	return "k" + hex.EncodeToString(h[:8])
}

// ParseKeyring reads operator keys: 64 hex digits each, separated by
// newlines, commas or spaces ('#' starts a comment to the end of its
// line). The first is the active key.
func ParseKeyring(text string) (*Keyring, error) {
	k := &Keyring{keys: map[string]cipher.AEAD{}}
	for _, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, "#")
		for _, f := range strings.FieldsFunc(line, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\r' }) {
			raw, err := hex.DecodeString(f)
			if err != nil || len(raw) != 32 {
				return nil, fmt.Errorf("credential keys: each key must be 64 hex digits (32 bytes): %w", core.ErrInvalid)
			}
			a, err := gcm(raw)
			if err != nil {
				return nil, err
			}
			id := KeyID(raw)
			if k.active == "" {
				k.active = id
			}
			k.keys[id] = a
		}
	}
	if k.active == "" {
		return nil, fmt.Errorf("credential keys: no key: %w", core.ErrInvalid)
	}
	return k, nil
}

// KeyringFromFile reads a keyring from a file that only its owner may read.
func KeyringFromFile(path string) (*Keyring, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("credential keys: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("credential keys: %s is readable by others (mode %o; want 0600)", path, fi.Mode().Perm())
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("credential keys: %w", err)
	}
	return ParseKeyring(string(raw))
}

// ActiveID is the id of the key that seals new records.
func (k *Keyring) ActiveID() string { return k.active }

// IDs returns the ids of every key, the active one first.
func (k *Keyring) IDs() []string {
	out := []string{k.active}
	for id := range k.keys {
		if id != k.active {
			out = append(out, id)
		}
	}
	return out
}

func gcm(key []byte) (cipher.AEAD, error) {
	blk, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(blk)
}

// seal returns nonce‖ciphertext.
func seal(a cipher.AEAD, plain, ad []byte) ([]byte, error) {
	nonce := make([]byte, a.NonceSize(), a.NonceSize()+len(plain)+a.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return a.Seal(nonce, nonce, plain, ad), nil
}

func openSealed(a cipher.AEAD, sealed, ad []byte) ([]byte, error) {
	if len(sealed) < a.NonceSize() {
		return nil, errors.New("sealed data too short")
	}
	return a.Open(nil, sealed[:a.NonceSize()], sealed[a.NonceSize():], ad)
}

// wrapAAD binds a wrapped data key to its credential and operator key.
func wrapAAD(id, keyID string) []byte {
	return []byte("space-credential-dek-v1\x00" + id + "\x00" + keyID)
}

// Shared is the credential store of a fleet (api.Credentials, and the
// resolver of the secrets a node needs).
type Shared struct {
	st   core.CredentialStore
	keys *Keyring
	now  func() time.Time
	// onDelete is told of a deleted credential (the nodes drop it).
	onDelete func(ctx context.Context, id string)
}

// NewShared returns the shared store over st with the operator keys.
func NewShared(st core.CredentialStore, keys *Keyring, onDelete func(ctx context.Context, id string)) *Shared {
	if onDelete == nil {
		onDelete = func(context.Context, string) {}
	}
	return &Shared{st: st, keys: keys, now: time.Now, onDelete: onDelete}
}

// CreateCredential validates a request (the same rules as the file store),
// seals the secret under a new data key wrapped by the active operator key,
// and stores the record.
func (s *Shared) CreateCredential(ctx context.Context, projectID string, req core.CredentialRequest) (core.Credential, error) {
	c, secret, err := newCredential(projectID, req, s.now())
	if err != nil {
		return core.Credential{}, err
	}
	dek := make([]byte, 32)
	if _, err := rand.Read(dek); err != nil {
		return core.Credential{}, err
	}
	da, err := gcm(dek)
	if err != nil {
		return core.Credential{}, err
	}
	sealed, err := seal(da, secret, aad(c))
	if err != nil {
		return core.Credential{}, err
	}
	wrapped, err := seal(s.keys.keys[s.keys.active], dek, wrapAAD(c.ID, s.keys.active))
	if err != nil {
		return core.Credential{}, err
	}
	rec := core.SealedCredential{Credential: c, KeyID: s.keys.active, WrappedKey: wrapped, Sealed: sealed}
	if err := s.st.InsertCredential(ctx, rec, MaxPerProject); err != nil {
		return core.Credential{}, err
	}
	return c, nil
}

// ListCredentials returns a project's credentials (never their secrets).
func (s *Shared) ListCredentials(ctx context.Context, projectID string) ([]core.Credential, error) {
	recs, err := s.st.ListCredentialRecords(ctx, projectID, "", MaxPerProject)
	if err != nil {
		return nil, err
	}
	out := make([]core.Credential, 0, len(recs))
	for _, r := range recs {
		out = append(out, r.Credential)
	}
	return out, nil
}

// GetCredential returns one credential of a project (never its secret).
func (s *Shared) GetCredential(ctx context.Context, projectID, id string) (core.Credential, error) {
	if !ValidID(id) {
		return core.Credential{}, fmt.Errorf("credential %.40q: %w", id, core.ErrNotFound)
	}
	r, err := s.st.GetCredentialRecord(ctx, projectID, id)
	return r.Credential, err
}

// CredentialOwner returns the project that owns credential id ("" if
// none), for the audit log of refused cross-project access.
func (s *Shared) CredentialOwner(id string) string {
	if !ValidID(id) {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := s.st.GetCredentialRecord(ctx, "", id)
	if err != nil {
		return ""
	}
	return r.Credential.ProjectID
}

// DeleteCredential removes a credential; the nodes stop injecting it.
func (s *Shared) DeleteCredential(ctx context.Context, projectID, id string) error {
	if !ValidID(id) {
		return fmt.Errorf("credential %.40q: %w", id, core.ErrNotFound)
	}
	if err := s.st.DeleteCredentialRecord(ctx, projectID, id); err != nil {
		return err
	}
	s.onDelete(ctx, id)
	return nil
}

// openRecord opens a record's secret.
func (s *Shared) openRecord(r core.SealedCredential) ([]byte, error) {
	ka, ok := s.keys.keys[r.KeyID]
	if !ok {
		return nil, fmt.Errorf("credstore: %s is sealed under operator key %s, which this server does not have: %w", r.Credential.ID, r.KeyID, core.ErrUnavailable)
	}
	dek, err := openSealed(ka, r.WrappedKey, wrapAAD(r.Credential.ID, r.KeyID))
	if err != nil {
		return nil, fmt.Errorf("credstore: %s: data key does not open (wrong key or edited record)", r.Credential.ID)
	}
	da, err := gcm(dek)
	if err != nil {
		return nil, err
	}
	sec, err := openSealed(da, r.Sealed, aad(r.Credential))
	if err != nil {
		return nil, fmt.Errorf("credstore: %s does not decrypt (edited record)", r.Credential.ID)
	}
	return sec, nil
}

// Resolve opens a project's credentials for a gateway.
func (s *Shared) Resolve(ctx context.Context, projectID string, ids []string) ([]egress.Credential, []core.Credential, error) {
	var out []egress.Credential
	var infos []core.Credential
	for _, id := range ids {
		if !ValidID(id) {
			return nil, nil, fmt.Errorf("credential %.40q: %w", id, core.ErrNotFound)
		}
		r, err := s.st.GetCredentialRecord(ctx, projectID, id)
		if err != nil {
			return nil, nil, err
		}
		sec, err := s.openRecord(r)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, gatewayCredential(r.Credential, sec))
		infos = append(infos, r.Credential)
	}
	return out, infos, nil
}

// Rewrap re-seals every data key not under the active operator key with
// it (the secrets themselves are not touched). Run it after adding a new
// first key to every replica; once it reports nothing left, the old keys
// can go. It returns how many records it moved and how many it could not
// open (sealed under a key this keyring lacks).
func (s *Shared) Rewrap(ctx context.Context) (moved, missing int, err error) {
	after := ""
	for {
		page, err := s.st.ListCredentialRecords(ctx, "", after, 200)
		if err != nil {
			return moved, missing, err
		}
		for _, r := range page {
			after = r.Credential.ID
			if r.KeyID == s.keys.active {
				continue
			}
			ka, ok := s.keys.keys[r.KeyID]
			if !ok {
				missing++
				continue
			}
			dek, err := openSealed(ka, r.WrappedKey, wrapAAD(r.Credential.ID, r.KeyID))
			if err != nil {
				return moved, missing, fmt.Errorf("credstore: %s: data key does not open", r.Credential.ID)
			}
			wrapped, err := seal(s.keys.keys[s.keys.active], dek, wrapAAD(r.Credential.ID, s.keys.active))
			if err != nil {
				return moved, missing, err
			}
			ok, err = s.st.RewrapCredential(ctx, r.Credential.ID, r.KeyID, s.keys.active, wrapped)
			if err != nil {
				return moved, missing, err
			}
			if ok {
				moved++
			}
		}
		if len(page) < 200 {
			return moved, missing, nil
		}
	}
}
