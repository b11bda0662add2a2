package vmimage

import (
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// KVMUsable reports whether KVM can run guests here: /dev/kvm opens, it
// creates a VM, and the CPU advertises vmx or svm. The last check matters:
// on the development hosts /dev/kvm opens and KVM_CREATE_VM succeeds, yet a
// Debian guest dies at once with "KVM internal error ... emulation
// failure" (nested virtualization without the CPU flags).
func KVMUsable() bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	const kvmCreateVM = 0xAE01
	vm, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), kvmCreateVM, 0)
	if errno != 0 {
		return false
	}
	_ = unix.Close(int(vm))
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(cpuinfo), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "flags" {
			for _, fl := range strings.Fields(v) {
				if fl == "vmx" || fl == "svm" {
					return true
				}
			}
			return false
		}
	}
	return false
}
