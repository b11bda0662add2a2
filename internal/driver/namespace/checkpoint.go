package namespace

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/criu"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/namespace/agenthandoff"
	"github.com/space-sandbox/space/internal/sandboxinit"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

var (
	_ driver.Checkpointer = (*Instance)(nil)
	_ driver.Restorer     = (*Driver)(nil)
)

// metaFile, in a checkpoint image, is what Restore needs beside CRIU's
// own images.
const metaFile = "space-criu.json"

// criuMeta describes a namespace checkpoint image.
type criuMeta struct {
	// UIDBase and UIDCount are the host ids the sandbox's ids 0.. mapped
	// to when it was dumped.
	UIDBase  uint32 `json:"uid_base"`
	UIDCount uint32 `json:"uid_count"`
	// HandoffFD is the agent's end of the pair it waits on for a listener
	// (agenthandoff).
	HandoffFD int `json:"handoff_fd"`
	// Files are the host files PID 1 held open outside its mount
	// namespace, dumped as external, and what a restore gives instead.
	Files []externalFile `json:"files"`
	// Veths are the sandbox's interfaces whose peer was on the host (its
	// network): a restore replaces them with the network hook's.
	Veths []string `json:"veths,omitempty"`
}

// externalFile is a criu.ExternalFile and how a restore replaces it.
type externalFile struct {
	Key string `json:"key"`
	// Role: "log" (init.log: the new sandbox's own), "host" (a device
	// node: Path again) or "cgroup" (a file of the sandbox's cgroup, by
	// base name: the Go runtime's CPU quota files).
	Role string      `json:"role"`
	Path string      `json:"path"`
	Mode os.FileMode `json:"mode"`
}

// devices are the host device nodes init binds into /dev (sandboxinit's
// mountDev): bind mounts from outside the sandbox, so CRIU saves them as
// external mounts and a restore binds them again.
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

func deviceMounts(dump bool) map[string]string {
	m := map[string]string{}
	for _, n := range devices {
		if dump {
			m["/dev/"+n] = "dev-" + n
		} else {
			m["dev-"+n] = "/dev/" + n
		}
	}
	return m
}

// criuBin finds and checks CRIU once per driver.
func (d *Driver) criuBin(ctx context.Context) (string, error) {
	d.criuOnce.Do(func() {
		var v string
		if !d.opts.Checkpoints {
			d.criuErr = errors.New("process checkpoints are off (--namespace-criu=false)")
			return
		}
		d.criuPath, v, d.criuErr = criu.ProbeSandboxes(ctx, d.opts.CRIU)
		if d.criuErr == nil {
			d.opts.Logf("namespace: checkpoints with criu %s (%s)", v, d.criuPath)
		}
	})
	if d.criuErr != nil {
		return "", fmt.Errorf("%w: %w", d.criuErr, driver.ErrUnsupported)
	}
	return d.criuPath, nil
}

