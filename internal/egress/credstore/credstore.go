// Package credstore keeps the platform's egress credentials: one file per
// credential under a directory only root can read, the secret sealed with
// AES-256-GCM under a key that is not stored with the files (a server key
// file, or the store's meta). The binding (project, host, port, header,
// prefix, methods, path) is the sealing's additional data, so a binding
// edited on disk no longer decrypts. Secrets leave this package only as
// egress.Credential values for the gateway; nothing here returns them
// through the API.
package credstore

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/egress"
)

// MaxPerProject bounds how many credentials a project may hold.
const MaxPerProject = 256

var (
	idRE  = regexp.MustCompile(`^cred-[0-9a-f]{16}$`)
	envRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
)

// ValidID reports whether id has the shape of a credential id.
func ValidID(id string) bool { return idRE.MatchString(id) }

// Store is the credential store.
type Store struct {
	dir      string
	aead     cipher.AEAD
	now      func() time.Time
	onDelete func(id string)

	mu sync.Mutex
}

// record is a credential as stored on disk.
type record struct {
	core.Credential
	Nonce  []byte `json:"nonce"`
	Sealed []byte `json:"sealed"`
}

// Open opens (creating) a store in dir with a 32-byte key. onDelete, if
// set, is told of every deleted credential (the gateway drops it from the
// sandboxes it is attached to).
func Open(dir string, key []byte, onDelete func(id string)) (*Store, error) {
	if len(key) != 32 {
		return nil, errors.New("credstore: key must be 32 bytes")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("credstore: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("credstore: %w", err)
	}
	blk, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(blk)
	if err != nil {
		return nil, err
	}
	if onDelete == nil {
		onDelete = func(string) {}
	}
	return &Store{dir: dir, aead: aead, now: time.Now, onDelete: onDelete}, nil
}

// KeyFromFile reads a 32-byte key (64 hex digits) from path, creating it
// (mode 0600) with a random key when it does not exist.
func KeyFromFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			if errors.Is(err, os.ErrExist) {
				return KeyFromFile(path)
			}
			return nil, err
		}
		_, werr := f.WriteString(hex.EncodeToString(key) + "\n")
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return nil, werr
		}
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("credstore: key file: %w", err)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("credstore: key file %s must hold 64 hex digits", path)
	}
	return key, nil
}

// Meta is the part of the server's store that holds a generated key.
type Meta interface {
	PutMetaIfAbsent(ctx context.Context, key string, val []byte) ([]byte, error)
}

// KeyFromMeta returns the key kept in the store's meta, generating it on
// first use.
func KeyFromMeta(ctx context.Context, m Meta) ([]byte, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	got, err := m.PutMetaIfAbsent(ctx, "egress_credential_key", key)
	if err != nil {
		return nil, fmt.Errorf("credstore: key: %w", err)
	}
	if len(got) != 32 {
		return nil, errors.New("credstore: stored key has the wrong length")
	}
	return got, nil
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", core.ErrInvalid, fmt.Sprintf(format, a...))
}

// aad binds the sealed secret to its record.
func aad(c core.Credential) []byte {
	return []byte(strings.Join([]string{"space-credential-v1", c.ID, c.ProjectID, c.Host, strconv.Itoa(int(c.Port)),
		c.Header, c.Prefix, strings.Join(c.Methods, ","), c.PathPrefix, c.Placeholder}, "\x00"))
}

func (s *Store) path(id string) string { return filepath.Join(s.dir, id+".json") }

// newCredential validates a request and makes the credential it
// describes (a fresh id and placeholder) and its secret: the one policy of
// what a credential may be, for the file store and the shared one.
func newCredential(projectID string, req core.CredentialRequest, now time.Time) (core.Credential, []byte, error) {
	if len(req.Name) > 128 {
		return core.Credential{}, nil, invalid("name longer than 128 bytes")
	}
	if req.Env != "" && !envRE.MatchString(req.Env) {
		return core.Credential{}, nil, invalid("env must be an environment variable name")
	}
	rnd := make([]byte, 8)
	if _, err := rand.Read(rnd); err != nil {
		return core.Credential{}, nil, err
	}
	id := "cred-" + hex.EncodeToString(rnd)
	b, err := egress.ValidateCredential(egress.Credential{ID: id, Host: req.Host, Port: req.Port, Header: req.Header,
		Prefix: req.Prefix, Methods: req.Methods, PathPrefix: req.PathPrefix,
		Placeholder: egress.PlaceholderPrefix + hex.EncodeToString(rnd), Secret: []byte(req.Secret)})
	if err != nil {
		return core.Credential{}, nil, invalid("%v", err)
	}
	c := core.Credential{ID: id, ProjectID: projectID, Name: req.Name, Host: b.Host, Port: b.Port, Header: b.Header,
		Prefix: b.Prefix, Methods: b.Methods, PathPrefix: b.PathPrefix, Env: req.Env, Placeholder: b.Placeholder,
		CreatedAt: now.UTC().Truncate(time.Second)}
	return c, b.Secret, nil
}

