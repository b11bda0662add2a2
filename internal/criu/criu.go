// Package criu runs CRIU (Checkpoint/Restore In Userspace) on a process
// tree in its own namespaces: finding the pinned build scripts/criu.sh
// makes, asking it whether it works on this kernel, and dump/restore with
// the options a SPACE sandbox needs (external bind mounts and files, TCP
// connections closed rather than restored, a root filesystem the caller
// mounts). It knows nothing of sandboxes; the namespace driver builds on it.
//
// CRIU runs as root on the host and ptraces the sandbox's processes, reads
// their memory and writes their images: docs/security.md says what that
// means for the trust boundary.
package criu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PinnedVersion is the CRIU version scripts/criu.sh builds and Find looks
// for first. Debian bookworm's 3.17 fails on kernels from 6.13 on ("vdso:
// Unexpected rt vDSO area bounds"); 4.1 is the first that handles them.
const PinnedVersion = "4.1.1"

// DefaultCache is where scripts/criu.sh puts its builds:
// <DefaultCache>/<version>/criu, with a DONE marker beside it.
const DefaultCache = "/var/cache/space/criu"

// EnvVar names the binary to use when no explicit path is given.
const EnvVar = "SPACE_CRIU"

// ErrUnavailable means there is no usable CRIU: none found, too old, or
// `criu check` fails on this kernel. Callers fall back to snapshots
// without processes and say why.
var ErrUnavailable = errors.New("criu: not available")

// Find returns the CRIU binary to use: explicit if set, else $SPACE_CRIU,
// else the pinned build in DefaultCache, else criu on PATH.
func Find(explicit string) (string, error) {
	if explicit == "" {
		explicit = os.Getenv(EnvVar)
	}
	if explicit != "" {
		p, err := exec.LookPath(explicit)
		if err != nil {
			return "", fmt.Errorf("criu %q: %w: %w", explicit, err, ErrUnavailable)
		}
		return filepath.Abs(p)
	}
	pinned := filepath.Join(DefaultCache, PinnedVersion, "criu")
	if fi, err := os.Stat(pinned); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
		return pinned, nil
	}
	if p, err := exec.LookPath("criu"); err == nil {
		return filepath.Abs(p)
	}
	return "", fmt.Errorf("no criu (looked at $%s, %s and on PATH; build it with scripts/criu.sh): %w", EnvVar, pinned, ErrUnavailable)
}

// Version runs `criu --version` and returns the version it reports
// ("4.1.1"). Versions before 4.1 are refused with ErrUnavailable.
func Version(ctx context.Context, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := command(ctx, path, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w: %s: %w", path, err, bytes.TrimSpace(out), ErrUnavailable)
	}
	v := ""
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "Version:"); ok {
			v = strings.TrimSpace(rest)
		}
	}
	if v == "" {
		return "", fmt.Errorf("%s --version: no version in %q: %w", path, bytes.TrimSpace(out), ErrUnavailable)
	}
	if !atLeast(v, 4, 1) {
		return v, fmt.Errorf("criu %s at %s is older than 4.1 and cannot checkpoint on current kernels: %w", v, path, ErrUnavailable)
	}
	return v, nil
}