// Checkpoint implements driver.Checkpointer with CRIU: every process of
// the sandbox (the agent and its commands) with its memory goes into
// imageDir, and the sandbox is left paused (frozen) and alive, so that the
// caller reads the writable layer of the same moment and then resumes or
// destroys it.
//
// The agent's listener and its connections are sockets of the host's
// network namespace, which CRIU cannot save: the agent hands them off
// first (agenthandoff) and gets a new listener once the dump is written,
// whether it succeeded or not. Agent connections open at the checkpoint
// break (the node's readers reconnect). Established TCP connections of
// the sandbox are closed in a restored copy; listening sockets come back.
// Without a working CRIU it fails with driver.ErrUnsupported, and the
// sandbox runs on untouched.
func (i *Instance) Checkpoint(ctx context.Context, imageDir string) (err error) {
	bin, err := i.d.criuBin(ctx)
	if err != nil {
		return fmt.Errorf("namespace: checkpoint %s: %w", i.id, err)
	}
	// Memory a lazy restore has not moved in yet is in no process to dump.
	if i.pages != nil {
		select {
		case <-i.pages.Done():
		case <-ctx.Done():
			return fmt.Errorf("namespace: checkpoint %s: waiting for its lazy restore to finish: %w", i.id, ctx.Err())
		}
	}
	// A sandbox network (--egress) is a veth whose peer is on the host:
	// it is dumped and recorded, and a restore drops it from the image
	// and lets the network hook set up a new one. Any other interface
	// (one the sandbox made itself) keeps the sandbox files only rather
	// than make an image no restore can use.
	ifs, err := netInterfaces(i.proc.pid)
	if err != nil {
		return fmt.Errorf("namespace: checkpoint %s: %w", i.id, err)
	}
	var veths []string
	if len(ifs) > 0 {
		if veths, err = hostVeths(i.proc.pid); err != nil {
			return fmt.Errorf("namespace: checkpoint %s: %w", i.id, err)
		}
	}
	if other := without(ifs, veths); len(other) > 0 {
		return fmt.Errorf("namespace: checkpoint %s: the sandbox has network interfaces (%s), which CRIU cannot restore: %w", i.id, strings.Join(other, ", "), driver.ErrUnsupported)
	}
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return fmt.Errorf("namespace: checkpoint %s: %w", i.id, err)
	}
	i.ckMu.Lock()
	defer i.ckMu.Unlock()
	// The sandbox runs on while it waits for a turn, at most
	// CheckpointTimeout.
	wait, cancelWait := context.WithTimeout(ctx, i.d.opts.CheckpointTimeout)
	select {
	case i.d.dumps <- struct{}{}:
		cancelWait()
		defer func() { <-i.d.dumps }()
	case <-wait.Done():
		cancelWait()
		return fmt.Errorf("namespace: checkpoint %s: waiting for other checkpoints: %w", i.id, wait.Err())
	}
	// Its turn is bounded too, so that a stuck dump gives the sandbox
	// back (the listener is handed in whatever happens).
	ctx, cancel := context.WithTimeout(ctx, i.d.opts.CheckpointTimeout)
	defer cancel()
	// The agent must answer the handoff.
	if err := i.Resume(ctx); err != nil {
		return err
	}
	// Dials wait from here until a listener is handed back in
	// (Instance.Dial).
	i.gate.Close()
	fd, err := i.handoff(ctx)
	if err != nil {
		err = fmt.Errorf("namespace: checkpoint %s: %w", i.id, err)
		// The agent may have handed its listener off even though the
		// answer went missing: it must get one back.
		if herr := i.handInAfterFailedHandoff(fd); herr != nil {
			err = errors.Join(err, fmt.Errorf("namespace: %s: give the agent its listener back: %w", i.id, herr))
		}
		i.gate.Open()
		return errors.Join(err, i.Pause(context.WithoutCancel(ctx)))
	}
	defer func() {
		defer i.gate.Open()
		if herr := i.handIn(fd); herr != nil {
			err = errors.Join(err, fmt.Errorf("namespace: %s: give the agent its listener back: %w", i.id, herr))
		} else if serr := i.d.setHandoff(i.id, 0); serr != nil {
			err = errors.Join(err, serr)
		}
	}()
	// If this node dies before the listener is back, Attach hands it in.
	if err := i.d.setHandoff(i.id, fd); err != nil {
		return err
	}
	if err := i.Pause(ctx); err != nil {
		return err
	}
	ext, err := criu.ExternalFiles(i.proc.pid)
	if err != nil {
		return fmt.Errorf("namespace: checkpoint %s: %w", i.id, err)
	}
	meta := criuMeta{UIDBase: i.uidBase, UIDCount: i.d.opts.UIDCount, HandoffFD: fd, Veths: veths}
	logPath := filepath.Join(i.d.sandboxDir(i.id), "init.log")
	for _, f := range ext {
		ef := externalFile{Key: f.Key(), Path: f.Path}
		switch {
		case f.Path == logPath:
			ef.Role = "log"
		case strings.HasPrefix(f.Path, "/dev/"):
			ef.Role = "host"
		default:
			// The Go runtime's cpu.cfs_*_us, shown relative to the
			// cgroup mount; anything else cannot be given back.
			ef.Role, ef.Path = "cgroup", filepath.Base(f.Path)
			if i.cgroupFile(ef.Path) == "" {
				return fmt.Errorf("namespace: checkpoint %s: PID 1 holds host file %s open: %w", i.id, f.Path, driver.ErrUnsupported)
			}
		}
		if ef.Role == "log" {
			// A restore's new log must have this mode (CRIU checks).
			if fi, err := os.Stat(logPath); err == nil {
				ef.Mode = fi.Mode().Perm()
			}
		}
		meta.Files = append(meta.Files, ef)
	}
	freezer := i.groups[0].Paths().Unified
	if _, err := os.Stat(filepath.Join(freezer, "cgroup.freeze")); freezer == "" || err != nil {
		freezer = i.groups[0].Paths().Freezer
	}
	wasFrozen := frozen(freezer)
	t0 := time.Now()
	dump := func() error {
		return criu.Dump(ctx, bin, criu.DumpOptions{
			PID: i.proc.pid, ImageDir: imageDir, LeaveRunning: true,
			ExternalMounts: deviceMounts(true), ExternalFiles: ext, FreezeCgroup: freezer,
			// A restore puts the tasks in the new sandbox's groups itself;
			// the host's hierarchies are nothing to record (and CRIU fails
			// on controllers the host lists but does not mount, e.g.
			// "controller hugetlb not found").
			Args: []string{"--manage-cgroups=ignore"},
		})
	}
	err = dump()
	if err != nil && ctx.Err() == nil && !wasFrozen && strings.Contains(err.Error(), "Timeout reached") {
		// The freezer did not get every task within CRIU's 10 s (CI: a
		// task in D state under load); CRIU thawed what it froze. Once
		// more, into an empty image dir, before the snapshot falls back
		// to files only.
		i.d.opts.Logf("namespace: %s: criu dump: freezing timed out, trying once more: %v", i.id, err)
		thaw(freezer)
		if rerr := emptyDir(imageDir); rerr != nil {
			return fmt.Errorf("namespace: checkpoint %s: %w (and clearing the image dir: %w)", i.id, err, rerr)
		}
		err = dump()
	}
	if err != nil {
		return fmt.Errorf("namespace: checkpoint %s: %w", i.id, err)
	}
	i.d.opts.Logf("namespace: %s: criu dump %v", i.id, time.Since(t0).Round(time.Millisecond))
	b, err := json.Marshal(meta)
	if err != nil {
		return fmt.Errorf("namespace: checkpoint %s: %w", i.id, err)
	}
	if err := os.WriteFile(filepath.Join(imageDir, metaFile), b, 0o644); err != nil {
		return fmt.Errorf("namespace: checkpoint %s: %w", i.id, err)
	}
	return nil
}

