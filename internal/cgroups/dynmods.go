package cgroups

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Moving a process into a cgroup (a write to cgroup.procs, in any
// hierarchy, v1 or v2) takes the kernel's cgroup_threadgroup_rwsem for
// writing. In its default mode that lock waits for an RCU grace period
// whenever no other move happened in the last one: 8 ms at the median on
// this project's 2-CPU test host, once per sandbox create, which was most
// of the gap between a namespace sandbox's cold create and `crun run`
// (issue 25). cgroup v2's favordynmods mount option trades that wait for
// slightly dearer forks and exits; from Linux 6.18 on it uses a lock per
// thread group instead, so forks of other processes pay nothing. The
// option is a flag of the whole v2 hierarchy, not of one mount, and on 6.18
// and later it cannot be turned off again until reboot.

// DynModsOption is the cgroup v2 mount option.
const DynModsOption = "favordynmods"

// ErrDynModsUnsupported is returned when the kernel or the host's mounts
// offer no way to set the option.
var ErrDynModsUnsupported = errors.New("cgroups: favordynmods unsupported here")

// DynMods is the state of favordynmods on this host.
type DynMods struct {
	Mount     string // the cgroup v2 mount looked at; "" when there is none
	Supported bool   // the kernel lists the option in /sys/kernel/cgroup/features
	On        bool
}

func (d DynMods) String() string {
	switch {
	case d.Mount == "":
		return "favordynmods n/a (no cgroup v2 mount)"
	case d.On:
		return "favordynmods on"
	case !d.Supported:
		return "favordynmods unsupported by the kernel (cgroup moves wait for an RCU grace period)"
	}
	return "favordynmods off (cgroup moves wait for an RCU grace period)"
}

// ReadDynMods reports the option's state from this process's mount table.
func ReadDynMods() (DynMods, error) {
	d, _, err := readDynMods()
	return d, err
}

// readDynMods also returns the super options of the v2 mount.
func readDynMods() (DynMods, []string, error) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return DynMods{}, nil, fmt.Errorf("cgroups: %w", err)
	}
	features, _ := os.ReadFile("/sys/kernel/cgroup/features")
	return dynModsFromTables(mi, features)
}

func dynModsFromTables(mountinfo, features []byte) (DynMods, []string, error) {
	ms, err := parseMountinfo(mountinfo)
	if err != nil {
		return DynMods{}, nil, fmt.Errorf("cgroups: mountinfo: %w", err)
	}
	var d DynMods
	d.Supported = slices.Contains(strings.Fields(string(features)), DynModsOption)
	for _, m := range ms {
		if m.v2 {
			d.Mount = m.point
			d.On = slices.Contains(m.opts, DynModsOption)
			return d, m.opts, nil
		}
	}
	return d, nil, nil
}

// cgroup2Data is the mount data of a cgroup2 mount that keeps the
// hierarchy's flags as superOpts show them (a cgroup2 mount sets all of
// them, so leaving one out would clear it host-wide) and adds extra.
// rw/ro and seclabel are the VFS's and the LSM's, not cgroup2 parameters.
func cgroup2Data(superOpts []string, extra ...string) string {
	var keep []string
	for _, o := range append(slices.Clone(superOpts), extra...) {
		switch o {
		case "", "rw", "ro", "seclabel":
			continue
		}
		if !slices.Contains(keep, o) {
			keep = append(keep, o)
		}
	}
	return strings.Join(keep, ",")
}

// FavorDynMods turns favordynmods on for the host's cgroup v2 hierarchy
// where it is off, and says whether it changed anything. It mounts the
// hierarchy a second time, with the flags it has plus favordynmods, in a
// private mount namespace of one OS thread that then exits: the host's
// mount table is not touched, only the hierarchy's flags. It must run in
// the host's cgroup namespace (the kernel ignores flags of a mount made in
// another), and the result is read back from the mount table.
func FavorDynMods() (DynMods, bool, error) {
	before, opts, err := readDynMods()
	if err != nil {
		return before, false, err
	}
	if before.On {
		return before, false, nil
	}
	if before.Mount == "" || !before.Supported {
		return before, false, fmt.Errorf("%w: %s", ErrDynModsUnsupported, before)
	}
	dir, err := os.MkdirTemp("", "space-cgroup2-")
	if err != nil {
		return before, false, fmt.Errorf("cgroups: %w", err)
	}
	defer os.Remove(dir)
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread exits with this goroutine, or, where
		// it is the main thread, the runtime parks it; mountOnce returns it
		// to its own mount namespace first, since /proc/self shows the
		// main thread's.
		runtime.LockOSThread()
		errc <- mountOnce(dir, cgroup2Data(opts, DynModsOption))
	}()
	if err := <-errc; err != nil {
		return before, false, err
	}
	after, err := ReadDynMods()
	if err != nil {
		return after, false, err
	}
	if !after.On {
		return after, false, fmt.Errorf("%w: a cgroup2 mount with %s left the flag off (not the host's cgroup namespace?)", ErrDynModsUnsupported, DynModsOption)
	}
	return after, true, nil
}

// mountOnce mounts cgroup2 on dir with data in a new mount namespace of the
// calling (locked) thread and unmounts it again.
func mountOnce(dir, data string) (err error) {
	own, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cgroups: own mount namespace: %w", err)
	}
	defer unix.Close(own)
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("cgroups: unshare mount namespace: %w", err)
	}
	defer func() {
		if serr := unix.Setns(own, unix.CLONE_NEWNS); serr != nil {
			err = errors.Join(err, fmt.Errorf("cgroups: back to the process's mount namespace: %w", serr))
		}
	}()
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("cgroups: make / private: %w", err)
	}
	if err := unix.Mount("cgroup2", dir, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, data); err != nil {
		return fmt.Errorf("cgroups: mount cgroup2 -o %s: %w", data, err)
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("cgroups: unmount %s: %w", dir, err)
	}
	return nil
}
