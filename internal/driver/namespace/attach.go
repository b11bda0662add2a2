package namespace

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/driver"
)

const attachDialTimeout = 2 * time.Second

// Attach implements driver.Driver: it re-adopts a sandbox created by an
// earlier node process from its state.json, after checking its PID 1 is the
// same process and its agent socket answers. Otherwise it removes what is
// left and returns a wrapped driver.ErrLost.
func (d *Driver) Attach(ctx context.Context, id string) (driver.Instance, error) {
	if !idRE.MatchString(id) {
		return nil, fmt.Errorf("namespace: invalid sandbox id %q: %w", id, driver.ErrNotFound)
	}
	dir := d.sandboxDir(id)
	st, err := readState(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && !d.hasLeftovers(id) {
			return nil, fmt.Errorf("namespace: sandbox %s: %w", id, driver.ErrNotFound)
		}
		return nil, d.lost(ctx, id, nil, fmt.Sprintf("state unreadable: %v", err))
	}
	if st.ID != id {
		return nil, d.lost(ctx, id, nil, fmt.Sprintf("state names sandbox %q", st.ID))
	}
	if err := d.cg.Validate(st.Cgroups, id); err != nil {
		return nil, d.lost(ctx, id, nil, err.Error())
	}
	proc, err := openVerified(st.PID, st.StartTime, st.PidNS)
	if err != nil {
		return nil, d.lost(ctx, id, nil, err.Error())
	}
	sock := d.sockPath(id)
	if filepath.Base(st.Socket) == id+".sock" && filepath.IsAbs(st.Socket) {
		sock = st.Socket // RunDir may have moved since
	}
	if st.Handoff > 0 {
		// The node died during a checkpoint, with the agent waiting
		// for its listener and the sandbox perhaps frozen.
		inst := &Instance{d: d, id: id, sock: sock, groups: []*cgroups.Group{d.cg.Open(st.Cgroups)}, proc: proc}
		if err := inst.Resume(ctx); err != nil {
			return nil, d.lost(ctx, id, proc, fmt.Sprintf("thaw after an interrupted checkpoint: %v", err))
		}
		if err := inst.handIn(st.Handoff); err != nil {
			return nil, d.lost(ctx, id, proc, fmt.Sprintf("listener after an interrupted checkpoint: %v", err))
		}
		if err := d.setHandoff(id, 0); err != nil {
			d.opts.Logf("namespace: %s: %v", id, err)
		}
		d.opts.Logf("namespace: %s: gave the agent its listener back after an interrupted checkpoint", id)
	}
	dctx, cancel := context.WithTimeout(ctx, attachDialTimeout)
	defer cancel()
	var dd net.Dialer
	c, err := dd.DialContext(dctx, "unix", sock)
	if err != nil {
		return nil, d.lost(ctx, id, proc, fmt.Sprintf("agent socket does not answer: %v", err))
	}
	_ = c.Close()
	uidBase := cmp.Or(st.UIDBase, d.opts.UIDBase)
	if d.opts.Pool != nil && d.opts.Pool.Contains(uidBase) {
		// The block stays the sandbox's; the registry re-learns it if it
		// was emptied. A conflict is logged, never fixed by killing.
		if err := d.opts.Pool.Adopt(uidBase, dir); err != nil {
			d.opts.Logf("namespace: %s: re-adopting host uid block %d: %v", id, uidBase, err)
		}
	}
	return &Instance{
		d:       d,
		id:      id,
		sock:    sock,
		groups:  []*cgroups.Group{d.cg.Open(st.Cgroups)},
		proc:    proc,
		uidBase: uidBase,
	}, nil
}

// lost cleans up after a sandbox that cannot be re-adopted and returns the
// ErrLost to report.
func (d *Driver) lost(ctx context.Context, id string, proc *process, reason string) error {
	err := fmt.Errorf("namespace: sandbox %s: %s: %w", id, reason, driver.ErrLost)
	if cerr := d.removeLeftovers(ctx, id, proc); cerr != nil {
		return fmt.Errorf("%w (cleanup: %w)", err, cerr)
	}
	return err
}

func (d *Driver) hasLeftovers(id string) bool {
	for _, p := range append([]string{d.sandboxDir(id), d.sockPath(id)}, d.cg.Paths(id).Dirs...) {
		if _, err := os.Lstat(p); err == nil {
			return true
		}
	}
	return false
}

// removeLeftovers removes every host-side trace of sandbox id. proc, if
// given, is a verified PID 1 to kill; without it the state file is consulted
// and its process killed only if it is provably the same one.
func (d *Driver) removeLeftovers(ctx context.Context, id string, proc *process) error {
	groups := []*cgroups.Group{d.cg.Open(d.cg.Paths(id))}
	socks := []string{d.sockPath(id)}
	var uidBase uint32
	if st, err := readState(d.sandboxDir(id)); err == nil && st.ID == id {
		// The node may have run in another cgroup when it made this one.
		if d.cg.Validate(st.Cgroups, id) == nil && !slices.Equal(st.Cgroups.Dirs, groups[0].Paths().Dirs) {
			groups = append(groups, d.cg.Open(st.Cgroups))
		}
		if filepath.Base(st.Socket) == id+".sock" && st.Socket != socks[0] {
			socks = append(socks, st.Socket)
		}
		if proc == nil {
			proc, _ = openVerified(st.PID, st.StartTime, st.PidNS)
		}
		uidBase = st.UIDBase
	}
	return d.teardown(ctx, id, proc, groups, socks, uidBase)
}

// Sweep implements driver.Driver: it removes every sandbox found on disk,
// in RunDir or in the driver's cgroups whose id is not in keep.
func (d *Driver) Sweep(ctx context.Context, keep map[string]bool) error {
	ids := map[string]bool{}
	if ents, err := os.ReadDir(d.opts.StateDir); err == nil {
		for _, e := range ents {
			if e.IsDir() && idRE.MatchString(e.Name()) {
				ids[e.Name()] = true
			}
		}
	} else {
		return fmt.Errorf("namespace: sweep: %w", err)
	}
	if ents, err := os.ReadDir(d.opts.RunDir); err == nil {
		for _, e := range ents {
			if id, ok := strings.CutSuffix(e.Name(), ".sock"); ok && idRE.MatchString(id) {
				ids[id] = true
			}
		}
	}
	cgIDs, err := d.cg.List()
	if err != nil {
		return fmt.Errorf("namespace: sweep: %w", err)
	}
	for _, id := range cgIDs {
		if idRE.MatchString(id) {
			ids[id] = true
		}
	}
	var errs []error
	for id := range ids {
		if keep[id] {
			continue
		}
		d.opts.Logf("namespace: sweeping leftover sandbox %s", id)
		if err := d.removeLeftovers(ctx, id, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
