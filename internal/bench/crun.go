package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// RunCrun measures the baseline: `crun run` of /bin/true in a container on
// rootfs (read-only), with the same namespaces as a sandbox minus the user
// namespace, and the same default limits (512 MiB, 1 CPU, 1024 pids). It
// times runs sequential `crun run` invocations (create + start + wait +
// delete) after two warm-up runs. A missing crun is not an error: the result
// says it was skipped.
//
// crun 1.8 refuses hybrid cgroups while cgroup v2 lists any controller
// ("cgroups in hybrid mode not supported, drop all controllers from
// cgroupv2"). The workaround binds those controllers (hugetlb here) to a v1
// hierarchy, mounted in a private mount namespace of one locked OS thread
// that crun is started from; the binding is host-wide while mounted and
// reverts when the mount and its groups are gone at the end. If that fails,
// crun runs with --cgroup-manager=disabled and the result says so.
func RunCrun(ctx context.Context, rootfs, workDir string, runs int) (*CrunResult, error) {
	bin, err := exec.LookPath("crun")
	if err != nil {
		return &CrunResult{Skipped: "crun not found in PATH; baseline skipped"}, nil
	}
	res := &CrunResult{}
	if out, err := exec.CommandContext(ctx, bin, "--version").Output(); err == nil {
		res.Version, _, _ = strings.Cut(string(out), "\n")
	}
	dir := filepath.Join(workDir, "crun")
	bundle := filepath.Join(dir, "bundle")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return nil, fmt.Errorf("crun: %w", err)
	}
	cgParent := "space-bench-crun-" + filepath.Base(workDir)
	spec, err := json.MarshalIndent(ociSpec(rootfs, "/"+cgParent+"/c"), "", "  ")
	if err != nil {
		return nil, fmt.Errorf("crun: %w", err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), spec, 0o600); err != nil {
		return nil, fmt.Errorf("crun: %w", err)
	}
	type outcome struct {
		res *CrunResult
		err error
	}
	ch := make(chan outcome, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine. Where that
		// thread is the process's main one, the runtime parks it instead,
		// and /proc/self (the main thread's view) would show the private
		// mount namespace to every later reader, e.g. a gVisor sandbox's
		// destroy looking for its mounts: crunLoop returns the thread to
		// its own namespace first (inOwnMountNS).
		runtime.LockOSThread()
		err := inOwnMountNS(func() error { return crunLoop(ctx, bin, dir, bundle, cgParent, runs, res) })
		ch <- outcome{res, err}
	}()
	o := <-ch
	return o.res, o.err
}

// inOwnMountNS runs fn, which may unshare this locked thread's mount
// namespace, and then puts the thread back into the namespace it had.
// setns(CLONE_NEWNS) needs a thread that shares no fs struct, which the
// unshare gave it; a thread that never unshared is left as it is.
func inOwnMountNS(fn func() error) error {
	own, err := os.Open("/proc/thread-self/ns/mnt")
	if err != nil {
		return fmt.Errorf("crun: own mount namespace: %w", err)
	}
	defer own.Close()
	before, _ := os.Readlink("/proc/thread-self/ns/mnt")
	err = fn()
	if now, _ := os.Readlink("/proc/thread-self/ns/mnt"); now != before {
		if serr := unix.Setns(int(own.Fd()), unix.CLONE_NEWNS); serr != nil {
			return errors.Join(err, fmt.Errorf("crun: back to the process's mount namespace: %w", serr))
		}
	}
	return err
}

