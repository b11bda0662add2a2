//go:build linux && amd64

package seccomp

import "golang.org/x/sys/unix"

func nativeTable() (table, bool) {
	return table{
		auditArch:   unix.AUDIT_ARCH_X86_64,
		x32Bit:      x32SyscallBit,
		clone:       unix.SYS_CLONE,
		clone3:      unix.SYS_CLONE3,
		personality: unix.SYS_PERSONALITY,
		socket:      unix.SYS_SOCKET,
		socketpair:  unix.SYS_SOCKETPAIR,
		denied:      deniedAMD64,
		signalSig1:  []uint32{unix.SYS_KILL, unix.SYS_TKILL, unix.SYS_RT_SIGQUEUEINFO},
		signalSig2:  []uint32{unix.SYS_TGKILL, unix.SYS_RT_TGSIGQUEUEINFO},
		pidfdOpen:   unix.SYS_PIDFD_OPEN,
	}, true
}

// deniedAMD64 are answered with EPERM. Everything here either needs host
// privileges anyway (so refusing early shrinks attack surface at no cost) or
// gives a process inside the user namespace reach it should not have.
var deniedAMD64 = []uint32{
	// kernel modules and kexec
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD,
	// large, historically buggy subsystems
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	// keyrings are not namespaced
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY,
	// reaching into other processes (the agent included)
	unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV,
	unix.SYS_KCMP, unix.SYS_PIDFD_GETFD,
	// mounts and namespaces: the sandbox's layout is fixed by its init
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT,
	unix.SYS_MOVE_MOUNT, unix.SYS_OPEN_TREE, unix.SYS_OPEN_TREE_ATTR,
	unix.SYS_FSOPEN, unix.SYS_FSMOUNT, unix.SYS_FSCONFIG, unix.SYS_FSPICK,
	unix.SYS_MOUNT_SETATTR, unix.SYS_UNSHARE, unix.SYS_SETNS,
	// host-wide state
	unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_REBOOT, unix.SYS_SYSLOG,
	unix.SYS_ACCT, unix.SYS_QUOTACTL, unix.SYS_QUOTACTL_FD,
	unix.SYS_IOPL, unix.SYS_IOPERM, unix.SYS_LOOKUP_DCOOKIE,
	unix.SYS_VHANGUP, unix.SYS_USELIB, unix.SYS_NFSSERVCTL,
	// file handles bypass path-based confinement
	unix.SYS_OPEN_BY_HANDLE_AT, unix.SYS_NAME_TO_HANDLE_AT,
}