// atLeast reports whether version v ("4.1.1") is at least major.minor.
func atLeast(v string, major, minor int) bool {
	f := strings.SplitN(v, ".", 3)
	if len(f) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(f[0])
	mi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// Check runs `criu check` (root only) and returns its verdict ("Looks
// good."); a failure wraps ErrUnavailable with CRIU's own error lines.
func Check(ctx context.Context, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := command(ctx, path, "check").CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil || !strings.Contains(text, "Looks good") {
		return "", fmt.Errorf("%s check: %v: %s: %w", path, err, errorLines(text, 3), ErrUnavailable)
	}
	return "Looks good.", nil
}

// Probe finds CRIU and checks it: the path, its version and check's
// verdict, or why it cannot be used.
func Probe(ctx context.Context, explicit string) (path, version string, err error) {
	if path, err = Find(explicit); err != nil {
		return "", "", err
	}
	if version, err = Version(ctx, path); err != nil {
		return path, version, err
	}
	if _, err = Check(ctx, path); err != nil {
		return path, version, err
	}
	return path, version, nil
}

// ExternalFile is an open file of the dumped tree that cannot be reached
// from its own mount namespace (a host log file, a cgroup file the Go
// runtime keeps open): CRIU records it by key and the restore supplies a
// descriptor for it.
type ExternalFile struct {
	MntID int    // mnt_id from /proc/<pid>/fdinfo/<fd>
	Inode uint64 // st_ino of the file
	// Path is where the host sees it (ExternalFiles fills it in; not part
	// of the key): what a restore reopens, or a new file in its place.
	Path string
}

// Key is the name CRIU gives the file in its image (hex numbers), which
// RestoreOptions.Inherit maps to a descriptor.
func (f ExternalFile) Key() string { return fmt.Sprintf("file[%x:%x]", f.MntID, f.Inode) }

// DumpOptions are the arguments of Dump.
type DumpOptions struct {
	// PID is the host pid of the tree's root (a pid namespace's init).
	PID int
	// ImageDir receives the images; it must exist.
	ImageDir string
	// LeaveRunning keeps the tree alive after the dump (else CRIU kills it).
	LeaveRunning bool
	// ExternalMounts maps a mount point inside the tree that is bound from
	// outside it (e.g. /dev/null) to the key Restore gets its source by.
	ExternalMounts map[string]string
	// ExternalFiles are open files outside the tree's mounts.
	ExternalFiles []ExternalFile
	// FreezeCgroup, if set, is the cgroup CRIU freezes to collect the tree
	// (all of the tree's tasks and nothing else). A group frozen already
	// stays frozen after a LeaveRunning dump.
	FreezeCgroup string
	// Args are more CRIU options.
	Args []string
	// Overrun is how long CRIU may go on after ctx ends before it is
	// killed (default DefaultOverrun); see Dump.
	Overrun time.Duration
}

// DefaultOverrun is DumpOptions.Overrun's default.
const DefaultOverrun = 30 * time.Second

// seizeTimeout is CRIU's own default bound on collecting the tree.
const seizeTimeout = 10 * time.Second

// Dump checkpoints the tree rooted at o.PID into o.ImageDir. Established
// TCP connections are not saved (--tcp-close): a restored tree sees them
// closed, while listening sockets come back. The network is not locked
// (--network-lock skip): nothing is saved that a lock would protect.
// CRIU's log is o.ImageDir/dump.log; an error quotes its error lines.
//
// ctx bounds the dump without killing CRIU at its end: CRIU killed while
// it injects or runs its parasite code in a task leaves that task to
// crash or hang (a sandbox's PID 1 died of a dump cut at its deadline).
// So ctx's deadline becomes CRIU's own --timeout for collecting the tree,
// which it abandons cleanly, and a dump under way when ctx ends runs to
// its end; only one still running o.Overrun after that is killed.
func Dump(ctx context.Context, path string, o DumpOptions) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("criu dump of %d: %w", o.PID, err)
	}
	args := []string{"dump", "-t", strconv.Itoa(o.PID), "-D", o.ImageDir, "-o", "dump.log", "-v2",
		"--tcp-close", "--network-lock", "skip"}
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < seizeTimeout {
			// Whole seconds, at least one: CRIU's unit.
			args = append(args, "--timeout", strconv.Itoa(int(max(1, (left+time.Second-1)/time.Second))))
		}
	}
	if o.LeaveRunning {
		args = append(args, "--leave-running")
	}
	if o.FreezeCgroup != "" {
		args = append(args, "--freeze-cgroup", o.FreezeCgroup)
	}
	for _, mp := range sortedKeys(o.ExternalMounts) {
		args = append(args, "--external", "mnt["+mp+"]:"+o.ExternalMounts[mp])
	}
	for _, f := range o.ExternalFiles {
		args = append(args, "--external", f.Key())
	}
	args = append(args, o.Args...)
	overrun := o.Overrun
	if overrun <= 0 {
		overrun = DefaultOverrun
	}
	run, kill := context.WithCancel(context.WithoutCancel(ctx))
	defer kill()
	overran := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(overrun)
		defer t.Stop()
		select {
		case <-t.C:
			close(overran)
			kill()
		case <-run.Done():
		}
	})
	defer stop()
	cmd := command(run, path, args...)
	// Killed only past the overrun; a helper it left holding the output
	// pipe must not keep the caller waiting.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		select {
		case <-overran:
			err = fmt.Errorf("still dumping %v after its deadline, killed (%w): %w", overrun, ctx.Err(), err)
		default:
		}
		return fmt.Errorf("criu dump of %d: %w: %s", o.PID, err, logErrors(filepath.Join(o.ImageDir, "dump.log"), out))
	}
	return nil
}

