package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/egress"
)

// A data dir belongs to one driver: <data-dir>/driver names the driver
// that resolved there first. `--driver auto` is resolved once per data dir
// (a runsc that fails its self-test once must not turn a gVisor node into
// a namespace node that neither sees nor sweeps its gVisor sandboxes), and
// a node or server asked for another driver refuses to start while the
// recorded driver still has sandboxes in the data dir; with none it
// switches and records the new one.

const driverFile = "driver"

// driverStateDirs: where each driver keeps its sandboxes under the data
// dir (newNamespace, newGvisor, newQEMU, newFirecracker).
var driverStateDirs = map[string]string{"namespace": "sandboxes", "gvisor": "gvisor", "qemu": "qemu", "firecracker": "fc"}

// recordedDriver returns the driver recorded in dataDir ("" = none yet).
func recordedDriver(dataDir string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(dataDir, driverFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the data dir's driver: %w", err)
	}
	name := strings.TrimSpace(string(raw))
	if _, ok := driverStateDirs[name]; !ok {
		return "", fmt.Errorf("%s names an unknown driver %.40q: %w", filepath.Join(dataDir, driverFile), name, core.ErrInvalid)
	}
	return name, nil
}

// driverSandboxes lists the sandboxes a driver keeps in dataDir.
func driverSandboxes(dataDir, name string) []string {
	entries, _ := os.ReadDir(filepath.Join(dataDir, driverStateDirs[name]))
	var ids []string
	for _, e := range entries {
		if e.IsDir() && core.ValidSandboxID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// pickDataDirDriver is pickDriver under the data dir's recorded driver.
func pickDataDirDriver(cfg Config, logf func(string, ...any), network *egress.Network) (driver.Driver, string, error) {
	rec, err := recordedDriver(cfg.DataDir)
	if err != nil {
		return nil, "", err
	}
	want := cfg.Driver
	if want == "" {
		want = "auto"
	}
	var left []string
	if rec != "" {
		left = driverSandboxes(cfg.DataDir, rec)
	}
	switch {
	case rec == "" || want == rec:
	case want == "auto":
		// Resolved once: the recorded driver, or nothing while it has
		// sandboxes here.
		c := cfg
		c.Driver = rec
		d, reason, err := pickDriver(c, logf, network)
		if err == nil {
			return d, reason + " (recorded for this data dir)", nil
		}
		if len(left) > 0 {
			return nil, "", fmt.Errorf("driver %s, recorded for data dir %s, which holds %d of its sandboxes, cannot start (%w); fix it, or stop with --driver %s, delete them, then switch",
				rec, cfg.DataDir, len(left), err, rec)
		}
		logf("driver: %s, recorded for this data dir, cannot start (%v) and holds no sandbox: resolving auto again", rec, err)
	case len(left) > 0:
		return nil, "", fmt.Errorf("data dir %s belongs to driver %s, which still has %d sandboxes there (e.g. %s): start with --driver %s (or auto), delete them, then switch to %s: %w",
			cfg.DataDir, rec, len(left), left[0], rec, want, core.ErrConflict)
	}
	d, reason, err := pickDriver(cfg, logf, network)
	if err != nil {
		return nil, "", err
	}
	if d.Name() != rec {
		if _, known := driverStateDirs[d.Name()]; known {
			tmp := filepath.Join(cfg.DataDir, driverFile+".tmp")
			if err := os.WriteFile(tmp, []byte(d.Name()+"\n"), 0o644); err != nil {
				return nil, "", fmt.Errorf("record the data dir's driver: %w", err)
			}
			if err := os.Rename(tmp, filepath.Join(cfg.DataDir, driverFile)); err != nil {
				return nil, "", fmt.Errorf("record the data dir's driver: %w", err)
			}
		}
	}
	return d, reason, nil
}
