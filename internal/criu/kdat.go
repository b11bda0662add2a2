package criu

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// KdatEnv is the environment variable scripts/criu.sh's build (patch
// 0006) reads for the directory of its kernel-feature cache.
const KdatEnv = "CRIU_KDAT_DIR"

// kdatDir is where CRIU keeps its kernel-feature cache (criu.kdat) when
// the host's /run, its default, is not a tmpfs: CRIU keeps the cache only
// on a tmpfs, so that a reboot into another kernel drops it, and without
// it every dump and restore probes the kernel again (about 50 ms here).
// The directory is per build tag (a patch may change what is probed) and
// root's own, mode 0700, in a sticky /dev/shm: another local user cannot
// plant a cache there. "" when /run is a tmpfs (CRIU's default holds) or
// no such directory can be had (CRIU probes every time, as before).
func kdatDir() string {
	if isTmpfs("/run") || !isTmpfs("/dev/shm") || os.Geteuid() != 0 {
		return ""
	}
	return ownDir(filepath.Join("/dev/shm", "space-criu-kdat-"+BuildTag))
}

// ownDir makes dir (mode 0700) unless it exists, and returns it if it is
// a directory, not a link, of mode 0700 owned by root; else "".
func ownDir(dir string) string {
	if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
		return ""
	}
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		return ""
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != 0 {
		return ""
	}
	return dir
}

func isTmpfs(path string) bool {
	var s unix.Statfs_t
	return unix.Statfs(path, &s) == nil && s.Type == unix.TMPFS_MAGIC
}

// command is exec.CommandContext for CRIU (or a shell that execs it),
// with the kernel-feature cache's directory in its environment where
// /run cannot hold it.
func command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	if dir := kdatDir(); dir != "" {
		cmd.Env = append(os.Environ(), KdatEnv+"="+dir)
	}
	return cmd
}

// Command is a CRIU command with the environment the driver runs CRIU
// in (see kdatDir): for the callers that run `criu check --feature`.
func Command(ctx context.Context, path string, args ...string) *exec.Cmd {
	return command(ctx, path, args...)
}
