package node

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/driver"
)

// stateInst is a driver instance that records pauses, resumes and its
// destruction, and fails a pause or resume that overlaps another.
type stateInst struct {
	mu        sync.Mutex
	busy      bool
	overlap   bool
	destroyed bool
}

func (i *stateInst) ID() string { return "sb" }
func (i *stateInst) Dial(context.Context) (net.Conn, error) {
	return nil, errors.New("no agent")
}
func (i *stateInst) SetLimits(context.Context, driver.Limits) error { return nil }
func (i *stateInst) OOMKills() (uint64, error)                      { return 0, nil }
func (i *stateInst) Timing() driver.Timing                          { return driver.Timing{} }
func (i *stateInst) Destroy(context.Context) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.destroyed = true
	return nil
}
func (i *stateInst) step() error {
	i.mu.Lock()
	if i.busy {
		i.overlap = true
	}
	i.busy = true
	i.mu.Unlock()
	time.Sleep(20 * time.Millisecond)
	i.mu.Lock()
	i.busy = false
	i.mu.Unlock()
	return nil
}
func (i *stateInst) Pause(context.Context) error  { return i.step() }
func (i *stateInst) Resume(context.Context) error { return i.step() }

// namedDriver is a driver with a name and nothing else.
type namedDriver struct{ driver.Driver }

func (namedDriver) Name() string { return "test" }

// TestSandboxStateLock: pauses and resumes of one sandbox never overlap,
// a stop waits for a snapshot (here: the held lock) in flight and then
// destroys, and nothing finds the sandbox after its stop.
func TestSandboxStateLock(t *testing.T) {
	n := &Node{sandboxes: map[string]*Sandbox{}, o: Options{Driver: namedDriver{}}}
	inst := &stateInst{}
	h := newSandbox("sb", inst, t.TempDir(), n)
	n.sandboxes["sb"] = h
	ctx := context.Background()
	var wg sync.WaitGroup
	for k := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if k%2 == 0 {
				err = n.PauseSandbox(ctx, "sb")
			} else {
				err = n.ResumeSandbox(ctx, "sb")
			}
			if err != nil {
				t.Errorf("pause/resume %d: %v", k, err)
			}
		}()
	}
	wg.Wait()
	if inst.overlap {
		t.Fatal("a pause and a resume of the sandbox ran at once")
	}
	// A snapshot in flight holds the lock; the stop waits for it.
	held, err := n.lockedSandbox(ctx, "sb")
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		released <- time.Now()
		held.unlockState()
	}()
	if err := n.StopSandbox(ctx, "sb"); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if at := <-released; stopped.Before(at) {
		t.Errorf("the stop returned %v before the snapshot in flight ended", at.Sub(stopped))
	}
	if !inst.destroyed {
		t.Error("the stop did not destroy the instance")
	}
	if _, err := n.lockedSandbox(ctx, "sb"); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("after the stop: %v, want ErrNotFound", err)
	}
	// A waiter whose context ends gives up.
	h2 := newSandbox("sb2", &stateInst{}, t.TempDir(), n)
	n.sandboxes["sb2"] = h2
	if _, err := n.lockedSandbox(ctx, "sb2"); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := n.PauseSandbox(short, "sb2"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("pause behind a held lock with a short context: %v", err)
	}
}
