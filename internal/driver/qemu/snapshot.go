package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/space-sandbox/space/internal/driver"
)

// Files of a checkpoint directory.
const (
	ckptMemory = "memory.mig" // QEMU's migration stream: RAM and device state
	ckptUpper  = "upper.data" // the writable disk's data extents, as of the stream
	ckptMap    = "upper.map"  // where they go in the (sparse) disk
	ckptConfig = "vm.json"    // the machine the stream belongs to
)

// checkpoint is ckptConfig.
type checkpoint struct {
	VM         vmConfig      `json:"vm"`
	BalloonMiB int           `json:"balloon_mib,omitempty"`
	Limits     driver.Limits `json:"limits"`
}

var (
	_ driver.Checkpointer = (*Instance)(nil)
	_ driver.Restorer     = (*Driver)(nil)
)

// migrateBandwidth lifts QEMU's default migration cap (32 MiB/s): the
// stream goes to a local file, not over a network.
const migrateBandwidth = 8 << 30

// Checkpoint implements driver.Checkpointer: it saves the whole VM into
// dir (created if missing): its memory and device state (QMP migrate to a
// file descriptor QEMU is handed over the monitor socket, with the vCPUs
// stopped), the writable disk as of that moment, and the machine's
// configuration. The VM is left paused and alive; Resume (QMP cont) lets
// it run on, reactivating its disks. The template and agent disks are
// not copied: they are content-addressed in the driver's image cache,
// and Restore checks they are the same files.
func (i *Instance) Checkpoint(ctx context.Context, dir string) (err error) {
	i.limMu.Lock()
	defer i.limMu.Unlock()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("qemu: checkpoint: %w", err)
	}
	q, err := dialQMP(ctx, i.d.qmpSock(i.id), i.exited)
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.run("stop", nil, nil); err != nil {
		return err
	}
	tmp := filepath.Join(dir, ckptMemory+".tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("qemu: checkpoint: %w", err)
	}
	defer os.Remove(tmp)
	err = q.runFD("getfd", map[string]any{"fdname": "space-ckpt"}, nil, f)
	f.Close() // QEMU holds its own copy now
	if err != nil {
		return err
	}
	if err := q.run("migrate-set-parameters", map[string]any{"max-bandwidth": migrateBandwidth}, nil); err != nil {
		return err
	}
	if err := q.run("migrate", map[string]any{"uri": "fd:space-ckpt"}, nil); err != nil {
		return err
	}
	if err := q.waitMigration(ctx); err != nil {
		return err
	}
	// QEMU flushed and let go of the disks when the migration completed;
	// the vCPUs are stopped, so the copy matches the memory image.
	if err := saveSparse(filepath.Join(i.d.sandboxDir(i.id), "upper.ext4"), filepath.Join(dir, ckptUpper), filepath.Join(dir, ckptMap)); err != nil {
		return err
	}
	b, err := json.Marshal(checkpoint{VM: i.st.VM, BalloonMiB: i.st.BalloonMiB, Limits: i.st.Limits})
	if err != nil {
		return fmt.Errorf("qemu: checkpoint: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ckptConfig), b, 0o600); err != nil {
		return fmt.Errorf("qemu: checkpoint: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, ckptMemory)); err != nil {
		return fmt.Errorf("qemu: checkpoint: %w", err)
	}
	return nil
}

// Restore implements driver.Restorer: it starts sandbox spec.ID from a
// checkpoint directory written by Checkpoint: a copy of the saved writable
// disk, then QEMU with the saved machine and `-incoming` from the memory
// image. Every process, the agent included, continues where it was.
// Restoring one checkpoint several times forks it (each restore gets its
// own disk copy). The writable disk comes from dir, so spec.InitLayer is
// not called (a VM has no host-side layer directory). spec's hostname and
// memory size are the checkpoint's (they live in guest memory); its CPU
// limit applies. dir is no longer read once Restore returns.
func (d *Driver) Restore(ctx context.Context, spec driver.Spec, dir string) (_ driver.Instance, err error) {
	t0 := time.Now()
	if !idRE.MatchString(spec.ID) {
		return nil, fmt.Errorf("qemu: bad sandbox id %q", spec.ID)
	}
	var ck checkpoint
	b, err := os.ReadFile(filepath.Join(dir, ckptConfig))
	if err != nil {
		return nil, fmt.Errorf("qemu: restore: %w", err)
	}
	if err := json.Unmarshal(b, &ck); err != nil {
		return nil, fmt.Errorf("qemu: restore: %s: %w", ckptConfig, err)
	}
	boot, err := d.bootFiles(ctx)
	if err != nil {
		return nil, err
	}
	root := ck.VM.RootDisk
	if spec.RootfsDir != "" {
		if root, err = d.rootDisk(ctx, spec.RootfsDir); err != nil {
			return nil, err
		}
	}
	// The guest has these disks' blocks cached and its kernel in memory:
	// only the very same files will do.
	for _, p := range [][2]string{{boot.vmlinux, ck.VM.Vmlinux}, {boot.initramfs, ck.VM.Initramfs},
		{boot.agentDisk, ck.VM.AgentDisk}, {root, ck.VM.RootDisk}} {
		if p[0] != p[1] {
			return nil, fmt.Errorf("qemu: restore: the checkpoint was made with %s, this driver has %s: %w", p[1], p[0], driver.ErrUnsupported)
		}
	}
	if ck.VM.Net != (d.opts.Network != nil) {
		return nil, fmt.Errorf("qemu: restore: the checkpoint's VM has network=%v, this driver %v: %w", ck.VM.Net, d.opts.Network != nil, driver.ErrUnsupported)
	}
	mem, err := os.Open(filepath.Join(dir, ckptMemory))
	if err != nil {
		return nil, fmt.Errorf("qemu: restore: %w", err)
	}
	defer mem.Close()
	id := spec.ID
	sdir := d.sandboxDir(id)
	if err := os.Mkdir(sdir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("qemu: sandbox %s already exists", id)
		}
		return nil, fmt.Errorf("qemu: %w", err)
	}
	defer func() {
		if err != nil {
			_ = d.remove(context.Background(), id)
		}
	}()
	if err := loadSparse(filepath.Join(dir, ckptUpper), filepath.Join(dir, ckptMap), filepath.Join(sdir, "upper.ext4")); err != nil {
		return nil, err
	}
	l := spec.Limits
	l.MemoryBytes = ck.Limits.MemoryBytes
	inst, err := d.launch(ctx, id, ck.VM, mem, l)
	if err != nil {
		return nil, err
	}
	inst.timing.Total = time.Since(t0)
	inst.timing.AgentReady = inst.timing.Total
	if ck.BalloonMiB > 0 {
		inst.st.BalloonMiB = ck.BalloonMiB
		if err := d.writeState(id, inst.st); err != nil {
			return nil, err
		}
	}
	return inst, nil
}
