package gvisor

import (
	"context"

	"github.com/space-sandbox/space/internal/driver"
)

// Stats implements driver.Statser from the sandbox's host cgroup.
func (i *Instance) Stats(ctx context.Context) (driver.Stats, error) {
	return driver.CgroupStats(i.Cgroup())
}

var _ driver.Statser = (*Instance)(nil)