// frozen reports whether the freezer cgroup dir is frozen (a paused
// sandbox: it stays so, and is not thawed by a retry).
func frozen(dir string) bool {
	if b, err := os.ReadFile(filepath.Join(dir, "cgroup.freeze")); err == nil {
		return strings.TrimSpace(string(b)) == "1"
	}
	b, _ := os.ReadFile(filepath.Join(dir, "freezer.state"))
	return strings.TrimSpace(string(b)) != "THAWED" && len(b) > 0
}

// thaw makes sure a freezer cgroup CRIU gave up on runs again.
func thaw(dir string) {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0); err != nil {
		_ = os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0)
	}
}

// emptyDir removes what dir holds, keeping dir.
func emptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// cgroupFile is the path of a file of the sandbox's cgroups by base name,
// "" if none has it.
func (i *Instance) cgroupFile(name string) string {
	for _, dir := range i.groups[0].Paths().Dirs {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return filepath.Join(dir, name)
		}
	}
	return ""
}

// handoffTimeout bounds the listener handoff's exchange with the agent.
const handoffTimeout = 10 * time.Second

// handoff asks the agent to give up its listener and connections and
// returns the descriptor it waits on for the next listener. It returns
// once the agent closed this last connection, i.e. holds no socket of the
// host's any more.
func (i *Instance) handoff(ctx context.Context) (int, error) {
	c, err := i.dialSocket(ctx) // past the gate its checkpoint closed
	if err != nil {
		return 0, fmt.Errorf("dial agent: %w", err)
	}
	defer c.Close()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	// Not shortened by ctx: once the request is out the agent hands its
	// listener off whether or not anyone reads the answer, and only the
	// answer says where to send the next one. A caller out of time waits
	// for it (the agent answers at once) and fails after.
	_ = c.SetDeadline(time.Now().Add(handoffTimeout))
	if _, err := io.WriteString(c, "POST "+agenthandoff.Path+" HTTP/1.1\r\nHost: agent\r\nContent-Length: 0\r\n\r\n"); err != nil {
		return 0, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, fmt.Errorf("listener handoff: %w", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, fmt.Errorf("listener handoff: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed:
		return 0, fmt.Errorf("the agent cannot hand off its listener (%s): %w", resp.Status, driver.ErrUnsupported)
	case resp.StatusCode != http.StatusOK:
		return 0, fmt.Errorf("listener handoff: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	var r agenthandoff.Reply
	if err := json.Unmarshal(body, &r); err != nil || r.FD <= 0 {
		return 0, fmt.Errorf("listener handoff: bad answer %q", body)
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		// Handed off, but not known to be done: the caller must still
		// give the listener back at r.FD.
		return r.FD, fmt.Errorf("listener handoff: waiting for the agent to close: %w", err)
	}
	return r.FD, nil
}

// handInAfterFailedHandoff gives the agent a listener after a handoff
// that failed: at fd if the agent's answer came (fd > 0), else at
// agenthandoff.FD if the agent put a socket pair end there, i.e. handed
// off without the answer arriving. Nil if the agent did not hand off.
func (i *Instance) handInAfterFailedHandoff(fd int) error {
	if fd > 0 {
		return i.handIn(fd)
	}
	if !i.agentHasHandoffEnd(agenthandoff.FD) {
		return nil
	}
	return i.handIn(agenthandoff.FD)
}

// agentHasHandoffEnd says whether the agent's descriptor fd is a unix
// seqpacket socket (only a handoff pair is).
func (i *Instance) agentHasHandoffEnd(fd int) bool {
	pidfd, err := unix.PidfdOpen(i.proc.pid, 0)
	if err != nil {
		return false
	}
	defer unix.Close(pidfd)
	end, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return false
	}
	defer unix.Close(end)
	typ, err := unix.GetsockoptInt(end, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return false
	}
	dom, err := unix.GetsockoptInt(end, unix.SOL_SOCKET, unix.SO_DOMAIN)
	return err == nil && typ == unix.SOCK_SEQPACKET && dom == unix.AF_UNIX
}

// handIn makes a new listener at the sandbox's socket and sends it to the
// agent through the end of its handoff pair at agentFD, which the host
// takes out of the agent with pidfd_getfd. The agent may be frozen: it
// takes the listener when it runs.
func (i *Instance) handIn(agentFD int) error {
	ln, err := listen(i.sock)
	if err != nil {
		return err
	}
	defer ln.Close()
	pidfd, err := unix.PidfdOpen(i.proc.pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(pidfd)
	end, err := unix.PidfdGetfd(pidfd, agentFD, 0)
	if err != nil {
		return fmt.Errorf("pidfd_getfd %d: %w", agentFD, err)
	}
	defer unix.Close(end)
	if err := unix.Sendmsg(end, []byte{1}, unix.UnixRights(int(ln.Fd())), nil, unix.MSG_DONTWAIT); err != nil {
		return fmt.Errorf("send listener: %w", err)
	}
	return nil
}

// Restore implements driver.Restorer: sandbox spec.ID starts from a
// Checkpoint image, its processes continuing where they were. It gets its
// own state dir, uid block (the image's user namespace map is rewritten
// onto it), cgroups and overlay; spec.InitLayer fills the layer with the
// checkpointed files. The image dir is only read (a private copy is made
// for CRIU, which must read it as the sandbox's root).
func (d *Driver) Restore(ctx context.Context, spec driver.Spec, imageDir string) (_ driver.Instance, err error) {
	t0 := time.Now()
	bin, err := d.criuBin(ctx)
	if err != nil {
		return nil, fmt.Errorf("namespace: restore %s: %w", spec.ID, err)
	}
	var meta criuMeta
	if b, err := os.ReadFile(filepath.Join(imageDir, metaFile)); err != nil {
		return nil, fmt.Errorf("namespace: restore %s: not a namespace checkpoint: %w", spec.ID, err)
	} else if err := json.Unmarshal(b, &meta); err != nil {
		return nil, fmt.Errorf("namespace: restore %s: %s: %w", spec.ID, metaFile, err)
	}
	if meta.UIDCount != d.opts.UIDCount {
		return nil, fmt.Errorf("namespace: restore %s: image has %d ids, this node gives sandboxes %d: %w", spec.ID, meta.UIDCount, d.opts.UIDCount, driver.ErrUnsupported)
	}
	id := spec.ID
	var undo cleanup
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	lay, err := d.layout(ctx, spec, &undo)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (driver.Instance, error) {
		return nil, fmt.Errorf("namespace: restore %s: %w", id, err)
	}

	// CRIU reads the images as the sandbox's root and as host uid 0
	// without capabilities: a copy of their own, owned accordingly.
	img := lay.hostPath("criu")
	if err := copyImage(imageDir, img, int(lay.uidBase)); err != nil {
		return fail(err)
	}
	if meta.UIDBase != lay.uidBase {
		if err := criu.RemapUserns(img, meta.UIDBase, lay.uidBase, meta.UIDCount); err != nil {
			return fail(err)
		}
	}
	if err := criu.ImageDirFor(img, int(lay.uidBase)); err != nil {
		return fail(err)
	}

	group, err := d.cg.Create(id)
	if err != nil {
		return fail(err)
	}
	undo.push(func() {
		ctx, cancel := context.WithTimeout(context.Background(), defaultDestroyWait)
		defer cancel()
		if err := group.Destroy(ctx); err != nil {
			d.opts.Logf("namespace: %s: %v", id, err)
		}
	})
	if err := group.SetLimits(d.limits(spec.Limits)); err != nil {
		return fail(err)
	}

	// The root CRIU restores onto: the overlay, mounted by the host with
	// names relative to the state dir as init mounts it (mountinfo inside
	// shows the options).
	if err := mountOverlay(lay.dir, lay.cfg); err != nil {
		return fail(err)
	}
	merged := lay.hostPath(lay.cfg.Merged)
	detach := func() {
		_ = unix.Unmount(merged, unix.MNT_DETACH)
		if lay.idmapped {
			unmountLower(lay.dir)
		}
	}
	undo.push(detach)

	logFile, err := os.OpenFile(lay.hostPath("init.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fail(err)
	}
	defer logFile.Close()
	// CRIU reopens an inherited file through /proc/self/fd as the
	// restored task, and checks its mode against the dumped one's.
	if err := logFile.Chown(int(lay.uidBase), int(lay.uidBase)); err != nil {
		return fail(err)
	}
	inherit := map[string]*os.File{}
	for _, f := range meta.Files {
		var of *os.File
		switch f.Role {
		case "log":
			if f.Mode != 0 {
				if err := logFile.Chmod(f.Mode); err != nil {
					return fail(err)
				}
			}
			of = logFile
		case "host":
			if of, err = os.OpenFile(f.Path, os.O_RDWR, 0); err != nil {
				return fail(err)
			}
			defer of.Close()
		case "cgroup":
			p := ""
			for _, dir := range group.Paths().Dirs {
				if _, err := os.Stat(filepath.Join(dir, f.Path)); err == nil {
					p = filepath.Join(dir, f.Path)
					break
				}
			}
			if p == "" {
				return fail(fmt.Errorf("no cgroup file %s to give the restored agent", f.Path))
			}
			if of, err = os.Open(p); err != nil {
				return fail(err)
			}
			defer of.Close()
		default:
			return fail(fmt.Errorf("external file %s: unknown role %q", f.Key, f.Role))
		}
		inherit[f.Key] = of
	}
	// The restored tasks inherit criu's cgroups: it joins the sandbox's
	// before it execs.
	var prep strings.Builder
	for _, dir := range group.Paths().Dirs {
		fmt.Fprintf(&prep, "echo $$ > %s\n", shellQuote(filepath.Join(dir, "cgroup.procs")))
	}
	// And a cgroup namespace rooted there, as init unshares one: the
	// restored tasks inherit it, so /proc/self/cgroup inside reads "/".
	prep.WriteString(`exec unshare --cgroup "$0" "$@"` + "\n")
	// The sandbox's network (veths whose peer was on the host) is not
	// restored: CRIU would make the pair from inside the sandbox's user
	// namespace, which may not put an end on the host (EPERM). The
	// network hook below sets up a new one.
	if err := criu.DropInterfaces(img, meta.Veths); err != nil {
		return fail(err)
	}
	tr := time.Now()
	ro := criu.RestoreOptions{
		ImageDir: img, Root: merged, LogDir: lay.dir,
		ExternalMounts: deviceMounts(false), Inherit: inherit,
		Prepare: prep.String(), Args: []string{"--manage-cgroups=ignore"},
	}
	var pid int
	var pages *criu.Pages
	if d.lazyRestore(ctx, bin, img) {
		pid, pages, err = criu.RestoreLazy(ctx, bin, ro)
		if err != nil && ctx.Err() == nil {
			// CRIU undid its part; the root is still mounted: try
			// again with every page copied in first.
			d.opts.Logf("namespace: %s: lazy restore failed, restoring eagerly: %v", id, err)
			pid, err = criu.Restore(ctx, bin, ro)
		}
	} else {
		pid, err = criu.Restore(ctx, bin, ro)
	}
	if err != nil {
		return fail(err)
	}
	if pages != nil {
		// Undo runs last in, first out: the tree's kill (pushed below)
		// comes first, then the daemon's.
		undo.push(pages.Stop)
	}
	took := time.Since(tr)
	// The restored mount namespace holds its own references.
	detach()
	startTime, err := procStartTime(pid)
	if err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		return fail(err)
	}
	pidNS, err := pidNamespace(pid)
	if err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		return fail(err)
	}
	proc, err := openVerified(pid, startTime, pidNS)
	if err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		return fail(err)
	}
	undo.push(func() {
		_ = proc.kill()
		select {
		case <-proc.done:
		case <-time.After(defaultDestroyWait):
		}
		proc.release()
	})
	sock := d.sockPath(id)
	undo.push(func() { _ = os.Remove(sock) })
	if err := writeState(lay.dir, state{
		ID: id, PID: pid, StartTime: startTime, PidNS: pidNS, Socket: sock,
		Cgroups: group.Paths(), Created: time.Now().UTC(), UIDBase: lay.uidBase,
	}); err != nil {
		return nil, err
	}
	if err := setHostname(pid, lay.hostname); err != nil {
		return fail(err)
	}
	if d.opts.Network != nil {
		if err := d.opts.Network(ctx, id, pid); err != nil {
			return fail(fmt.Errorf("network: %w", err))
		}
	}
	inst := &Instance{d: d, id: id, sock: sock, groups: []*cgroups.Group{group}, proc: proc, uidBase: lay.uidBase, pages: pages}
	if err := inst.handIn(meta.HandoffFD); err != nil {
		return fail(err)
	}
	if err := waitAgent(ctx, inst, d.opts.ReadyTimeout); err != nil {
		return fail(fmt.Errorf("%w%s", err, logTail(lay.hostPath("init.log"))))
	}
	if d.opts.Probe != nil {
		if err := d.opts.Probe(ctx, inst); err != nil {
			return fail(fmt.Errorf("agent probe: %w", err))
		}
	}
	if pages == nil {
		_ = os.RemoveAll(img)
	} else {
		// The daemon reads the image until every page is in.
		go func() {
			if err := pages.Err(); err != nil {
				d.opts.Logf("namespace: %s: lazy restore: %v", id, err)
			}
			_ = os.RemoveAll(img)
		}()
	}
	inst.timing = driver.Timing{Total: time.Since(t0), AgentReady: time.Since(tr)}
	d.opts.Logf("namespace: restored %s in %v (criu restore %v)", id, inst.timing.Total, took)
	return inst, nil
}

// lazyRestore says whether a restore of img brings its memory in on
// demand: asked for, the image big enough (Options.LazyRestoreMin),
// /dev/userfaultfd there for CRIU's restore to open and the kernel's
// userfaultfd able to follow a restored tree (criu check --feature
// uffd-noncoop), both checked once.
func (d *Driver) lazyRestore(ctx context.Context, bin, img string) bool {
	if !d.opts.LazyRestore {
		return false
	}
	d.uffdOnce.Do(func() {
		f, err := os.OpenFile("/dev/userfaultfd", os.O_RDWR, 0)
		if err != nil {
			d.opts.Logf("namespace: restores stay eager: %v", err)
			return
		}
		f.Close()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if out, err := criu.Command(cctx, bin, "check", "--feature", "uffd-noncoop").CombinedOutput(); err != nil {
			d.opts.Logf("namespace: restores stay eager: criu check --feature uffd-noncoop: %v: %s", err, strings.TrimSpace(string(out)))
			return
		}
		d.uffdOK = true
	})
	if !d.uffdOK {
		return false
	}
	var n int64
	ents, _ := os.ReadDir(img)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "pages-") && strings.HasSuffix(e.Name(), ".img") {
			if fi, err := e.Info(); err == nil {
				n += fi.Size()
			}
		}
	}
	return n >= d.opts.LazyRestoreMin
}