// gatewayCredential is c with its secret, as the gateway injects it.
func gatewayCredential(c core.Credential, secret []byte) egress.Credential {
	return egress.Credential{ID: c.ID, Host: c.Host, Port: c.Port, Header: c.Header, Prefix: c.Prefix,
		Methods: c.Methods, PathPrefix: c.PathPrefix, Placeholder: c.Placeholder, Secret: secret}
}

// CreateCredential validates, seals and stores a credential.
func (s *Store) CreateCredential(ctx context.Context, projectID string, req core.CredentialRequest) (core.Credential, error) {
	c, secret, err := newCredential(projectID, req, s.now())
	if err != nil {
		return core.Credential{}, err
	}
	id := c.ID
	s.mu.Lock()
	defer s.mu.Unlock()
	list, err := s.list(projectID)
	if err != nil {
		return core.Credential{}, err
	}
	if len(list) >= MaxPerProject {
		return core.Credential{}, fmt.Errorf("at most %d credentials per project: %w", MaxPerProject, core.ErrExhausted)
	}
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return core.Credential{}, err
	}
	rec := record{Credential: c, Nonce: nonce, Sealed: s.aead.Seal(nil, nonce, secret, aad(c))}
	data, err := json.Marshal(rec)
	if err != nil {
		return core.Credential{}, err
	}
	tmp := s.path(id) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return core.Credential{}, fmt.Errorf("credstore: %w", err)
	}
	if err := os.Rename(tmp, s.path(id)); err != nil {
		os.Remove(tmp)
		return core.Credential{}, fmt.Errorf("credstore: %w", err)
	}
	return c, nil
}

func (s *Store) read(projectID, id string) (record, error) {
	var rec record
	if !ValidID(id) {
		return rec, fmt.Errorf("credential %.40q: %w", id, core.ErrNotFound)
	}
	data, err := os.ReadFile(s.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return rec, fmt.Errorf("credential %s: %w", id, core.ErrNotFound)
	}
	if err != nil {
		return rec, fmt.Errorf("credstore: %w", err)
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("credstore: %s: %w", id, err)
	}
	if rec.ID != id || rec.ProjectID != projectID {
		return rec, fmt.Errorf("credential %s: %w", id, core.ErrNotFound)
	}
	return rec, nil
}

func (s *Store) list(projectID string) ([]core.Credential, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("credstore: %w", err)
	}
	out := []core.Credential{}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !ValidID(id) {
			continue
		}
		rec, err := s.read(projectID, id)
		if errors.Is(err, core.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, rec.Credential)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// ListCredentials returns a project's credentials (never their secrets).
func (s *Store) ListCredentials(ctx context.Context, projectID string) ([]core.Credential, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.list(projectID)
}

// GetCredential returns one credential of a project (never its secret).
func (s *Store) GetCredential(ctx context.Context, projectID, id string) (core.Credential, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.read(projectID, id)
	return rec.Credential, err
}

// CredentialOwner returns the project that owns credential id ("" if none),
// for the audit log of refused cross-project access.
func (s *Store) CredentialOwner(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ValidID(id) {
		return ""
	}
	data, err := os.ReadFile(s.path(id))
	if err != nil {
		return ""
	}
	var rec record
	if json.Unmarshal(data, &rec) != nil || rec.ID != id {
		return ""
	}
	return rec.ProjectID
}

// DeleteCredential removes a credential; sandboxes it is attached to stop
// getting it at once.
func (s *Store) DeleteCredential(ctx context.Context, projectID, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.read(projectID, id); err != nil {
		return err
	}
	if err := os.Remove(s.path(id)); err != nil {
		return fmt.Errorf("credstore: %w", err)
	}
	s.onDelete(id)
	return nil
}

// Resolve opens a project's credentials for the gateway.
func (s *Store) Resolve(ctx context.Context, projectID string, ids []string) ([]egress.Credential, []core.Credential, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []egress.Credential
	var infos []core.Credential
	for _, id := range ids {
		rec, err := s.read(projectID, id)
		if err != nil {
			return nil, nil, err
		}
		if len(rec.Nonce) != s.aead.NonceSize() {
			return nil, nil, fmt.Errorf("credstore: %s: bad nonce", id)
		}
		sec, err := s.aead.Open(nil, rec.Nonce, rec.Sealed, aad(rec.Credential))
		if err != nil {
			return nil, nil, fmt.Errorf("credstore: %s does not decrypt (wrong key or edited record)", id)
		}
		out = append(out, gatewayCredential(rec.Credential, sec))
		infos = append(infos, rec.Credential)
	}
	return out, infos, nil
}