// crunLoop runs on a locked OS thread.
func crunLoop(ctx context.Context, bin, dir, bundle, cgParent string, runs int, res *CrunResult) (err error) {
	global := []string{"--root", filepath.Join(dir, "state")}
	var mounted []string
	defer func() {
		// Remove the groups crun left (its parent dir) in every hierarchy this
		// thread sees, then the private v1 mounts; a v1 hierarchy with groups
		// would outlive its mount and keep its controller off cgroup v2.
		if cerr := crunCleanup(cgParent, mounted); cerr != nil && err == nil {
			err = cerr
		}
	}()
	res.Cgroups = "cgroupfs"
	if moved, werr := crunHybridWorkaround(dir, &mounted); werr != nil {
		res.Cgroups = "disabled (--cgroup-manager=disabled)"
		res.Notes = "hybrid-cgroup workaround failed: " + werr.Error()
		global = append(global, "--cgroup-manager=disabled")
	} else if len(moved) > 0 {
		res.Cgroups = "cgroupfs, with " + strings.Join(moved, ",") + " bound to cgroup v1 in a private mount namespace (crun refuses hybrid mode otherwise)"
	}
	var times []time.Duration
	for i := 0; i < runs+2; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		id := fmt.Sprintf("%s-%d", cgParent, i)
		cmd := exec.CommandContext(ctx, bin, append(append([]string(nil), global...), "run", "--bundle", bundle, id)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		t0 := time.Now()
		err := cmd.Run()
		d := time.Since(t0)
		if err != nil {
			_ = exec.Command(bin, append(append([]string(nil), global...), "delete", "-f", id)...).Run()
			return fmt.Errorf("crun run: %w: %s", err, bytes.TrimSpace(out.Bytes()))
		}
		if i >= 2 {
			times = append(times, d)
		}
	}
	res.Run = Summarize(times)
	return nil
}

// crunHybridWorkaround binds every controller cgroup v2 offers to a v1
// hierarchy of its own, inside a new mount namespace of this thread, when
// the host is hybrid. It returns the controllers it moved.
func crunHybridWorkaround(dir string, mounted *[]string) ([]string, error) {
	mi, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	var v2 string
	v1 := false
	for _, m := range parseCgroupMounts(mi) {
		if m.v2 && v2 == "" {
			v2 = m.point
		} else if !m.v2 {
			v1 = true
		}
	}
	if v2 == "" || !v1 {
		return nil, nil // pure v1 or pure v2: crun copes
	}
	data, err := os.ReadFile(filepath.Join(v2, "cgroup.controllers"))
	if err != nil {
		return nil, err
	}
	ctls := strings.Fields(string(data))
	if len(ctls) == 0 {
		return nil, nil
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("unshare mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("make mounts private: %w", err)
	}
	for _, c := range ctls {
		p := filepath.Join(dir, "cg-"+c)
		if err := os.MkdirAll(p, 0o700); err != nil {
			return nil, err
		}
		if err := unix.Mount("cgroup", p, "cgroup", 0, c); err != nil {
			return nil, fmt.Errorf("mount %s as cgroup v1: %w", c, err)
		}
		*mounted = append(*mounted, p)
	}
	return ctls, nil
}

func crunCleanup(cgParent string, mounted []string) error {
	var errs []error
	if mi, err := os.ReadFile("/proc/thread-self/mountinfo"); err == nil {
		for _, m := range parseCgroupMounts(mi) {
			if err := rmdirTree(filepath.Join(m.point, cgParent)); err != nil {
				errs = append(errs, err)
			}
		}
	} else {
		errs = append(errs, err)
	}
	for _, p := range mounted {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("crun cleanup: %w", err)
	}
	return nil
}

// ociSpec is a `runc spec`-like config for /bin/true on a read-only rootfs.
func ociSpec(rootfs, cgroupsPath string) map[string]any {
	caps := []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}
	type m = map[string]any
	return m{
		"ociVersion": "1.0.2",
		"process": m{
			"terminal": false,
			"user":     m{"uid": 0, "gid": 0},
			"args":     []string{"/bin/true"},
			"env":      []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"cwd":      "/",
			"capabilities": m{"bounding": caps, "effective": caps, "permitted": caps,
				"ambient": caps},
			"rlimits":         []m{{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}},
			"noNewPrivileges": true,
		},
		"root":     m{"path": rootfs, "readonly": true},
		"hostname": "crun",
		"mounts": []m{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": []string{"nosuid", "noexec", "nodev"}},
			{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
			{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev", "mode=1777"}},
		},
		"linux": m{
			"cgroupsPath": cgroupsPath,
			"resources": m{
				"devices": []m{{"allow": false, "access": "rwm"}},
				"memory":  m{"limit": 512 << 20},
				"cpu":     m{"quota": 100000, "period": 100000},
				"pids":    m{"limit": 1024},
			},
			"namespaces": []m{{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}},
			"maskedPaths": []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"},
			"readonlyPaths": []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
}