// waitAgent waits until inst's agent accepts a connection.
func waitAgent(ctx context.Context, inst *Instance, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		c, err := inst.Dial(ctx)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent does not answer after restore: %w", err)
		case <-inst.proc.done:
			return errors.New("restored PID 1 exited")
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// copyImage puts a private copy of the image files in src into dst for
// a sandbox whose root is host uid owner: hard links to the files anyone
// may read (CRIU only reads them; the pages are most of the bytes), copies
// owned by owner of the others (CRIU writes some 0600).
func copyImage(src, dst string, owner int) error {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || strings.HasSuffix(e.Name(), ".log") {
			continue
		}
		s, t := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		fi, err := e.Info()
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o004 != 0 && os.Link(s, t) == nil {
			continue
		}
		if err := copyFile(s, t, owner); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string, owner int) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chown(owner, 0); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// mountOverlay mounts the sandbox's overlay at cfg.Merged on the host with
// cfg's names relative to dir, from a thread of its own that changed
// directory (a thread's cwd is shared with the process unless unshared);
// the thread is dropped afterwards.
func mountOverlay(dir string, cfg sandboxinit.Config) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("unshare fs: %w", err)
			return
		}
		if err := unix.Chdir(dir); err != nil {
			errc <- err
			return
		}
		opts := cfg.OverlayOptions()
		if err := unix.Mount("overlay", cfg.Merged, "overlay", 0, opts); err != nil {
			errc <- fmt.Errorf("mount overlay (%s): %w", opts, err)
			return
		}
		errc <- nil
	}()
	return <-errc
}