// RestoreOptions are the arguments of Restore.
type RestoreOptions struct {
	ImageDir string
	// Root is the tree's root filesystem, already mounted by the caller
	// (the mount namespace's root mount is not in the image).
	Root string
	// ExternalMounts maps a DumpOptions.ExternalMounts key to the host
	// path bound there.
	ExternalMounts map[string]string
	// Inherit maps an external file's key (ExternalFile.Key, or
	// "pipe:[inode]") to the descriptor the restored tree gets instead.
	// CRIU reopens a regular file through /proc/self/fd as the restored
	// task, so the file must be one the tree's root may open (e.g. a
	// log owned by its host uid), and refuses one whose mode differs
	// from the dumped file's.
	Inherit map[string]*os.File
	// LogDir receives restore.log (default ImageDir, which may be
	// read-only for a shared image).
	LogDir string
	// Prepare, if set, runs in the criu process before it execs (e.g. to
	// join the sandbox's cgroups, which the restored tasks inherit): it
	// is a shell snippet, run by /bin/sh with $$ the criu process.
	Prepare string
	// Args are more CRIU options.
	Args []string
}

// Restore restores the tree in o.ImageDir, detached, and returns the
// host pid of its root. The image is only read: one image may be
// restored any number of times (forks), each into its own Root.
// Parts of the restore read ImageDir as the tree's own root, others as
// host uid 0 without capabilities (a task that entered the new user
// namespace): see ImageDirFor.
func Restore(ctx context.Context, path string, o RestoreOptions) (int, error) {
	return restore(ctx, path, o, nil)
}

// Pages is the lazy-pages daemon of a RestoreLazy: it moves the restored
// tree's anonymous memory in from the image, the pages the tree touches
// first, then the rest in the background, and exits when every page is
// in (or the tree is gone).
type Pages struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Done is closed when the daemon has exited.
func (p *Pages) Done() <-chan struct{} { return p.done }

// Err is the daemon's exit error, once Done is closed: nil when every
// page was moved in.
func (p *Pages) Err() error {
	<-p.done
	return p.err
}

// Stop kills the daemon (a tree that is being destroyed) and waits for it.
func (p *Pages) Stop() {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
	}
	<-p.done
}

// RestoreLazy is Restore with anonymous private memory restored on
// demand over userfaultfd (criu restore --lazy-pages): the tree runs as
// soon as its state is back, and a `criu lazy-pages` daemon serving
// o.ImageDir moves its pages in as they are touched and in the
// background. o.ImageDir must stay until the returned Pages is done.
//
// The restored tasks may be in their own user namespace, where
// userfaultfd(2) is refused for kernel faults; scripts/criu.sh's build
// then opens /dev/userfaultfd as root for them, so the host's
// vm.unprivileged_userfaultfd stays 0.
func RestoreLazy(ctx context.Context, path string, o RestoreOptions) (int, *Pages, error) {
	var pages *Pages
	pid, err := restore(ctx, path, o, &pages)
	return pid, pages, err
}

