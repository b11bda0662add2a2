package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// ExplainAuto runs the server's own `--driver auto` selection (pickDriver:
// KVM, firecracker, qemu, then runsc with its throwaway self-test
// sandbox, then namespace) in a scratch data and run directory, and
// reports the driver it picked, the reason the server would log and put in
// GET /v1/info, and what the drivers logged on the way. Nothing of a
// running server is touched: the scratch directories and their cgroups
// are removed before it returns. runsc is as --runsc ("" = the search).
func ExplainAuto(runsc string) (name, reason string, logs []string, err error) {
	work, err := os.MkdirTemp("", "space-doctor-")
	if err != nil {
		return "", "", nil, err
	}
	defer os.RemoveAll(work)
	// The sandbox's mapped root must walk to the agent and its state.
	if err := os.Chmod(work, 0o711); err != nil {
		return "", "", nil, err
	}
	runDir, err := os.MkdirTemp("/tmp", "spd")
	if err != nil {
		return "", "", nil, err
	}
	defer os.RemoveAll(runDir)
	cfg := DefaultConfig()
	cfg.DataDir, cfg.RunDir, cfg.Runsc, cfg.Driver = work, runDir, runsc, "auto"
	var mu sync.Mutex
	logf := func(format string, args ...any) {
		mu.Lock()
		logs = append(logs, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	cfg.Logf = logf
	defer removeCgroupDirs(cgroupBase(work))
	if cfg.AgentPath, err = installAgent(work); err != nil {
		return "", "", logs, err
	}
	d, reason, err := pickDriver(cfg, logf, nil)
	if err != nil {
		return "", reason, logs, err
	}
	if g, ok := gvisorOf(d); ok {
		path, version := g.Runsc()
		logf("runsc %s (%s)", path, version)
	}
	return d.Name(), reason, logs, nil
}

// removeCgroupDirs removes the (empty) cgroup directories named base,
// base-gvisor and base-qemu in every hierarchy, at the top or below the
// process's own group (runsc makes them in controllers the server's
// cgroups package does not use, such as blkio and devices).
func removeCgroupDirs(base string) {
	for _, name := range []string{base, base + "-gvisor", base + "-qemu"} {
		for depth := 1; depth <= 5; depth++ {
			pattern := "/sys/fs/cgroup/" + strings.Repeat("*/", depth) + name
			dirs, _ := filepath.Glob(pattern)
			for _, d := range dirs {
				_ = os.Remove(d)
			}
		}
	}
}
