package bench

import (
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestInOwnMountNS: a thread that unshares its mount namespace for crun's
// hybrid-cgroup workaround is back in the process's namespace afterwards
// (CI: the locked thread was once the main one, which the runtime parks
// rather than ends, and /proc/self then showed the private namespace, so
// gVisor sandboxes' destroys did not find their mounts: "unlinkat …/console:
// device or resource busy").
func TestInOwnMountNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("unsharing a mount namespace needs root")
	}
	type result struct {
		before, inside, after string
		err                   error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		var r result
		r.before, _ = os.Readlink("/proc/thread-self/ns/mnt")
		r.err = inOwnMountNS(func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return err
			}
			r.inside, _ = os.Readlink("/proc/thread-self/ns/mnt")
			return nil
		})
		r.after, _ = os.Readlink("/proc/thread-self/ns/mnt")
		ch <- r
	}()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.inside == r.before {
		t.Fatalf("the unshare did not take: %s", r.inside)
	}
	if r.after != r.before {
		t.Fatalf("thread left in mount namespace %s, want %s back", r.after, r.before)
	}
}
