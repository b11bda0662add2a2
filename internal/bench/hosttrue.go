package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// RunHostTrue times the template's /bin/true forked, exec'd and waited for
// straight from this process on the host: no sandbox, no namespaces, no
// API. It is the floor under the exec round trip, which runs the same
// binary: what the command costs by itself on this machine (on a
// nested-virtualization host, glibc's start-up CPUID probes alone trap to
// the hypervisor tens of times; docs/PERFORMANCE.md). Two warm-up runs are
// not counted.
func RunHostTrue(ctx context.Context, rootfs string, runs int) (*Summary, error) {
	bin, err := resolveIn(rootfs, trueArgv[0])
	if err != nil {
		return nil, fmt.Errorf("host true: %w", err)
	}
	var times []time.Duration
	for i := 0; i < runs+2; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// argv[0] names the applet for a multi-call binary (busybox).
		cmd := &exec.Cmd{Path: bin, Args: []string{filepath.Base(trueArgv[0])}, Env: []string{}}
		t0 := time.Now()
		err := cmd.Run()
		d := time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("host true: %s: %w", bin, err)
		}
		if i >= 2 {
			times = append(times, d)
		}
	}
	s := Summarize(times)
	return &s, nil
}

// resolveIn finds the file that path names inside the tree at root,
// following symbolic links as the sandbox would see them: an absolute
// target is taken from root, and no step may leave it.
func resolveIn(root, path string) (string, error) {
	cur := filepath.Clean("/" + path)
	for hops := 0; hops < 40; hops++ {
		host := filepath.Join(root, cur)
		fi, err := os.Lstat(host)
		if err != nil {
			return "", err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			if !fi.Mode().IsRegular() {
				return "", fmt.Errorf("%s is not a regular file", cur)
			}
			return host, nil
		}
		target, err := os.Readlink(host)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(cur), target)
		}
		// Clean of a rooted path cannot climb above "/".
		cur = filepath.Clean("/" + target)
		if strings.Contains(cur, "\x00") {
			return "", errors.New("bad link target")
		}
	}
	return "", fmt.Errorf("%s: too many levels of symbolic links", path)
}
