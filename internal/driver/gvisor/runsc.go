package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/driver"
)

// PinnedVersion is the gvisor.dev/gvisor module version scripts/runsc.sh
// builds and the driver looks for first.
const PinnedVersion = "v0.0.0-20260905035102-160fafc42237"

// DefaultRunscCache is where scripts/runsc.sh puts its builds:
// <DefaultRunscCache>/<version>/runsc.
const DefaultRunscCache = "/var/cache/space/runsc"

// FindRunsc returns the runsc binary to use: explicit if set, else the
// pinned build in DefaultRunscCache, else runsc on PATH. The error wraps
// driver.ErrUnsupported and says how to get one.
func FindRunsc(explicit string) (string, error) {
	if explicit != "" {
		p, err := exec.LookPath(explicit)
		if err != nil {
			return "", fmt.Errorf("gvisor: runsc %q: %w: %w", explicit, err, driver.ErrUnsupported)
		}
		return filepath.Abs(p)
	}
	pinned := filepath.Join(DefaultRunscCache, PinnedVersion, "runsc")
	if fi, err := os.Stat(pinned); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
		return pinned, nil
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return filepath.Abs(p)
	}
	return "", fmt.Errorf("gvisor: no runsc (looked for %s and on PATH; build it with scripts/runsc.sh): %w", pinned, driver.ErrUnsupported)
}

// RunscVersion runs `runsc --version` and returns its first line, plus the
// module version scripts/runsc.sh recorded next to the binary, if any.
func RunscVersion(ctx context.Context, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("gvisor: %s --version: %w: %s: %w", path, err, bytes.TrimSpace(out), driver.ErrUnsupported)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	if b, err := os.ReadFile(filepath.Join(filepath.Dir(path), "VERSION")); err == nil {
		line += " (module " + strings.TrimSpace(string(b)) + ")"
	}
	return line, nil
}

// runsc runs the runsc CLI against one --root.
type runsc struct {
	path     string
	root     string
	platform string
	debug    bool
}

// globals are the flags every runsc command of one sandbox needs; they
// must be the same for create, state, delete, checkpoint and restore.
func (r *runsc) globals(logDir string, network string) []string {
	args := []string{"--root", r.root, "--platform", r.platform}
	if network != "" {
		args = append(args,
			"--network", network,
			// The agent listens on a host unix socket in a bind mount it
			// cannot reach the host through: create only, never connect.
			"--host-uds", "create",
			// The writable layer is the host overlay under the sandbox's
			// dir, not sentry memory (snapshots read it).
			"--overlay2", "none",
			// A fresh empty netns per gofer, so nothing is left mounted in
			// --root when the last sandbox goes.
			"--gofer-network-namespace", "new",
			// The Sentry's cgroup v2 hierarchy, mounted by the spec at
			// /sys/fs/cgroup: its pids controller enforces the
			// sandbox's pids limit (package agentpids).
			"--in-sandbox-cgroup", "v2",
		)
	}
	if r.debug && logDir != "" {
		args = append(args, "--debug", "--debug-log", logDir+"/")
	}
	return args
}

func (r *runsc) command(ctx context.Context, global []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, r.path, append(append([]string{}, global...), args...)...)
	cmd.WaitDelay = time.Second
	return cmd
}

// run runs a short runsc command and returns its stdout; errors carry
// stderr.
func (r *runsc) run(ctx context.Context, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := r.command(ctx, []string{"--root", r.root}, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 1024 {
			msg = msg[:1024] + " ..."
		}
		return stdout.Bytes(), fmt.Errorf("runsc %s: %w: %s", args[0], err, msg)
	}
	return stdout.Bytes(), nil
}

// containerState is the part of `runsc state` the driver uses.
type containerState struct {
	ID     string `json:"id"`
	Status string `json:"status"` // created, running, paused, stopped
	PID    int    `json:"pid"`
}

var errNoContainer = errors.New("no such container")

// state asks runsc about container id; errNoContainer when runsc does not
// know it.
func (r *runsc) state(ctx context.Context, id string) (containerState, error) {
	var st containerState
	out, err := r.run(ctx, "state", id)
	if err != nil {
		if strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "not found") {
			return st, fmt.Errorf("%w: %w", errNoContainer, err)
		}
		return st, err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("runsc state: %w", err)
	}
	return st, nil
}

// list returns the ids of every container under the root.
func (r *runsc) list(ctx context.Context) ([]string, error) {
	out, err := r.run(ctx, "list", "-quiet")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}

// remove force-deletes container id; a container runsc does not know is
// not an error.
func (r *runsc) remove(ctx context.Context, id string) error {
	_, err := r.run(ctx, "delete", "-force", id)
	if err != nil && (strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "not found")) {
		return nil
	}
	return err
}
