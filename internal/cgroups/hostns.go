package cgroups

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// hostNSEnv marks the process ExecInHostNamespace started, so that it
// never loops.
const hostNSEnv = "SPACE_IN_HOST_CGROUPNS"

// ExecInHostNamespace re-executes the running program, with the same
// arguments, in the cgroup namespace of PID 1 when it runs in another one.
// It returns nil without doing anything when the two are the same, or when
// PID 1's is not readable (no access to it); on success it does not return.
//
// A node in a Kubernetes pod with hostPID and --cgroup-parent needs it
// where the runtime gives the pod its own cgroup namespace (containerd
// does on cgroup v2 hosts): the kernel refuses to move a process into a
// cgroup outside the writer's namespace when cgroup2 is mounted with
// nsdelegate (systemd's default), and the sandboxes' groups are outside
// the pod's. The program must be executable as /proc/self/exe.
func ExecInHostNamespace() error {
	own, err1 := os.Readlink("/proc/self/ns/cgroup")
	host, err2 := os.Readlink("/proc/1/ns/cgroup")
	if err1 != nil || err2 != nil || own == host {
		return nil
	}
	if os.Getenv(hostNSEnv) != "" {
		return fmt.Errorf("cgroups: still in cgroup namespace %s after joining PID 1's (%s)", own, host)
	}
	fd, err := unix.Open("/proc/1/ns/cgroup", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cgroups: PID 1's cgroup namespace: %w", err)
	}
	defer unix.Close(fd)
	// setns changes this thread only; execve keeps this thread's
	// namespaces for the whole new image.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Setns(fd, unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("cgroups: join PID 1's cgroup namespace: %w", err)
	}
	err = unix.Exec("/proc/self/exe", os.Args, append(os.Environ(), hostNSEnv+"=1"))
	return fmt.Errorf("cgroups: re-execute in PID 1's cgroup namespace: %w", err)
}
