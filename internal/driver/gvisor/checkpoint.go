package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/space-sandbox/space/internal/driver"
)

// Checkpoint saves the sandbox's whole state (every process with its
// memory, open files, the agent) into imageDir with `runsc checkpoint`,
// which stops the sandbox. Its writable layer must be saved alongside
// (WritableLayer): a restore needs the same files. The instance only needs
// Destroy afterwards.
func (i *Instance) Checkpoint(ctx context.Context, imageDir string) error {
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", i.id, err)
	}
	if _, err := i.d.r.run(ctx, "checkpoint", "-image-path", imageDir, i.id); err != nil {
		return fmt.Errorf("gvisor: checkpoint %s: %w", i.id, err)
	}
	return nil
}

// Restore creates sandbox spec.ID from a checkpoint image: the processes
// continue where they were when Checkpoint ran. spec.InitLayer must fill
// the writable layer with the checkpointed sandbox's files; spec.Limits
// should be the checkpointed ones (the sentry keeps its memory size).
func (d *Driver) Restore(ctx context.Context, spec driver.Spec, imageDir string) (driver.Instance, error) {
	if fi, err := os.Stat(filepath.Join(imageDir, "checkpoint.img")); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("gvisor: restore %s: no checkpoint image in %s: %w", spec.ID, imageDir, errors.Join(err, fs.ErrNotExist))
	}
	return d.create(ctx, spec, imageDir)
}

// restoreArgs are the runsc arguments that start a sandbox from an image.
func restoreArgs(imageDir, bundle, id string) []string {
	return []string{"restore", "-detach", "-image-path", imageDir, "-bundle", bundle, id}
}

