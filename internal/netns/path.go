package netns

import (
	"context"
	"fmt"
	"runtime"

	vns "github.com/vishvananda/netns"
)

// SetupPath is Setup for a sandbox whose network namespace is the file
// nsPath (an nsfs bind mount, e.g. one made before the sandbox's first
// process exists, as the gvisor driver does for runsc --network=sandbox).
func (m *Manager) SetupPath(ctx context.Context, id, nsPath string) (*Link, error) {
	ns, err := vns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("netns: sandbox netns %s: %w", nsPath, err)
	}
	defer ns.Close()
	return m.setupIn(ctx, id, ns)
}

// inNetnsHandle runs fn on a thread that has joined the network namespace
// target.
func inNetnsHandle(target vns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	orig, err := vns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := vns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := fn()
	if err := vns.Set(orig); err != nil {
		// Leave the thread locked: the runtime discards it when the goroutine ends.
		return fmt.Errorf("return to host netns: %w", err)
	}
	runtime.UnlockOSThread()
	return ferr
}
