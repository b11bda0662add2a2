package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"
)

// maxKnown bounds the set of digests known to be in the shared store
// (about 25 MiB); when full it starts afresh.
const maxKnown = 200_000

// SharedGCMinAge is the age under which GCShared never deletes an object.
// A capture relies on an object it found in the shared store only if it
// was written less than refreshAfter ago (else it writes it again, which
// renews it), and on what it remembers for knownTTL: both well under
// SharedGCMinAge, so a collection never removes what a capture in flight
// (shorter than the difference) is about to name.
const (
	SharedGCMinAge = time.Hour
	refreshAfter   = 20 * time.Minute
	knownTTL       = 10 * time.Minute
)

// fetchWorkers bounds concurrent fetches from the shared store.
const fetchWorkers = 4

// sharedStore is a Store's shared Backend and the keys known to be there,
// so a capture does not ask again for every chunk it saw already.
type sharedStore struct {
	b     Backend
	mu    sync.Mutex
	known map[string]time.Time // key → when it was last written or seen fresh
}

func (sh *sharedStore) isKnown(key string) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	at, ok := sh.known[key]
	return ok && time.Since(at) < knownTTL
}

func (sh *sharedStore) remember(key string) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if len(sh.known) >= maxKnown {
		sh.known = map[string]time.Time{}
	}
	sh.known[key] = time.Now()
}

// SetShared makes b the store this one shares with other nodes: captures
// put every chunk and then the manifest there too (so a manifest in b
// never names a chunk b lacks), and loads fetch what is missing from the
// local directory there, which then caches it. Call it before the store
// is used.
func (s *Store) SetShared(b Backend) {
	if b == nil {
		s.shared = nil
		return
	}
	s.shared = &sharedStore{b: b, known: map[string]time.Time{}}
}

// Shared returns the shared backend (nil when there is none).
func (s *Store) Shared() Backend {
	if s.shared == nil {
		return nil
	}
	return s.shared.b
}

// publish puts an object into the shared store unless it is there.
func (s *Store) publish(ctx context.Context, key string, data []byte) error {
	sh := s.shared
	if sh == nil || sh.isKnown(key) {
		return nil
	}
	if o, err := sh.b.Stat(ctx, key); err == nil && o.Size == int64(len(data)) && time.Since(o.ModTime) < refreshAfter {
		sh.remember(key)
		return nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshot: shared store: %w", err)
	}
	if err := sh.b.Put(ctx, key, data); err != nil {
		return fmt.Errorf("snapshot: shared store: %w", err)
	}
	sh.remember(key)
	return nil
}

// fetch gets an object from the shared store, checks it against its
// digest, and keeps it at local (a cache: the shared store is trusted
// less than this disk, so nothing unchecked is kept).
func (s *Store) fetch(ctx context.Context, b Backend, key, digest, local string, max int64) ([]byte, error) {
	data, err := b.Get(ctx, key, max)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b, err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != digest {
		return nil, fmt.Errorf("%w: %s from %s does not match its digest", ErrCorrupt, key, b)
	}
	if err := s.writeAtomic(local, data); err != nil {
		return nil, err
	}
	// Not remembered as known: an old object read here may be collected
	// later; a capture that needs it checks (and renews) it.
	return data, nil
}

// prefetch makes every chunk of st and img local, fetching the missing
// ones from b (a few at a time).
func (s *Store) prefetch(ctx context.Context, b Backend, st State, img *ProcessImage) error {
	need := map[string]bool{}
	add := func(chunks []string) {
		for _, c := range chunks {
			if !need[c] {
				if _, err := os.Lstat(s.chunkPath(c)); err != nil {
					need[c] = true
				}
			}
		}
	}
	for _, e := range st {
		if e.Type == TypeFile {
			add(e.Chunks)
		}
	}
	if img != nil {
		img.chunkRefs(func(c string) { add([]string{c}) })
	}
	if len(need) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan string)
	errc := make(chan error, fetchWorkers)
	var wg sync.WaitGroup
	for range min(fetchWorkers, len(need)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range work {
				if _, err := s.fetch(ctx, b, chunkKey(d), d, s.chunkPath(d), ChunkSize); err != nil {
					errc <- fmt.Errorf("snapshot: chunk %s: %w", d, err)
					cancel()
					return
				}
			}
		}()
	}