// setHostname gives the restored sandbox its own hostname (the image has
// the checkpointed one's), from a thread that joins its uts namespace and
// is dropped afterwards.
func setHostname(pid int, name string) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine.
		runtime.LockOSThread()
		fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/uts", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWUTS); err != nil {
			errc <- fmt.Errorf("setns uts: %w", err)
			return
		}
		errc <- unix.Sethostname([]byte(name))
	}()
	return <-errc
}

// netInterfaces names the interfaces of pid's network namespace other
// than loopback (from /proc/<pid>/net/dev, which shows the namespace of
// the process it is read through).
func netInterfaces(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", pid))
	if err != nil {
		return nil, fmt.Errorf("network interfaces: %w", err)
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		name, _, ok := strings.Cut(line, ":")
		if name = strings.TrimSpace(name); !ok || name == "" || name == "lo" || strings.Contains(name, "|") {
			continue
		}
		names = append(names, name)
	}
	return names, nil
}

// hostVeths names the veth interfaces of pid's network namespace whose
// peer is in another namespace (the host's: a sandbox network).
func hostVeths(pid int) ([]string, error) {
	ns, err := vns.GetFromPid(pid)
	if err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("network interfaces: %w", err)
	}
	var names []string
	for _, l := range links {
		if l.Type() == "veth" && l.Attrs().NetNsID >= 0 {
			names = append(names, l.Attrs().Name)
		}
	}
	return names, nil
}

// without returns the names in a that are not in b.
func without(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}
