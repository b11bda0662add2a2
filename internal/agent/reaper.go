package agent

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A process's wait status is process-wide state: whoever calls wait first
// takes it. If the agent, as PID 1, reaped orphans with wait4(-1) next to
// os/exec's per-child Wait, it would steal its own commands' exit statuses.
// So there is exactly one owner of all waiting: the reaper. Commands are
// started through reaper.spawn (never os/exec), and every status the reaper
// collects is dispatched by pid to the goroutine waiting on that child.
//
// Modes: with reapAll (PID 1, or a subreaper) each pass calls wait4(-1) and
// discards statuses of orphans nobody waits for; otherwise it waits only on
// the pids it spawned, so a non-PID-1 agent (tests, an agent under an init)
// cannot disturb other children of its process. Both modes share the spawn,
// registration and dispatch code.
type reaper struct {
	mu      sync.Mutex
	refs    int  // spawned children not yet dispatched + StartReaper callers
	allRefs int  // StartReaper callers: while > 0, reap every child
	running bool // a loop goroutine is doing passes
	waiters map[int]chan unix.WaitStatus
	kick    chan struct{}
}

// sharedReaper is the one reaper of this process. It is package state because
// wait statuses are process state: two reapers would steal from each other.
var sharedReaper = sync.OnceValue(newReaper)

func newReaper() *reaper {
	return &reaper{
		waiters: make(map[int]chan unix.WaitStatus),
		kick:    make(chan struct{}, 1),
	}
}

// StartReaper makes the agent reap every child it has, including orphans
// reparented to it, until ctx is done. It only acts when the agent is PID 1
// (of its pid namespace); elsewhere it returns at once and the agent waits
// only on the commands it started. Exit statuses of commands the Server
// started are never lost: the Server's waits go through the same loop.
func StartReaper(ctx context.Context) {
	if os.Getpid() != 1 {
		return
	}
	sharedReaper().reapAllUntil(ctx)
}

// reapAllUntil switches r to reaping every child until ctx is done.
func (r *reaper) reapAllUntil(ctx context.Context) {
	r.mu.Lock()
	r.allRefs++
	r.refs++
	r.ensureLoopLocked()
	r.mu.Unlock()
	r.wake()
	context.AfterFunc(ctx, func() {
		r.mu.Lock()
		r.allRefs--
		r.mu.Unlock()
		r.release()
	})
}

// spawn runs fork with the reaper's lock held and registers the new child
// before any status can be dispatched, so a child that exits at once is not
// mistaken for an orphan. The returned channel receives the child's exit
// status exactly once; the caller must then call release.
func (r *reaper) spawn(fork func() (int, error)) (int, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiters[pid] = ch
	r.refs++
	r.ensureLoopLocked()
	return pid, ch, nil
}

// release drops a reference taken by spawn or reapAllUntil. The loop stops
// when nothing is left to wait for.
func (r *reaper) release() {
	r.mu.Lock()
	r.refs--
	last := r.refs == 0
	r.mu.Unlock()
	if last {
		r.wake()
	}
}

func (r *reaper) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *reaper) ensureLoopLocked() {
	if r.running {
		return
	}
	r.running = true
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	go r.loop(sig)
}

func (r *reaper) loop(sig chan os.Signal) {
	defer signal.Stop(sig)
	// SIGCHLD cannot be lost (a pending one in the buffer means a pass is
	// still to come), but a slow tick guards against anything that resets
	// the disposition behind our back.
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		r.pass()
		select {
		case <-sig:
		case <-r.kick:
		case <-tick.C:
		}
		r.mu.Lock()
		if r.refs == 0 {
			// Decided under the lock, so a concurrent spawn either sees
			// running=false and starts a new loop, or keeps this one.
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
}

// pass collects every status that is ready without blocking.
func (r *reaper) pass() {
	r.mu.Lock()
	all := r.allRefs > 0
	var pids []int
	if !all {
		pids = make([]int, 0, len(r.waiters))
		for pid := range r.waiters {
			pids = append(pids, pid)
		}
	}
	r.mu.Unlock()

	if all {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || pid <= 0 {
				return
			}
			r.dispatch(pid, ws)
		}
	}
	for _, pid := range pids {
		var ws unix.WaitStatus
		var got int
		var err error
		for {
			got, err = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		if err == nil && got == pid {
			r.dispatch(pid, ws)
		}
	}
}

func (r *reaper) dispatch(pid int, ws unix.WaitStatus) {
	if !ws.Exited() && !ws.Signaled() {
		return // a stop/continue report; the child is still there
	}
	r.mu.Lock()
	ch, ok := r.waiters[pid]
	if ok {
		delete(r.waiters, pid)
	}
	r.mu.Unlock()
	if ok {
		ch <- ws // buffered, never blocks
	}
	// Otherwise an orphan (PID 1 only): reaping it was the point.
}
