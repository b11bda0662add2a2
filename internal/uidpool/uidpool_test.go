package uidpool

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// testStart is far above the default pool: these registries are private,
// so their blocks must be ids no node hands out (TestReclaimSkipsRunningBlock
// runs a process as one).
const testStart = 3 << 30

func testPool(t *testing.T, blocks uint32) (*Pool, string) {
	t.Helper()
	dir := t.TempDir()
	p, err := Open(filepath.Join(dir, "reg"), testStart, blocks*BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	return p, dir
}

func owner(t *testing.T, dir, name string) string {
	t.Helper()
	o := filepath.Join(dir, name)
	if err := os.MkdirAll(o, 0o700); err != nil {
		t.Fatal(err)
	}
	return o
}

// Concurrent allocators (two Pools over one registry, as two nodes on a
// host) never get the same block, and a full pool says so.
func TestAllocNeverTwice(t *testing.T) {
	p, dir := testPool(t, 16)
	q, err := Open(p.dir, testStart, 16*BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen = map[uint32]string{}
		wg   sync.WaitGroup
	)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pool := []*Pool{p, q}[g%2]
			for i := range 2 {
				o := owner(t, dir, filepath.Join("g", string(rune('a'+g)), string(rune('a'+i))))
				base, err := pool.Alloc(o)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if prev, ok := seen[base]; ok {
					t.Errorf("block %d handed to %s and %s", base, prev, o)
				}
				seen[base] = o
				mu.Unlock()
				if !p.Contains(base) {
					t.Errorf("block %d outside the pool", base)
				}
			}
		}()
	}
	wg.Wait()
	if len(seen) != 16 {
		t.Fatalf("%d blocks handed out, want 16", len(seen))
	}
	if _, err := p.Alloc(owner(t, dir, "one-too-many")); err != ErrExhausted {
		t.Fatalf("full pool: %v, want ErrExhausted", err)
	}
}

// Free makes a block available again; only its owner can free it; a block
// whose owner dir is gone is reclaimed when nothing else is free.
func TestFreeAdoptReclaim(t *testing.T) {
	p, dir := testPool(t, 2)
	a, b := owner(t, dir, "a"), owner(t, dir, "b")
	ba, err := p.Alloc(a)
	if err != nil {
		t.Fatal(err)
	}
	bb, err := p.Alloc(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Free(ba, b); err != nil {
		t.Fatal(err)
	}
	if o, _ := p.Owner(ba); o != a {
		t.Fatalf("b freed a's block: owner now %q", o)
	}
	if err := p.Adopt(ba, a); err != nil {
		t.Fatalf("adopt own block: %v", err)
	}
	if err := p.Adopt(ba, b); err == nil {
		t.Fatal("b adopted a's block")
	}
	// The registry lost a's entry (/run emptied): a restarted node's
	// Adopt records it again, and nobody else gets the block meanwhile.
	if err := os.Remove(p.entry(ba)); err != nil {
		t.Fatal(err)
	}
	if err := p.Adopt(ba, a); err != nil {
		t.Fatalf("adopt after the registry lost the block: %v", err)
	}
	if o, _ := p.Owner(ba); o != a {
		t.Fatalf("re-adopted block owned by %q", o)
	}
	if err := p.Free(ba, a); err != nil {
		t.Fatal(err)
	}
	c := owner(t, dir, "c")
	if got, err := p.Alloc(c); err != nil || got != ba {
		t.Fatalf("alloc after free: %d, %v; want %d", got, err, ba)
	}
	// b's sandbox dir vanished without a Free (a kill -9 mid-teardown).
	if err := os.RemoveAll(b); err != nil {
		t.Fatal(err)
	}
	d := owner(t, dir, "d")
	if got, err := p.Alloc(d); err != nil || got != bb {
		t.Fatalf("reclaim: %d, %v; want %d", got, err, bb)
	}
	if o, _ := p.Owner(bb); o != d {
		t.Fatalf("reclaimed block owned by %q", o)
	}
}

func TestOpenRejectsBadRanges(t *testing.T) {
	for _, r := range [][2]uint32{{0, BlockSize}, {100000, BlockSize}, {DefaultStart, 1000}, {DefaultStart, 0}, {1<<32 - BlockSize, 2 * BlockSize}} {
		if _, err := Open(t.TempDir(), r[0], r[1]); err == nil {
			t.Errorf("Open(%d, %d) accepted", r[0], r[1])
		}
	}
	if s, c, err := ParseRange("16777216:1073741824"); err != nil || s != DefaultStart || c != DefaultCount {
		t.Fatalf("ParseRange: %d %d %v", s, c, err)
	}
}

// A block whose owner dir is gone is still not reclaimed while a process
// runs with one of its uids (a sandbox whose state dir was removed without
// a teardown).
func TestReclaimSkipsRunningBlock(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a process as the block's uid")
	}
	p, dir := testPool(t, 1)
	gone := owner(t, dir, "gone")
	base, err := p.Alloc(gone)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("/bin/sleep", "60")
	sleeper.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: base + 5, Gid: base + 5, NoSetGroups: true}}
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer sleeper.Wait()
	defer sleeper.Process.Kill()
	if got, err := p.Alloc(owner(t, dir, "new")); err != ErrExhausted {
		t.Fatalf("reclaimed block %d (%v) while uid %d runs", got, err, base+5)
	}
	_ = sleeper.Process.Kill()
	_ = sleeper.Wait()
	if got, err := p.Alloc(owner(t, dir, "new2")); err != nil || got != base {
		t.Fatalf("reclaim after the process ended: %d %v", got, err)
	}
}

// Alloc's hint (the block after its last one) never hands out a block
// another Pool over the same registry took meanwhile, and a block this
// Pool frees is the next it hands out.
func TestAllocHintSkipsTakenBlocks(t *testing.T) {
	p, dir := testPool(t, 8)
	q, err := Open(p.dir, testStart, 8*BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.Alloc(owner(t, dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := q.Alloc(owner(t, dir, "b")) // the block p's hint names
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Alloc(owner(t, dir, "c"))
	if err != nil {
		t.Fatal(err)
	}
	if a != testStart || b != testStart+BlockSize || c != testStart+2*BlockSize {
		t.Fatalf("blocks %d, %d, %d; want the first three in order", a, b, c)
	}
	if o, _ := p.Owner(b); o != filepath.Join(dir, "b") {
		t.Fatalf("q's block now owned by %q", o)
	}
	if err := p.Free(a, filepath.Join(dir, "a")); err != nil {
		t.Fatal(err)
	}
	if got, err := p.Alloc(owner(t, dir, "d")); err != nil || got != a {
		t.Fatalf("alloc after free: %d, %v; want %d", got, err, a)
	}
	ents, err := os.ReadDir(p.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if filepath.Ext(e.Name()) == ".tmp" {
			t.Errorf("left %s in the registry", e.Name())
		}
	}
}
