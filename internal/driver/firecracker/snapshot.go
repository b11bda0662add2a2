package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	sdk "github.com/firecracker-microvm/firecracker-go-sdk"
	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"
	"github.com/sirupsen/logrus"

	"github.com/space-sandbox/space/internal/consolelog"
	"github.com/space-sandbox/space/internal/driver"
)

// Files of a checkpoint directory.
const (
	ckptMemory = "memory"     // guest memory (Full snapshot)
	ckptState  = "vmstate"    // Firecracker's device state
	ckptUpper  = "upper.ext4" // the writable disk as of the snapshot
	ckptConfig = "vm.json"    // which sandbox and files it belongs to
)

var (
	_ driver.Checkpointer = (*Instance)(nil)
	_ driver.Restorer     = (*Driver)(nil)
)

// checkpoint is ckptConfig.
type checkpoint struct {
	ID    string `json:"id"`
	State state  `json:"state"`
}

// Checkpoint implements driver.Checkpointer: PATCH /vm Paused, PUT
// /snapshot/create (Full) into dir, then a copy of the writable disk and
// the VM's description. The VM is left paused.
//
// Without the jailer, Firecracker records the absolute paths of the
// drives and the vsock socket in the snapshot and reopens exactly those on
// load, so such a checkpoint restores only into the same sandbox id (after
// the original is gone); see Restore. Under the jailer every VM sees the
// same chroot-relative paths, but writing the snapshot into the jail is
// not wired, so Checkpoint refuses there.
func (i *Instance) Checkpoint(ctx context.Context, dir string) error {
	if i.d.opts.Jailer != "" {
		return fmt.Errorf("firecracker: checkpoint of a jailed VM: %w", driver.ErrUnsupported)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("firecracker: checkpoint: %w", err)
	}
	if err := i.Pause(ctx); err != nil {
		return err
	}
	if err := i.Snapshot(ctx, filepath.Join(dir, ckptMemory), filepath.Join(dir, ckptState), false); err != nil {
		return err
	}
	if err := copySparse(ctx, filepath.Join(i.d.sandboxDir(i.id), "upper.ext4"), filepath.Join(dir, ckptUpper)); err != nil {
		return err
	}
	b, err := json.Marshal(checkpoint{ID: i.id, State: i.st})
	if err != nil {
		return fmt.Errorf("firecracker: checkpoint: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ckptConfig), b, 0o600); err != nil {
		return fmt.Errorf("firecracker: checkpoint: %w", err)
	}
	return nil
}

// Restore implements driver.Restorer: a fresh Firecracker process, the
// saved writable disk back at its path, then PUT /snapshot/load
// {snapshot_path, mem_file_path, enable_diff_snapshots, resume_vm: true},
// and the agent over vsock. The disk comes from dir, so spec.InitLayer is
// not called. spec.ID must be the checkpointed sandbox's (see
// Checkpoint); a fork into another id fails with driver.ErrUnsupported.
func (d *Driver) Restore(ctx context.Context, spec driver.Spec, dir string) (_ driver.Instance, err error) {
	if !idRE.MatchString(spec.ID) {
		return nil, fmt.Errorf("firecracker: bad sandbox id %q", spec.ID)
	}
	if d.opts.Jailer != "" {
		return nil, fmt.Errorf("firecracker: restore under the jailer: %w", driver.ErrUnsupported)
	}
	var ck checkpoint
	b, err := os.ReadFile(filepath.Join(dir, ckptConfig))
	if err != nil {
		return nil, fmt.Errorf("firecracker: restore: %w", err)
	}
	if err := json.Unmarshal(b, &ck); err != nil {
		return nil, fmt.Errorf("firecracker: restore: %s: %w", ckptConfig, err)
	}
	if ck.ID != spec.ID {
		return nil, fmt.Errorf("firecracker: restore of %s into %s: the snapshot names %s's disk and vsock paths: %w", ck.ID, spec.ID, ck.ID, driver.ErrUnsupported)
	}
	boot, err := d.bootFiles(ctx)
	if err != nil {
		return nil, err
	}
	root := ck.State.RootDisk
	if spec.RootfsDir != "" {
		if root, err = d.rootDisk(ctx, spec.RootfsDir); err != nil {
			return nil, err
		}
	}
	for _, p := range [][2]string{{boot.vmlinux, ck.State.Vmlinux}, {boot.initramfs, ck.State.Initramfs},
		{boot.agentDisk, ck.State.AgentDisk}, {root, ck.State.RootDisk}} {
		if p[0] != p[1] {
			return nil, fmt.Errorf("firecracker: restore: the checkpoint was made with %s, this driver has %s: %w", p[1], p[0], driver.ErrUnsupported)
		}
	}
	id := spec.ID
	sdir := d.sandboxDir(id)
	if err := os.Mkdir(sdir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("firecracker: sandbox %s already exists", id)
		}
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	defer func() {
		if err != nil {
			_ = d.remove(context.Background(), id)
		}
	}()
	if err := copySparse(ctx, filepath.Join(dir, ckptUpper), filepath.Join(sdir, "upper.ext4")); err != nil {
		return nil, err
	}
	sock := d.apiSock(id)
	var cmd *exec.Cmd
	if d.opts.command != nil {
		cmd = d.opts.command(sock)
	} else {
		cmd = exec.Command(d.opts.Firecracker, "--api-sock", sock, "--id", id)
	}
	if err := consolelog.Mount(sdir); err != nil {
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	logf, err := os.Create(consolelog.Path(sdir, "firecracker.log"))
	if err != nil {
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return nil, fmt.Errorf("firecracker: start: %w", err)
	}
	go func() { _ = cmd.Wait() }()
	start, _, err := procStat(cmd.Process.Pid)
	if err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	st := ck.State
	st.PID, st.StartTime = cmd.Process.Pid, start
	b, _ = json.Marshal(st)
	if err := os.WriteFile(filepath.Join(sdir, "state.json"), b, 0o600); err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("firecracker: %w", err)
	}
	rctx, cancel := context.WithTimeout(ctx, d.opts.ReadyTimeout)
	defer cancel()
	if err := waitSocket(rctx, sock); err != nil {
		return nil, fmt.Errorf("firecracker: sandbox %s: api socket: %w", id, err)
	}
	logger := logrus.New()
	logger.SetOutput(io.Discard)
	api := sdk.NewClient(sock, logrus.NewEntry(logger), false)
	if _, err := api.LoadSnapshot(rctx, &models.SnapshotLoadParams{
		SnapshotPath: sdk.String(filepath.Join(dir, ckptState)), MemFilePath: sdk.String(filepath.Join(dir, ckptMemory)),
		EnableDiffSnapshots: true, ResumeVM: true,
	}); err != nil {
		return nil, fmt.Errorf("firecracker: sandbox %s: snapshot load: %w", id, err)
	}
	inst := &Instance{d: d, id: id, st: st}
	if err := inst.waitReady(rctx); err != nil {
		return nil, fmt.Errorf("firecracker: sandbox %s: agent not ready: %w", id, err)
	}
	return inst, nil
}

// waitSocket waits until a unix socket accepts connections.
func waitSocket(ctx context.Context, path string) error {
	for {
		var nd net.Dialer
		c, err := nd.DialContext(ctx, "unix", path)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// copySparse copies a disk image, keeping its holes.
func copySparse(ctx context.Context, from, to string) error {
	out, err := exec.CommandContext(ctx, "cp", "--sparse=always", "--", from, to).CombinedOutput()
	if err != nil {
		return fmt.Errorf("firecracker: copy %s: %w: %s", from, err, strings.TrimSpace(string(out)))
	}
	return nil
}
