package namespace

import (
	"context"
	"fmt"

	"github.com/space-sandbox/space/internal/driver"
)

var (
	_ driver.Pauser        = (*Instance)(nil)
	_ driver.LayerInstance = (*Instance)(nil)
)

// Pause implements driver.Pauser: it freezes the sandbox's cgroup, i.e.
// every process in it (PID 1 included) at once.
func (i *Instance) Pause(ctx context.Context) error {
	if err := i.groups[0].Freeze(ctx); err != nil {
		return fmt.Errorf("namespace: pause %s: %w", i.id, err)
	}
	return nil
}

// Resume implements driver.Pauser.
func (i *Instance) Resume(ctx context.Context) error {
	if err := i.groups[0].Thaw(ctx); err != nil {
		return fmt.Errorf("namespace: resume %s: %w", i.id, err)
	}
	return nil
}

// WritableLayer implements driver.LayerInstance: the overlay upper dir.
func (i *Instance) WritableLayer() (driver.Layer, error) {
	return driver.Layer{
		Dir:     i.d.upperDir(i.id),
		UIDBase: i.uidBase, UIDCount: i.d.opts.UIDCount,
	}, nil
}