feed:
	for d := range need {
		select {
		case work <- d:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// The cache is durable before a sandbox depends on it.
	return s.sync()
}

// SharedGCResult says what a collection of the shared store removed.
type SharedGCResult struct {
	ManifestsRemoved int   `json:"manifests_removed"`
	ChunksRemoved    int   `json:"chunks_removed"`
	BytesRemoved     int64 `json:"bytes_removed"`
	ChunksKept       int   `json:"chunks_kept"`
}

// GCShared removes from the shared store every manifest not in keep and
// every chunk no kept manifest names, among objects older than minAge
// (captures in flight on other nodes write objects their database does not
// name yet: minAge must exceed the longest capture). A kept manifest that
// cannot be read stops the collection before anything is deleted; one that
// is neither here nor in the shared store (captured before the store was
// configured, on another node) names nothing the shared store must keep.
// When not one kept manifest is found (a store pointed at the wrong
// bucket or prefix?) nothing is deleted.
func (s *Store) GCShared(ctx context.Context, keep []string, minAge time.Duration) (SharedGCResult, error) {
	var res SharedGCResult
	if s.shared == nil {
		return res, nil
	}
	b := s.shared.b
	keepM := map[string]bool{}
	refs := map[string]bool{}
	found := 0
	for _, d := range keep {
		m, err := s.loadManifest(ctx, d, b)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return res, fmt.Errorf("snapshot: shared gc: kept %w", err)
		}
		found++
		keepM[d] = true
		for _, e := range m.Entries {
			for _, c := range e.Chunks {
				refs[c] = true
			}
		}
		if m.Process != nil {
			m.Process.chunkRefs(func(c string) { refs[c] = true })
		}
	}
	if len(keep) > 0 && found == 0 {
		return res, fmt.Errorf("snapshot: shared gc: none of the %d kept manifests is in the shared store %s; collecting nothing", len(keep), b)
	}
	cutoff := time.Now().Add(-minAge)
	var drop []ObjectInfo
	err := b.List(ctx, "manifests/", func(o ObjectInfo) error {
		d := strings.TrimPrefix(o.Key, "manifests/")
		if ValidDigest(d) && !keepM[d] && o.ModTime.Before(cutoff) {
			drop = append(drop, o)
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("snapshot: shared gc: %w", err)
	}
	// Manifests first: a chunk is never gone while a manifest names it.
	for _, o := range drop {
		if err := b.Delete(ctx, o.Key); err != nil {
			return res, fmt.Errorf("snapshot: shared gc: %w", err)
		}
		res.ManifestsRemoved++
	}
	drop = drop[:0]
	err = b.List(ctx, "chunks/", func(o ObjectInfo) error {
		d := o.Key[strings.LastIndexByte(o.Key, '/')+1:]
		switch {
		case !ValidDigest(d) || o.Key != chunkKey(d):
		case refs[d] || !o.ModTime.Before(cutoff):
			res.ChunksKept++
		default:
			drop = append(drop, o)
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("snapshot: shared gc: %w", err)
	}
	for _, o := range drop {
		if err := b.Delete(ctx, o.Key); err != nil {
			return res, fmt.Errorf("snapshot: shared gc: %w", err)
		}
		s.shared.mu.Lock()
		delete(s.shared.known, o.Key)
		s.shared.mu.Unlock()
		res.ChunksRemoved++
		res.BytesRemoved += o.Size
	}
	return res, nil
}

// ReadLocal returns an object of the local directory by its backend key
// ("manifests/<digest>" or "chunks/<xx>/<digest>"), so that a node can
// serve what it holds to a peer (which checks it against its digest).
func (s *Store) ReadLocal(key string, max int64) ([]byte, error) {
	var p string
	if d, ok := strings.CutPrefix(key, "manifests/"); ok && ValidDigest(d) {
		p = s.manifestPath(d)
	} else if rest, ok := strings.CutPrefix(key, "chunks/"); ok && len(rest) > 3 && ValidDigest(rest[3:]) && key == chunkKey(rest[3:]) {
		p = s.chunkPath(rest[3:])
	} else {
		return nil, fmt.Errorf("snapshot: object key %.100q: %w", key, fs.ErrNotExist)
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	defer f.Close()
	return readBounded(f, key, max)
}