func restore(ctx context.Context, path string, o RestoreOptions, lazy **Pages) (pid int, err error) {
	logDir := o.LogDir
	if logDir == "" {
		logDir = o.ImageDir
	}
	pidFile := filepath.Join(logDir, "restore.pid")
	_ = os.Remove(pidFile)
	args := []string{"restore", "-D", o.ImageDir, "-W", logDir, "-o", "restore.log", "-v2",
		"--root", o.Root, "--restore-detached", "--pidfile", pidFile, "--tcp-close"}
	if lazy != nil {
		p, err := startPages(path, o.ImageDir, logDir)
		if err != nil {
			return 0, err
		}
		defer func() {
			if err != nil {
				p.Stop()
				return
			}
			*lazy = p
		}()
		args = append(args, "--lazy-pages")
	}
	for _, k := range sortedKeys(o.ExternalMounts) {
		args = append(args, "--external", "mnt["+k+"]:"+o.ExternalMounts[k])
	}
	var extra []*os.File
	for _, k := range sortedKeys(o.Inherit) {
		// ExtraFiles[i] is fd 3+i in criu.
		args = append(args, "--inherit-fd", fmt.Sprintf("fd[%d]:%s", 3+len(extra), k))
		extra = append(extra, o.Inherit[k])
	}
	args = append(args, o.Args...)
	var cmd *exec.Cmd
	if o.Prepare != "" {
		cmd = command(ctx, "/bin/sh", append([]string{"-c", o.Prepare + "\nexec \"$0\" \"$@\"", path}, args...)...)
	} else {
		cmd = command(ctx, path, args...)
	}
	cmd.ExtraFiles = extra
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("criu restore: %w: %s", err, logErrors(filepath.Join(logDir, "restore.log"), out))
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, fmt.Errorf("criu restore: pid file: %w", err)
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("criu restore: bad pid file %q", b)
	}
	return pid, nil
}

// lazySocket is the socket `criu lazy-pages` listens on in its work
// directory and `criu restore --lazy-pages` connects to in its own.
const lazySocket = "lazy-pages.socket"

// startPages starts `criu lazy-pages` for imageDir with workDir as its
// work directory and waits until it listens.
func startPages(path, imageDir, workDir string) (*Pages, error) {
	sock := filepath.Join(workDir, lazySocket)
	_ = os.Remove(sock)
	// Not tied to a caller's context: the daemon outlives the restore.
	cmd := command(context.Background(), path, "lazy-pages", "-D", imageDir, "-W", workDir, "-o", "lazy-pages.log", "-v2")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Its own process group: a signal to the node's group is not for it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("criu lazy-pages: %w", err)
	}
	p := &Pages{cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		if err != nil {
			err = fmt.Errorf("criu lazy-pages: %w: %s", err, logErrors(filepath.Join(workDir, "lazy-pages.log"), out.Bytes()))
		}
		p.err = err
		close(p.done)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("criu lazy-pages exited before it listened: %w", p.err)
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("criu lazy-pages: no %s after 5s", sock)
		}
	}
}

// ImageDirFor makes dir readable by both identities a restore reads it
// with, and by no one else: owned by hostUID (the restored tree's root)
// and group 0, mode 0750; files group-readable (CRIU writes them 0644
// under the usual umask; this does not widen them).
func ImageDirFor(dir string, hostUID int) error {
	if err := os.Chown(dir, hostUID, 0); err != nil {
		return fmt.Errorf("criu: image dir: %w", err)
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		return fmt.Errorf("criu: image dir: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("criu: image dir: %w", err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("criu: image dir: %w", err)
		}
		if fi.Mode().Perm()&0o040 == 0 {
			if err := os.Chmod(p, fi.Mode().Perm()|0o040); err != nil {
				return fmt.Errorf("criu: image dir: %w", err)
			}
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// logErrors returns CRIU's error lines from its log (else its output),
// so that a refused sandbox's snapshot record says why.
func logErrors(log string, out []byte) string {
	b, err := os.ReadFile(log)
	if err != nil || len(b) == 0 {
		b = out
	}
	return errorLines(string(b), 4)
}

// errorLines picks up to n "Error" lines of CRIU output, skipping the
// RLIMIT_NOFILE complaint it prints on every run where it may not raise
// its own limit, and ip(8)'s about loopback's address while a network
// namespace is restored (both harmless).
func errorLines(text string, n int) string {
	var picked []string
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.Contains(line, "Error") || strings.Contains(line, "RLIMIT_NOFILE") ||
			strings.Contains(line, "already assigned") { // ip(8) re-adding loopback's address
			continue
		}
		picked = append(picked, line)
		if len(picked) == n {
			break
		}
	}
	if len(picked) == 0 {
		if len(text) > 512 {
			text = text[len(text)-512:]
		}
		return strings.TrimSpace(text)
	}
	return strings.Join(picked, "; ")
}

// ExternalFiles lists the regular files the tree rooted at pid holds open
// that its own mount namespace cannot reach (a log on the host, a cgroup
// file of the host's cgroup mounts), which Dump refuses unless they are
// named in DumpOptions.ExternalFiles. It reads /proc: call it with the
// tree frozen, or be ready for a dump that names one more.
func ExternalFiles(pid int) ([]ExternalFile, error) {
	mounts, err := mountIDs(pid)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []ExternalFile
	for _, p := range treePIDs(pid) {
		fdDir := fmt.Sprintf("/proc/%d/fd", p)
		ents, err := os.ReadDir(fdDir)
		if err != nil {
			continue // gone meanwhile
		}
		for _, e := range ents {
			link, err := os.Readlink(filepath.Join(fdDir, e.Name()))
			if err != nil || !strings.HasPrefix(link, "/") || strings.HasPrefix(link, "/memfd:") {
				continue // sockets, pipes, anon inodes, memfds: not files on a mount
			}
			mnt, err := fdMountID(p, e.Name())
			if err != nil || mounts[mnt] {
				continue
			}
			fi, err := os.Stat(filepath.Join(fdDir, e.Name()))
			if err != nil {
				continue
			}
			st, ok := fi.Sys().(*syscall.Stat_t)
			if !ok {
				continue
			}
			f := ExternalFile{MntID: mnt, Inode: st.Ino, Path: link}
			if k := f.Key(); !seen[k] {
				seen[k] = true
				out = append(out, f)
			}
		}
	}
	return out, nil
}

// mountIDs are the mount ids of pid's mount namespace.
func mountIDs(pid int) (map[int]bool, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return nil, fmt.Errorf("criu: %w", err)
	}
	ids := map[int]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if id, err := strconv.Atoi(f[0]); err == nil {
			ids[id] = true
		}
	}
	return ids, nil
}

