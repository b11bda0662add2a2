package server

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/egress"
)

// tidyHost runs when a server (or `space node`) has stopped: with no
// sandbox left running (left == 0; warm-pool sandboxes are gone by then)
// it removes what only sandboxes needed: the egress table, the sandbox
// cgroup directories and the run directory. With sandboxes left it keeps
// all of that for them: the next start re-adopts them.
func tidyHost(cfg Config, left int, n *egress.Network) {
	logf := cfg.Logf
	if left > 0 {
		logf("shutdown: %d sandboxes keep running and are re-adopted at the next start; their network rules, cgroups and sockets stay", left)
		return
	}
	var removed, kept []string
	if n != nil {
		switch ok, err := n.RemoveIfUnused(2 * time.Second); {
		case ok:
			removed = append(removed, "nftables table "+n.Links.Config().Table)
		case err != nil:
			kept = append(kept, err.Error())
		}
	}
	// Every driver's base (one driver runs, but a data dir may have seen
	// another); RemoveBase only removes empty directories.
	base := cgroupBase(cfg.DataDir)
	bases := []string{base, base + "-gvisor", base + "-qemu"}
	before := cgroupDirs(bases)
	for _, b := range bases {
		if m, err := cgroups.New(b); err == nil {
			m.RemoveBase()
		}
	}
	if cfg.CgroupParent != "" {
		// The namespace driver's base below --cgroup-parent (the parent
		// itself is the operator's).
		if m, err := cgroups.NewUnder(cfg.CgroupParent, base); err == nil {
			m.RemoveBase()
		}
	}
	// runsc makes the same names in hierarchies the cgroups package does
	// not manage (blkio, cpuset, devices, freezer, systemd, ...): remove
	// those too, deepest first, each only if empty.
	removeEmptyTrees(before)
	var gone, still []string
	for _, d := range before {
		if _, err := os.Stat(d); errors.Is(err, fs.ErrNotExist) {
			gone = append(gone, d)
		} else {
			still = append(still, d)
		}
	}
	if len(gone) > 0 {
		removed = append(removed, fmt.Sprintf("cgroups %v", gone))
	}
	if len(still) > 0 {
		kept = append(kept, fmt.Sprintf("cgroups %v (not empty)", still))
	}
	// Only the directories the drivers make there, and only when empty:
	// a run dir shared with anything else is left alone.
	if cfg.RunDir != "" {
		for _, d := range []string{filepath.Join(cfg.RunDir, "gvisor", "runsc"), filepath.Join(cfg.RunDir, "gvisor"), cfg.RunDir} {
			os.Remove(d)
		}
		if _, err := os.Stat(cfg.RunDir); errors.Is(err, fs.ErrNotExist) {
			removed = append(removed, "run dir "+cfg.RunDir)
		} else {
			kept = append(kept, "run dir "+cfg.RunDir+" (not empty)")
		}
	}
	msg := "shutdown: no sandboxes left: removed " + strings.Join(removed, ", ")
	if len(kept) > 0 {
		msg += "; kept " + strings.Join(kept, "; ")
	}
	logf("%s", msg)
}

// removeEmptyTrees removes each directory of dirs and what is below it,
// deepest first; a cgroup that still has processes or children refuses.
func removeEmptyTrees(dirs []string) {
	for _, d := range dirs {
		var all []string
		filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		for i := len(all) - 1; i >= 0; i-- {
			os.Remove(all[i])
		}
	}
}

// cgroupDirs lists the cgroup directories named one of names (in any
// hierarchy) that exist.
func cgroupDirs(names []string) []string {
	var out []string
	filepath.WalkDir("/sys/fs/cgroup", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if strings.Count(p, "/") > 10 {
			return filepath.SkipDir
		}
		for _, n := range names {
			if d.Name() == n {
				out = append(out, p)
				return filepath.SkipDir
			}
		}
		return nil
	})
	return out
}
