package agentcmd

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/vmimage/guest"
)

// runAgentVM runs the agent as PID 1 of a VM guest (`space agent --vm`),
// exec'd by the guest image's /init once the sandbox's root is mounted.
// It serves on a virtio-serial port (qemu; streams multiplexed with vmux)
// or on a vsock port (firecracker).
func runVM(args []string, version string) error {
	fs := flag.NewFlagSet("agent --vm", flag.ContinueOnError)
	root := fs.String("root", "", "directory to chroot into before serving")
	port := fs.String("serial", "", "name of the virtio-serial port to serve on")
	vsock := fs.Uint("vsock", 0, "vsock port to serve on (instead of --serial)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if (*port == "") == (*vsock == 0) {
		return fmt.Errorf("usage: space agent --vm [--root DIR] (--serial NAME | --vsock PORT)")
	}
	logf := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "agent: "+format+"\n", a...) }
	var dev string
	if *port != "" {
		// /init has moved /sys below the new root already.
		sysfs := filepath.Join(*root, "sys")
		var err error
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if dev, err = guest.FindPort(sysfs, *port); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			return err
		}
	}
	if err := guest.EnterRoot(*root); err != nil {
		return err
	}
	// Fail closed: an agent whose hardening did not take effect must not
	// serve (the host then reports the guest's exit and this message).
	if err := agent.HardenVM(); err != nil {
		return fmt.Errorf("harden: %w", err)
	}
	ctx := context.Background()
	var l net.Listener
	if dev != "" {
		l = guest.SerialListener(ctx, dev, logf)
	} else {
		var err error
		if l, err = guest.VsockListener(uint32(*vsock)); err != nil {
			return err
		}
	}
	agent.StartReaper(ctx)
	up, _ := os.ReadFile("/proc/uptime")
	logf("serving on %s, uptime %s", l.Addr(), strings.Fields(string(up) + " ?")[0])
	return agent.NewServer(agent.Options{Version: version}).Serve(ctx, l)
}
