// Package sandboxinit is the code that runs as PID 1 of a namespace-driver
// sandbox, inside its fresh user, mount, pid, uts, ipc and network
// namespaces, before the agent serves. The host (internal/driver/namespace)
// starts the `space` binary as `space agent --init <Config.Args()>` with
// three descriptors (ListenerFD, SyncFD, StatusFD), and possibly AgentFD;
// Run builds the sandbox's filesystem view, pivots into it, locks itself
// down and hands the listener to the agent.
package sandboxinit

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Descriptors passed by the host, in exec.Cmd.ExtraFiles order.
const (
	ListenerFD = 3 // listening unix socket the agent serves on
	SyncFD     = 4 // read end of a pipe: one byte once the host has placed us in cgroups
	StatusFD   = 5 // write end of a pipe: one status message, then closed
	// AgentFD, if open, is the sealed memfd holding the agent binary that
	// the host exec'd as /proc/self/fd/6, so that /proc/1/exe and
	// /proc/1/maps name no host path. Init closes it.
	AgentFD = 6
)

// Status message bytes on StatusFD.
const (
	statusOK  byte = 0 // followed by JSON Timings
	statusErr byte = 1 // followed by the error text
)

// maxStatus bounds what the host reads from StatusFD.
const maxStatus = 64 << 10

// ErrNoStatus means init exited (or closed StatusFD) without reporting.
var ErrNoStatus = errors.New("sandboxinit: init exited before reporting its status")

// Config is what init needs to know; the host passes it as arguments.
//
// The paths may be relative to init's working directory, and the host
// passes them so (it starts init in the sandbox's state dir, with the
// template linked there as "lower"): overlayfs shows its options in
// /proc/self/mountinfo exactly as given and /proc/1/cmdline is readable
// inside, so relative names keep the host's layout out of the sandbox.
type Config struct {
	Rootfs   string // overlay lower dir (read-only template)
	Upper    string // overlay upper dir (the sandbox's writes)
	Work     string // overlay work dir
	Merged   string // where the overlay is mounted and pivoted into
	Hostname string
	// ShmBytes sizes /dev/shm (a tmpfs charged to the sandbox's memory);
	// 0 = DefaultShmBytes.
	ShmBytes int64
}

// OverlayOptions are the mount options of the sandbox's root overlay, the
// same wherever it is mounted (by init, or by the host for a restore, so
// mountinfo inside reads the same). userxattr: mounted in the sandbox's
// user namespace. volatile: the upper layer is never synced by the
// overlay, so an unmount (every delete) does not sync the whole host
// filesystem that holds it and wait for that, and the sandbox's own
// fsync calls do not reach the disk. A sandbox's writable layer does not
// outlive a host crash anyway: pause and fork keep their state in the
// snapshot store, which syncs what it writes (internal/snapshot), and a
// restore mounts a fresh layer and work dir (a volatile overlay leaves a
// marker in its work dir that refuses a second mount of the same one).
func (c Config) OverlayOptions() string {
	return "lowerdir=" + c.Rootfs + ",upperdir=" + c.Upper + ",workdir=" + c.Work + ",userxattr,volatile"
}

// DefaultShmBytes is /dev/shm's size when the host names none (Docker's).
const DefaultShmBytes = 64 << 20

// ShmSize is /dev/shm's size for a sandbox with memory limit mem (0 =
// none): DefaultShmBytes, or half the limit when that is less, so shared
// memory alone cannot take the whole allowance.
func ShmSize(mem int64) int64 {
	if mem > 0 && mem/2 < DefaultShmBytes {
		return max(mem/2, 1<<20)
	}
	return DefaultShmBytes
}

// Args renders c as command-line arguments for ParseArgs.
func (c Config) Args() []string {
	return []string{
		"--rootfs=" + c.Rootfs,
		"--upper=" + c.Upper,
		"--work=" + c.Work,
		"--merged=" + c.Merged,
		"--hostname=" + c.Hostname,
		"--shm-bytes=" + strconv.FormatInt(c.ShmBytes, 10),
	}
}

// ParseArgs parses what Args produced.
func ParseArgs(args []string) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("space agent --init", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.Rootfs, "rootfs", "", "template root filesystem (overlay lower dir)")
	fs.StringVar(&c.Upper, "upper", "", "overlay upper dir")
	fs.StringVar(&c.Work, "work", "", "overlay work dir")
	fs.StringVar(&c.Merged, "merged", "", "overlay mount point")
	fs.StringVar(&c.Hostname, "hostname", "", "hostname")
	fs.Int64Var(&c.ShmBytes, "shm-bytes", 0, "size of /dev/shm in bytes (0: the default)")
	if err := fs.Parse(args); err != nil {
		return Config{}, fmt.Errorf("sandboxinit: %w", err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("sandboxinit: unexpected arguments %q", fs.Args())
	}
	return c, c.Validate()
}

// Validate checks the paths can be handed to overlayfs as they are: clean,
// and either absolute or local to the working directory (no "..").
func (c Config) Validate() error {
	for _, p := range []struct{ name, v string }{
		{"rootfs", c.Rootfs}, {"upper", c.Upper}, {"work", c.Work}, {"merged", c.Merged},
	} {
		if p.v == "" || filepath.Clean(p.v) != p.v || !(filepath.IsAbs(p.v) || filepath.IsLocal(p.v)) {
			return fmt.Errorf("sandboxinit: %s %q is not a clean absolute or local path", p.name, p.v)
		}
		// Separators of overlayfs's option string.
		if strings.ContainsAny(p.v, ",:\\\n") {
			return fmt.Errorf("sandboxinit: %s %q contains a character overlayfs cannot take", p.name, p.v)
		}
	}
	if !validHostname(c.Hostname) {
		return fmt.Errorf("sandboxinit: invalid hostname %q", c.Hostname)
	}
	return nil
}

func validHostname(h string) bool {
	if h == "" || len(h) > 64 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// Timings are measured by init and reported to the host on success.
type Timings struct {
	CgroupNS time.Duration `json:"cgroupns"`
	Mounts   time.Duration `json:"mounts"` // overlay, /proc, /dev, /sys
	Pivot    time.Duration `json:"pivot"`
	Network  time.Duration `json:"network"` // loopback up
	Harden   time.Duration `json:"harden"`
	Seccomp  time.Duration `json:"seccomp"`
}

// ReadStatus reads init's status message from the host's end of StatusFD.
// It returns init's timings on success, init's error otherwise, and
// ErrNoStatus when init went away without a word.
func ReadStatus(r io.Reader) (Timings, error) {
	msg, err := io.ReadAll(io.LimitReader(r, maxStatus))
	if err != nil {
		return Timings{}, fmt.Errorf("sandboxinit: read status: %w", err)
	}
	if len(msg) == 0 {
		return Timings{}, ErrNoStatus
	}
	switch msg[0] {
	case statusOK:
		var t Timings
		if err := json.Unmarshal(msg[1:], &t); err != nil {
			return Timings{}, fmt.Errorf("sandboxinit: bad status: %w", err)
		}
		return t, nil
	case statusErr:
		return Timings{}, fmt.Errorf("sandbox init: %s", msg[1:])
	}
	return Timings{}, fmt.Errorf("sandboxinit: bad status byte %#x", msg[0])
}
