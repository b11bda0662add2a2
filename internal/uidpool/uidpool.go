// Package uidpool hands out host uid/gid blocks of 65536 ids, one per
// sandbox, so no two sandboxes share a host id.
//
// The allocation is a registry directory of one file per block in use,
// named by the block's first id and holding its owner, the absolute path
// of the sandbox's state dir. Every change happens under an flock on the
// registry, so processes sharing it (several nodes or test runs on one
// host) never hand a block out twice, and a kill -9 loses nothing: the
// files stay and the lock goes with the process. A block whose owner dir
// no longer exists (a node that died between removing a sandbox and
// freeing its block, a data dir removed wholesale) is reclaimed when the
// pool has no free block left, unless a process still runs with one of
// its uids.
//
// Blocks are aligned to 65536, so pools of different bounds that share a
// registry still never overlap block by block.
package uidpool

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// BlockSize is the ids in a block: a sandbox's 0..65535.
const BlockSize = 65536

// Defaults: 16384 blocks from 2^24, clear of the historical shared range
// (--uid-base, 100000..165535) and of per-node bases below 2^24.
const (
	DefaultStart = 1 << 24
	DefaultCount = 1 << 30 // ids
	DefaultDir   = "/run/space/uid-pool"
	lockName     = ".lock"
	maxOwner     = 4096
)

// ErrExhausted means every block of the pool is in use.
var ErrExhausted = errors.New("uidpool: no free uid block")

// Pool allocates blocks of [start, start+count) from a registry dir.
type Pool struct {
	dir          string
	start, count uint32

	// Where Alloc looks first: the blocks this Pool freed, lowest first,
	// then the block after the last one it handed out. Listing the
	// registry on every create cost 2.5 ms of CPU with 2,000 entries
	// (stop 37); a block named here may have been taken by another process
	// meanwhile, which the exclusive claim (claim) sees, so these are only
	// hints.
	mu    sync.Mutex
	freed []uint64 // offsets from start, at most maxFreed
	next  uint64   // offset from start
	hint  bool     // next was set by an Alloc of this Pool
}

// probes is how many blocks from the hint Alloc tries before it lists the
// registry; maxFreed bounds the freed blocks it remembers.
const (
	probes   = 8
	maxFreed = 4096
)

// Open prepares the registry dir. start must be a multiple of BlockSize
// and count a positive multiple of it.
func Open(dir string, start, count uint32) (*Pool, error) {
	if start%BlockSize != 0 || count == 0 || count%BlockSize != 0 || uint64(start)+uint64(count) > 1<<32-1 {
		return nil, fmt.Errorf("uidpool: range %d:%d must be blocks of %d ids within 32 bits", start, count, BlockSize)
	}
	if start == 0 {
		return nil, errors.New("uidpool: the pool cannot include host root (start 0)")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("uidpool: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("uidpool: %w", err)
	}
	return &Pool{dir: dir, start: start, count: count}, nil
}

// ParseRange parses START:COUNT.
func ParseRange(s string) (start, count uint32, err error) {
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, fmt.Errorf("uidpool: %q is not START:COUNT", s)
	}
	x, err1 := strconv.ParseUint(a, 10, 32)
	y, err2 := strconv.ParseUint(b, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("uidpool: %q: %w", s, err)
	}
	return uint32(x), uint32(y), nil
}

func (p *Pool) String() string {
	return fmt.Sprintf("%d:%d (%d blocks, registry %s)", p.start, p.count, p.count/BlockSize, p.dir)
}

// Overlaps reports whether [base, base+n) meets the pool.
func (p *Pool) Overlaps(base, n uint32) bool {
	return uint64(base) < uint64(p.start)+uint64(p.count) && uint64(p.start) < uint64(base)+uint64(n)
}

// Contains reports whether base is a block of the pool.
func (p *Pool) Contains(base uint32) bool {
	return base >= p.start && base-p.start < p.count && base%BlockSize == 0
}

// lock takes the registry's flock; the returned func releases it.
func (p *Pool) lock() (func(), error) {
	f, err := os.OpenFile(filepath.Join(p.dir, lockName), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("uidpool: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("uidpool: lock: %w", err)
	}
	return func() { _ = f.Close() }, nil
}

func (p *Pool) entry(base uint32) string {
	return filepath.Join(p.dir, strconv.FormatUint(uint64(base), 10))
}

func (p *Pool) owner(base uint32) (string, error) {
	b, err := os.ReadFile(p.entry(base))
	if err != nil {
		return "", err
	}
	if len(b) > maxOwner {
		b = b[:maxOwner]
	}
	return string(b), nil
}

// write records owner for base; the caller holds the lock.
func (p *Pool) write(base uint32, owner string) error {
	tmp := p.entry(base) + ".tmp"
	if err := os.WriteFile(tmp, []byte(owner), 0o600); err != nil {
		return fmt.Errorf("uidpool: %w", err)
	}
	if err := os.Rename(tmp, p.entry(base)); err != nil {
		return fmt.Errorf("uidpool: %w", err)
	}
	return nil
}

// Alloc hands a free block to owner (an absolute path that exists for as
// long as the block is in use) and returns its first id: the lowest block
// this Pool freed, or else the block after the last one it handed out, if
// still free, else the lowest free block in the registry. Low blocks, so the ranges in
// use (and the per-range state others keep, such as idmap's namespaces)
// stay few; a block another process freed below the hint is reused once
// the hint runs into used blocks.
func (p *Pool) Alloc(owner string) (uint32, error) {
	if !filepath.IsAbs(owner) || len(owner) > maxOwner {
		return 0, fmt.Errorf("uidpool: owner %q must be an absolute path", owner)
	}
	unlock, err := p.lock()
	if err != nil {
		return 0, err
	}
	defer unlock()
	for {
		off, ok := p.takeFreed()
		if !ok {
			break
		}
		claimed, err := p.claim(p.start+uint32(off), owner)
		if err != nil {
			return 0, err
		}
		if claimed {
			return p.start + uint32(off), nil
		}
	}
	p.mu.Lock()
	next, hint := p.next, p.hint
	p.mu.Unlock()
	if hint {
		for off := next; off < uint64(p.count) && off < next+probes*BlockSize; off += BlockSize {
			base := p.start + uint32(off)
			ok, err := p.claim(base, owner)
			if err != nil {
				return 0, err
			}
			if ok {
				p.setNext(off + BlockSize)
				return base, nil
			}
		}
	}
	base, err := p.scan(owner)
	if err == nil {
		p.setNext(uint64(base-p.start) + BlockSize)
	}
	return base, err
}

// takeFreed removes and returns the lowest freed block this Pool
// remembers.
func (p *Pool) takeFreed() (uint64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.freed) == 0 {
		return 0, false
	}
	i := 0
	for j, off := range p.freed {
		if off < p.freed[i] {
			i = j
		}
	}
	off := p.freed[i]
	p.freed[i] = p.freed[len(p.freed)-1]
	p.freed = p.freed[:len(p.freed)-1]
	return off, true
}

