// Package guest is the in-VM side of the VM drivers' boot: it runs in the
// agent (`space agent --vm`) after the image's /init has mounted the
// sandbox's root, and finds the transport the host talks over — a named
// virtio-serial port (qemu without vhost-vsock) or a vsock port
// (firecracker).
package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/driver/qemu/vmux"
)

// CmdlineHostname is the kernel command line parameter that carries the
// sandbox's hostname.
const CmdlineHostname = "space.hostname"

// FindPort returns the /dev path of the virtio-serial port called name
// (the host's `-device virtserialport,name=NAME`), looking in sysfs, which
// names ports even without udev.
func FindPort(sysfs, name string) (string, error) {
	matches, err := filepath.Glob(filepath.Join(sysfs, "class", "virtio-ports", "*", "name"))
	if err != nil {
		return "", err
	}
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err == nil && strings.TrimSpace(string(b)) == name {
			return "/dev/" + filepath.Base(filepath.Dir(m)), nil
		}
	}
	return "", fmt.Errorf("guest: no virtio-serial port named %q in %s", name, sysfs)
}

// CmdlineParam returns the value of key=value on a kernel command line.
func CmdlineParam(cmdline, key string) (string, bool) {
	for _, f := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v, true
		}
	}
	return "", false
}

// EnterRoot makes dir the process's root (chroot; inside a VM the machine,
// not the chroot, is the boundary) and sets the hostname from the kernel
// command line when it carries one.
func EnterRoot(dir string) error {
	if dir != "" && dir != "/" {
		if err := unix.Chroot(dir); err != nil {
			return fmt.Errorf("guest: chroot %s: %w", dir, err)
		}
		if err := os.Chdir("/"); err != nil {
			return fmt.Errorf("guest: %w", err)
		}
	}
	// /init moved /proc below the new root: read the command line here.
	if b, err := os.ReadFile("/proc/cmdline"); err == nil {
		if h, ok := CmdlineParam(string(b), CmdlineHostname); ok && h != "" {
			if err := unix.Sethostname([]byte(h)); err != nil {
				return fmt.Errorf("guest: sethostname: %w", err)
			}
		}
	}
	return nil
}

// SerialListener serves vmux sessions on the character device at path,
// reopening it whenever the host side disconnects.
func SerialListener(ctx context.Context, path string, logf func(string, ...any)) net.Listener {
	return vmux.Listen(ctx, func() (io.ReadWriteCloser, error) {
		return os.OpenFile(path, os.O_RDWR, 0)
	}, logf)
}

// VsockListener listens on AF_VSOCK port (any CID): each connection the
// host opens through Firecracker's `CONNECT <port>` is one agent
// connection, so no multiplexing is needed.
func VsockListener(port uint32) (net.Listener, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("guest: vsock socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("guest: vsock bind %d: %w", port, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("guest: vsock listen: %w", err)
	}
	return &vsockListener{fd: fd, port: port}, nil
}

type vsockListener struct {
	fd   int
	port uint32
}

func (l *vsockListener) Accept() (net.Conn, error) {
	for {
		nfd, _, err := unix.Accept4(l.fd, unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("guest: vsock accept: %w", err)
		}
		return &vsockConn{File: os.NewFile(uintptr(nfd), "vsock"), port: l.port}, nil
	}
}

func (l *vsockListener) Close() error { return unix.Close(l.fd) }

func (l *vsockListener) Addr() net.Addr { return vsockAddr(l.port) }

// vsockConn is a connected vsock socket; os.File gives it the runtime
// poller and deadlines.
type vsockConn struct {
	*os.File
	port uint32
}

func (c *vsockConn) LocalAddr() net.Addr  { return vsockAddr(c.port) }
func (c *vsockConn) RemoteAddr() net.Addr { return vsockAddr(0) }
func (c *vsockConn) SetDeadline(t time.Time) error {
	return c.File.SetDeadline(t)
}

type vsockAddr uint32

func (a vsockAddr) Network() string { return "vsock" }
func (a vsockAddr) String() string  { return fmt.Sprintf("vsock:%d", uint32(a)) }
