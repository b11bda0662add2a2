package gvisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/gvisor/agentlisten"
)

var (
	_ driver.Checkpointer = (*Instance)(nil)
	_ driver.Restorer     = (*Driver)(nil)
)

// Checkpoint implements driver.Checkpointer: it saves the sandbox's whole
// state (every process with its memory, open files, the agent) into
// imageDir with `runsc checkpoint -leave-running` on the paused sandbox,
// and leaves it paused and alive. Its writable layer must be saved
// alongside, before it resumes (WritableLayer): a restore needs the files
// of the same moment.
//
// gVisor cannot save a listening host socket, so the agent first releases
// its listener (package agentlisten); a paused sandbox runs for that
// moment. An agent without that route makes Checkpoint fail with
// driver.ErrUnsupported. Agent connections open at the checkpoint break
// (the node's readers reconnect); the agent listens again once resumed,
// and new dials wait for that (Instance.Dial).
func (i *Instance) Checkpoint(ctx context.Context, imageDir string) error {
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", i.id, err)
	}
	cs, err := i.d.r.state(ctx, i.id)
	if err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", i.id, err)
	}
	if cs.Status == "paused" {
		// The agent must answer the release.
		if err := i.Resume(ctx); err != nil {
			return err
		}
	}
	// Dials wait from here until the sandbox runs again (Resume), rather
	// than meet a released listener (Instance.Dial).
	i.gate.Close()
	if err := i.releaseListener(ctx); err != nil {
		return errors.Join(fmt.Errorf("gvisor: checkpoint %s: %w", i.id, err), i.Pause(context.WithoutCancel(ctx)))
	}
	// Without the marker the agent listens again: at once in a restored
	// sandbox (its socket dir is fresh), when resumed in this one.
	defer os.Remove(i.sock + agentlisten.MarkerSuffix)
	if err := i.Pause(ctx); err != nil {
		return err
	}
	// Checkpointing the paused sandbox keeps it paused: nothing runs
	// between the saved state and the caller's read of the layer.
	if _, err := i.d.r.run(ctx, "checkpoint", "-leave-running", "-image-path", imageDir, i.id); err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", i.id, err)
	}
	return writeJSON(filepath.Join(imageDir, idMapFile), idMap{UIDBase: i.uidBase(), UIDCount: i.d.opts.UIDCount})
}

// releaseListener asks the agent to close its listening socket. It
// dials past the gate its checkpoint has closed.
func (i *Instance) releaseListener(ctx context.Context) error {
	c, err := dialSocket(ctx, i.sock)
	if err != nil {
		return fmt.Errorf("dial agent: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := io.WriteString(c, "POST "+agentlisten.ReleasePath+" HTTP/1.1\r\nHost: agent\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNoContent, http.StatusOK:
		return nil
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return fmt.Errorf("the agent cannot release its listener (%s): %w", resp.Status, driver.ErrUnsupported)
	}
	return fmt.Errorf("release listener: %s", resp.Status)
}

// Restore implements driver.Restorer: it creates sandbox spec.ID from a
// checkpoint image through Create's own path (network, cgroups, agent
// wait), so the processes continue where they were when Checkpoint ran.
// spec.InitLayer must fill the writable layer with the checkpointed
// sandbox's files; spec.Limits should be the checkpointed ones (the
// sentry keeps its memory size). runsc restore loads the whole image
// before it returns, so imageDir may go afterwards.
func (d *Driver) Restore(ctx context.Context, spec driver.Spec, imageDir string) (driver.Instance, error) {
	if fi, err := os.Stat(filepath.Join(imageDir, "checkpoint.img")); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("gvisor: restore %s: no checkpoint image in %s: %w", spec.ID, imageDir, errors.Join(err, fs.ErrNotExist))
	}
	return d.create(ctx, spec, imageDir)
}

// idMapFile, in a checkpoint image, records the host id range the
// sandbox's ids 0.. mapped to when it was captured.
const idMapFile = "space-idmap.json"

type idMap struct {
	UIDBase  uint32 `json:"uid_base"`
	UIDCount uint32 `json:"uid_count"`
}

// restoreArgs are the runsc arguments that start a sandbox from an image
// under host ids uidBase...
//
// An image captured under another range (another sandbox's uid block, or
// a node with another --uid-base: with a uid pool, always) carries another
// uidMappings/gidMappings in its spec, and runsc's restore refuses any
// change there ("UIDMappings" does not match). The mapping only says
// which host ids the sandbox's ids stand for: the Sentry, its gofer and
// the checkpointed state see the sandbox's own ids (0..UIDCount), and this
// node materializes the writable layer under its own base. So for such an
// image, of the same size, runsc validates the spec but only warns
// (--restore-spec-validation=warning; a global flag, hence before the
// subcommand); every other image is restored with validation enforced.
func (d *Driver) restoreArgs(imageDir, bundle, id string, uidBase uint32, pidFile string) []string {
	args := []string{"restore", "-detach", "-pid-file", pidFile, "-image-path", imageDir, "-bundle", bundle, id}
	raw, err := os.ReadFile(filepath.Join(imageDir, idMapFile))
	if err != nil {
		return args
	}
	var m idMap
	if json.Unmarshal(raw, &m) != nil || m.UIDBase == uidBase || m.UIDCount != d.opts.UIDCount {
		return args
	}
	d.opts.Logf("gvisor: %s: image captured with host ids %d.., restoring it under %d..", id, m.UIDBase, uidBase)
	return append([]string{"--restore-spec-validation=warning"}, args...)
}