// setNext moves the hint to off.
func (p *Pool) setNext(off uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next, p.hint = off, true
}

// claim records owner for base unless the block has an entry: the entry is
// written aside and linked into place, which fails if it exists, so a
// block another process took since the hint was set is never overwritten.
// The caller holds the lock.
func (p *Pool) claim(base uint32, owner string) (bool, error) {
	tmp := p.entry(base) + ".tmp"
	if err := os.WriteFile(tmp, []byte(owner), 0o600); err != nil {
		return false, fmt.Errorf("uidpool: %w", err)
	}
	defer os.Remove(tmp)
	err := os.Link(tmp, p.entry(base))
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("uidpool: %w", err)
	}
	return true, nil
}

// scan lists the registry and hands the lowest free block to owner,
// reclaiming a stale one when none is free. The caller holds the lock.
func (p *Pool) scan(owner string) (uint32, error) {
	f, err := os.Open(p.dir)
	if err != nil {
		return 0, fmt.Errorf("uidpool: %w", err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("uidpool: %w", err)
	}
	used := make(map[string]bool, len(names))
	for _, n := range names {
		used[n] = true
	}
	// A gap first; only a full pool pays for checking owners.
	for _, reclaim := range []bool{false, true} {
		for off := uint64(0); off < uint64(p.count); off += BlockSize {
			base := p.start + uint32(off)
			if used[strconv.FormatUint(uint64(base), 10)] {
				if !reclaim {
					continue
				}
				o, err := p.owner(base)
				if err != nil && !errors.Is(err, fs.ErrNotExist) {
					return 0, fmt.Errorf("uidpool: %w", err)
				}
				if err == nil && (!stale(o) || running(base)) {
					continue
				}
			}
			if err := p.write(base, owner); err != nil {
				return 0, err
			}
			return base, nil
		}
	}
	return 0, ErrExhausted
}

// stale reports whether an owner path is gone (and with it its sandbox).
func stale(owner string) bool {
	if !filepath.IsAbs(owner) {
		return true
	}
	_, err := os.Lstat(owner)
	return errors.Is(err, fs.ErrNotExist)
}

// running reports whether a host process runs with a real, effective or
// saved uid in the block at base: a sandbox whose state dir was removed
// without a teardown may still run, and its block is not free then. Only
// read, never signalled.
func running(base uint32) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true // cannot tell: keep the block
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 4 || f[0] != "Uid:" {
				continue
			}
			for _, v := range f[1:4] {
				if u, err := strconv.ParseUint(v, 10, 32); err == nil && u >= uint64(base) && u < uint64(base)+BlockSize {
					return true
				}
			}
			break
		}
	}
	return false
}

// Adopt confirms owner holds base, as after a restart, recording it again
// if the registry lost it (e.g. /run was emptied). It fails if another
// owner holds the block.
func (p *Pool) Adopt(base uint32, owner string) error {
	if !p.Contains(base) {
		return fmt.Errorf("uidpool: %d is not a block of pool %s", base, p)
	}
	unlock, err := p.lock()
	if err != nil {
		return err
	}
	defer unlock()
	o, err := p.owner(base)
	switch {
	case err == nil && o == owner:
		return nil
	case err == nil && !stale(o):
		return fmt.Errorf("uidpool: block %d belongs to %s, not %s", base, o, owner)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("uidpool: %w", err)
	}
	return p.write(base, owner)
}

// Free releases base if owner holds it; freeing a block no longer held is
// not an error (teardown repeats).
func (p *Pool) Free(base uint32, owner string) error {
	unlock, err := p.lock()
	if err != nil {
		return err
	}
	defer unlock()
	o, err := p.owner(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("uidpool: %w", err)
	}
	if o != owner {
		return nil
	}
	if err := os.Remove(p.entry(base)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("uidpool: %w", err)
	}
	if p.Contains(base) {
		p.mu.Lock()
		if len(p.freed) < maxFreed {
			p.freed = append(p.freed, uint64(base-p.start))
		}
		p.mu.Unlock()
	}
	return nil
}

// Owner returns who holds base, "" if nobody.
func (p *Pool) Owner(base uint32) (string, error) {
	o, err := p.owner(base)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	return o, err
}
