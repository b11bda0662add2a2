// Package netnstest runs a test binary inside a network namespace of its
// own, so that tests creating veths, nftables tables and fake upstream
// servers never touch the host's network: the re-executed binary sees only
// its own loopback and what it creates.
package netnstest

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const innerEnv = "SPACE_TEST_PRIVATE_NETNS"

// Inside reports whether this process is the re-executed one.
func Inside() bool { return os.Getenv(innerEnv) == "1" }

// Main runs m inside a fresh network namespace. Without root it runs m as is; tests then skip on their own.
// It never returns.
func Main(m *testing.M) {
	if os.Geteuid() != 0 || Inside() {
		if Inside() {
			if lo, err := netlink.LinkByName("lo"); err == nil {
				_ = netlink.LinkSetUp(lo)
			}
		}
		os.Exit(m.Run())
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "netnstest:", err)
		os.Exit(1)
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), innerEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			os.Exit(ee.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "netnstest:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// RequireRoot skips the test without root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, veth, nftables)")
	}
}
