package gvisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/space-sandbox/space/internal/driver"
)

const attachDialTimeout = 2 * time.Second

// Attach implements driver.Driver: it re-adopts a sandbox created by an
// earlier node process from its state.json, after checking that runsc
// still runs it with the same sandbox process and that its agent answers.
// Otherwise it removes what is left and returns a wrapped driver.ErrLost.
func (d *Driver) Attach(ctx context.Context, id string) (driver.Instance, error) {
	if !idRE.MatchString(id) {
		return nil, fmt.Errorf("gvisor: invalid sandbox id %q: %w", id, driver.ErrNotFound)
	}
	dir := d.sandboxDir(id)
	st, err := readState(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && !d.hasLeftovers(ctx, id) {
			return nil, fmt.Errorf("gvisor: sandbox %s: %w", id, driver.ErrNotFound)
		}
		return nil, d.lost(ctx, id, state{}, fmt.Sprintf("state unreadable: %v", err))
	}
	if st.ID != id {
		return nil, d.lost(ctx, id, state{}, fmt.Sprintf("state names sandbox %q", st.ID))
	}
	if err := d.cg.Validate(st.Cgroups, id); err != nil {
		return nil, d.lost(ctx, id, st, err.Error())
	}
	cs, err := d.r.state(ctx, id)
	if err != nil {
		return nil, d.lost(ctx, id, st, err.Error())
	}
	if cs.Status != "running" && cs.Status != "paused" {
		return nil, d.lost(ctx, id, st, "runsc reports it "+cs.Status)
	}
	if cs.PID != st.PID {
		return nil, d.lost(ctx, id, st, fmt.Sprintf("sandbox pid %d, state says %d", cs.PID, st.PID))
	}
	if t, err := procStartTime(st.PID); err != nil || t != st.StartTime || isZombie(st.PID) {
		return nil, d.lost(ctx, id, st, fmt.Sprintf("sandbox process %d is not the one created", st.PID))
	}
	inst := &Instance{d: d, id: id, dir: dir, sock: filepath.Join(d.sockDir(id), sockName), st: st, group: d.cg.Open(st.Cgroups)}
	if d.opts.Pool != nil && d.opts.Pool.Contains(inst.uidBase()) {
		// The block stays the sandbox's; the registry re-learns it if it
		// was emptied. A conflict is logged, never fixed by killing.
		if err := d.opts.Pool.Adopt(inst.uidBase(), dir); err != nil {
			d.opts.Logf("gvisor: %s: re-adopting host uid block %d: %v", id, inst.uidBase(), err)
		}
	}
	if err := inst.watch(); err != nil {
		return nil, d.lost(ctx, id, st, err.Error())
	}
	if cs.Status == "running" {
		dctx, cancel := context.WithTimeout(ctx, attachDialTimeout)
		defer cancel()
		if err := healthCheck(dctx, inst); err != nil {
			return nil, d.lost(ctx, id, st, fmt.Sprintf("agent does not answer: %v", err))
		}
	}
	return inst, nil
}

// healthCheck asks the agent for GET /health over a fresh connection: a
// socket that accepts a connection may still belong to a dying sandbox.
func healthCheck(ctx context.Context, inst *Instance) error {
	c, err := inst.Dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health: %s", resp.Status)
	}
	return nil
}

// lost cleans up after a sandbox that cannot be re-adopted and returns the
// ErrLost to report.
func (d *Driver) lost(ctx context.Context, id string, st state, reason string) error {
	err := fmt.Errorf("gvisor: sandbox %s: %s: %w", id, reason, driver.ErrLost)
	if cerr := d.teardown(ctx, id, st); cerr != nil {
		return fmt.Errorf("%w (cleanup: %w)", err, cerr)
	}
	return err
}

func (d *Driver) hasLeftovers(ctx context.Context, id string) bool {
	for _, p := range append([]string{d.sandboxDir(id), d.sockDir(id)}, d.cg.Paths(id).Dirs...) {
		if _, err := os.Lstat(p); err == nil {
			return true
		}
	}
	_, err := d.r.state(ctx, id)
	return err == nil
}

// Sweep implements driver.Driver: it removes every sandbox found on disk,
// in RunDir, in runsc's root or in the driver's cgroups whose id is not in
// keep.
func (d *Driver) Sweep(ctx context.Context, keep map[string]bool) error {
	ids := map[string]bool{}
	for _, dir := range []string{d.opts.StateDir, d.opts.RunDir} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("gvisor: sweep: %w", err)
		}
		for _, e := range ents {
			if e.IsDir() && idRE.MatchString(e.Name()) && e.Name() != runscRootName {
				ids[e.Name()] = true
			}
		}
	}
	listed, err := d.r.list(ctx)
	if err != nil {
		return fmt.Errorf("gvisor: sweep: %w", err)
	}
	cgIDs, err := d.cg.List()
	if err != nil {
		return fmt.Errorf("gvisor: sweep: %w", err)
	}
	for _, id := range append(listed, cgIDs...) {
		if idRE.MatchString(id) {
			ids[id] = true
		}
	}
	var errs []error
	for id := range ids {
		if keep[id] {
			continue
		}
		d.opts.Logf("gvisor: sweeping leftover sandbox %s", id)
		st, err := readState(d.sandboxDir(id))
		if err != nil || st.ID != id {
			st = state{ID: id}
		}
		if err := d.teardown(ctx, id, st); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
