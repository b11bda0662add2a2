package server

import (
	"cmp"
	"fmt"
	"path/filepath"

	"github.com/space-sandbox/space/internal/diskquota"
	"github.com/space-sandbox/space/internal/driver"
)

// defaultDisk is the disk limit of a sandbox whose request names none: the
// default, else the maximum (0: disks are not limited).
func defaultDisk(cfg Config) int64 {
	return cmp.Or(cfg.DefaultLimits.DiskBytes, cfg.MaxLimits.DiskBytes)
}

// driverDefaults are the limits the driver and the node's warm pool apply
// where a spec names none.
func driverDefaults(cfg Config) driver.Limits {
	return driver.Limits{MemoryBytes: cfg.DefaultLimits.MemoryBytes, CPUMillis: cfg.DefaultLimits.CPUMillis,
		Pids: cfg.DefaultLimits.Pids, DiskBytes: defaultDisk(cfg)}
}

// withDisks validates the disk limits and, where they are on, opens the
// manager of the sandboxes' disk images (blank images cached in
// <data-dir>/disks) for the container drivers. The VM drivers size their
// writable disks themselves.
func withDisks(cfg Config) (Config, error) {
	d, mx := cfg.DefaultLimits.DiskBytes, cfg.MaxLimits.DiskBytes
	if d < 0 || mx < 0 || d > 0 && d < diskquota.MinBytes || mx > 0 && mx < diskquota.MinBytes {
		return cfg, fmt.Errorf("disk limits: --default-disk-bytes and --max-disk-bytes must be 0 (none) or at least %d MiB", diskquota.MinBytes>>20)
	}
	if d > 0 && mx > 0 && d > mx {
		return cfg, fmt.Errorf("disk limits: --default-disk-bytes %d above --max-disk-bytes %d", d, mx)
	}
	if defaultDisk(cfg) == 0 {
		return cfg, nil
	}
	m, err := diskquota.New(diskquota.Options{CacheDir: filepath.Join(cfg.DataDir, "disks"), Logf: cfg.Logf})
	if err != nil {
		return cfg, fmt.Errorf("disk limits (--default-disk-bytes/--max-disk-bytes) need per-sandbox disk images: %w", err)
	}
	cfg.disks = m
	cfg.Logf("disk limits: default %d MiB, max %d MiB (0: none); each sandbox's writable layer is an ext4 image of its limit", defaultDisk(cfg)>>20, mx>>20)
	return cfg, nil
}