// fdMountID reads mnt_id from /proc/<pid>/fdinfo/<fd>.
func fdMountID(pid int, fd string) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "mnt_id:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, errors.New("no mnt_id")
}

// treePIDs is pid and its descendants (through every thread's children
// list).
func treePIDs(pid int) []int {
	out := []int{pid}
	for i := 0; i < len(out) && i < 1<<16; i++ {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", out[i]))
		if err != nil {
			continue
		}
		for _, t := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", out[i], t.Name()))
			if err != nil {
				continue
			}
			for _, c := range strings.Fields(string(b)) {
				if n, err := strconv.Atoi(c); err == nil {
					out = append(out, n)
				}
			}
		}
	}
	return out
}

// BuildTag is what scripts/criu.sh writes to the DONE marker beside the
// binary it builds: the pinned version and the level of SPACE's patches
// (scripts/criu-patches/). The namespace driver needs patches 0002 and
// 0003 to restore its agent (run from a memfd), 0004 to dump a
// restored sandbox again and 0005 for a lazy restore into its user
// namespace (0006 lets it keep its kernel-feature cache where /run is
// not a tmpfs), so it takes only a build with this tag or a later one.
const BuildTag = PinnedVersion + "+space5"

// ErrUnpatched means the CRIU found dumps but lacks the patches a SPACE
// sandbox's restore needs.
var ErrUnpatched = errors.New("criu: not scripts/criu.sh's patched build")

// ProbeSandboxes is Probe plus the check that the binary is
// scripts/criu.sh's build with SPACE's patches (BuildTag in its DONE
// marker): what the namespace driver checkpoints with.
func ProbeSandboxes(ctx context.Context, explicit string) (path, version string, err error) {
	if path, version, err = Probe(ctx, explicit); err != nil {
		return path, version, err
	}
	b, rerr := os.ReadFile(filepath.Join(filepath.Dir(path), "DONE"))
	tag := strings.TrimSpace(string(b))
	if rerr != nil || !tagAtLeast(tag, BuildTag) {
		return path, version, fmt.Errorf("criu %s at %s (build %q): want scripts/criu.sh's %s: %w: %w", version, path, tag, BuildTag, ErrUnpatched, ErrUnavailable)
	}
	return path, version, nil
}

// tagAtLeast compares build tags "<version>+space<N>" of one version.
func tagAtLeast(tag, want string) bool {
	v, n, ok := strings.Cut(tag, "+space")
	wv, wn, _ := strings.Cut(want, "+space")
	if !ok || v != wv {
		return false
	}
	a, err1 := strconv.Atoi(n)
	b, err2 := strconv.Atoi(wn)
	return err1 == nil && err2 == nil && a >= b
}
