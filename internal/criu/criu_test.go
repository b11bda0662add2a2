package criu

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/uidpool"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
)

func TestAtLeast(t *testing.T) {
	for v, want := range map[string]bool{"4.1.1": true, "4.1": true, "4.2": true, "5.0": true, "3.17.1": false, "4.0": false, "x": false} {
		if got := atLeast(v, 4, 1); got != want {
			t.Errorf("atLeast(%q) = %v", v, got)
		}
	}
}

func TestErrorLines(t *testing.T) {
	log := "(00.1) Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self\n(00.2) Info ok\nError: ipv4: Address already assigned.\n(00.3) Error (criu/sk-unix.c:351): unix: Unix socket 5 not found\n"
	if got := errorLines(log, 4); got != "(00.3) Error (criu/sk-unix.c:351): unix: Unix socket 5 not found" {
		t.Errorf("errorLines = %q", got)
	}
}

// requireCRIU skips unless the test runs as root with a working CRIU.
func requireCRIU(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("CRIU needs root")
	}
	path, v, err := Probe(context.Background(), "")
	if err != nil {
		t.Skipf("no usable CRIU (scripts/criu.sh builds it): %v", err)
	}
	t.Logf("criu %s at %s", v, path)
	return path
}

// tree is a process tree in new user, mount, pid, net, uts and ipc
// namespaces on an overlay root, as the namespace driver makes them: a
// counter in memory written to a tmpfs, a TCP listener on loopback, and
// init's stderr a file on the host (outside its mount namespace), as the
// agent's init.log is.
type tree struct {
	dir  string // holds lower, and upper/work/merged per instance
	base uint32 // host uid of root inside
	pid  int
}

const initScript = `set -e
B=/bin/busybox
$B mount --make-rprivate /
$B mount -t overlay overlay -o lowerdir=lower,upperdir=upper,workdir=work,userxattr merged
cd merged
$B mount -t proc proc proc
$B mount -t tmpfs -o size=64k tmpfs dev
$B touch dev/null
$B mount --bind /dev/null dev/null
$B mount -t tmpfs tmpfs tmp
$B mkdir .old
$B pivot_root . .old
/bin/busybox umount -l /.old
/bin/busybox rmdir /.old
/bin/busybox hostname sbx
/bin/busybox ip link set lo up
echo layer > /etc/marker
: > /tmp/in
exec /bin/busybox sh -c 'nc -ll -p 8080 -e echo hi </tmp/in >/tmp/out 2>&1 & i=0; while :; do i=$((i+1)); echo $i > /tmp/c; usleep 50000; done' </tmp/in >/tmp/out
`

func newTree(t *testing.T) *tree {
	t.Helper()
	bb := "/bin/busybox"
	if _, err := os.Stat(bb); err != nil {
		t.Skipf("busybox-static is needed: %v", err)
	}
	pool, err := uidpool.Open(uidpool.DefaultDir, uidpool.DefaultStart, uidpool.DefaultCount)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for p := dir; p != "/"; p = filepath.Dir(p) { // root inside is "other" here
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(p, fi.Mode().Perm()|0o011); err != nil {
				t.Fatal(err)
			}
		}
	}
	base, err := pool.Alloc(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pool.Free(base, dir) })
	lower := filepath.Join(dir, "lower")
	for _, d := range []string{"bin", "proc", "dev", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(lower, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lower, "bin/busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	tr := &tree{dir: dir, base: base}
	if err := filepath.Walk(lower, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(base), int(base))
	}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"upper", "work", "merged"} {
		tr.mkdir(t, d)
	}
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(base), Size: uidpool.BlockSize}}
	cmd := &exec.Cmd{Path: bb, Args: []string{"sh", "-c", initScript}, Dir: dir,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID |
				unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWNET,
			UidMappings: m, GidMappings: m, GidMappingsEnableSetgroups: true,
			Credential: &syscall.Credential{}, Setsid: true}}
	out, err := os.Create(filepath.Join(dir, "init.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tr.pid = cmd.Process.Pid
	t.Cleanup(func() {
		kill(tr.pid)
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "init.out"))
			t.Logf("init output: %s", b)
		}
	})
	go func() { _ = cmd.Wait() }() // reap it when the test kills it
	return tr
}

func (tr *tree) mkdir(t *testing.T, name string) {
	t.Helper()
	p := filepath.Join(tr.dir, name)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, int(tr.base), int(tr.base)); err != nil {
		t.Fatal(err)
	}
}

func kill(pid int) {
	if pid > 0 {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
}

// counter reads the counter of the tree whose init is pid.
func counter(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/tmp/c", pid))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

func waitCounter(t *testing.T, pid, atLeast int) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := counter(pid)
		if err == nil && n >= atLeast {
			return n
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/root/tmp/out", pid))
			t.Fatalf("counter of %d: %d, %v (want ≥ %d); output %q", pid, n, err, atLeast, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dialIn connects to addr from inside pid's network namespace.
func dialIn(pid int, addr string) (string, error) {
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		// The thread is left in the other namespace: never unlock it, so
		// the runtime ends it with the goroutine.
		runtime.LockOSThread()
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			ch <- res{err: err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- res{err: err}
			return
		}
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			ch <- res{err: err}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		ch <- res{strings.TrimSpace(string(b)), err}
	}()
	r := <-ch
	return r.s, r.err
}

// imageBytes is the size of CRIU's images (a flat directory).
func imageBytes(dir string) int64 {
	var n int64
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && strings.HasSuffix(e.Name(), ".img") {
			n += fi.Size()
		}
	}
	return n
}

// TestDumpRestoreFork checkpoints a namespaced tree and restores the image
// twice (a fork) while the original goes on: each copy continues its
// in-memory counter from the checkpoint, keeps its overlay files, and its
// listener answers again.
func TestDumpRestoreFork(t *testing.T) {
	path := requireCRIU(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tr := newTree(t)
	// 40 turns of 50 ms: a copy that restarted instead of continuing could
	// not catch up within the checks below.
	before := waitCounter(t, tr.pid, 40)
	img := filepath.Join(tr.dir, "img")
	if err := os.Mkdir(img, 0o700); err != nil {
		t.Fatal(err)
	}
	ext, err := ExternalFiles(tr.pid)
	if err != nil {
		t.Fatal(err)
	}
	var logIno uint64
	if fi, err := os.Stat(filepath.Join(tr.dir, "init.out")); err == nil {
		logIno = fi.Sys().(*syscall.Stat_t).Ino
	}
	// init.out, and /dev/null as sh opened it before pivot_root.
	logKey := ""
	for _, f := range ext {
		if f.Inode == logIno {
			logKey = f.Key()
		}
	}
	if logKey == "" {
		t.Fatalf("external files %+v, want init.out (inode %d) among them", ext, logIno)
	}
	t0 := time.Now()
	err = Dump(ctx, path, DumpOptions{PID: tr.pid, ImageDir: img, LeaveRunning: true,
		ExternalMounts: map[string]string{"/dev/null": "dev-null"}, ExternalFiles: ext})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dump (leave running) %v, image %d bytes", time.Since(t0).Round(time.Millisecond), imageBytes(img))
	waitCounter(t, tr.pid, before+5) // the original runs on
	// Parts of the restore read the images as the tree's root, others as
	// host uid 0 without capabilities: the dir is theirs only.
	if err := ImageDirFor(img, int(tr.base)); err != nil {
		t.Fatal(err)
	}

	for i := range 2 {
		name := fmt.Sprintf("fork%d", i)
		for _, d := range []string{name + "/work", name + "/merged"} {
			tr.mkdir(t, d)
		}
		if out, err := exec.Command("cp", "-a", filepath.Join(tr.dir, "upper"), filepath.Join(tr.dir, name, "upper")).CombinedOutput(); err != nil {
			t.Fatalf("copy layer: %v: %s", err, out)
		}
		root := filepath.Join(tr.dir, name, "merged")
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,userxattr", filepath.Join(tr.dir, "lower"),
			filepath.Join(tr.dir, name, "upper"), filepath.Join(tr.dir, name, "work"))
		if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
			t.Fatal(err)
		}
		logPath := filepath.Join(tr.dir, name, "init.out")
		log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		// CRIU reopens an inherited file through /proc/self/fd as the
		// restored task: the new log must be the tree's root's to open.
		// It also checks the mode is the dumped file's.
		if err := log.Chown(int(tr.base), int(tr.base)); err != nil {
			t.Fatal(err)
		}
		if err := log.Chmod(0o644); err != nil { // init.out's, from os.Create
			t.Fatal(err)
		}
		inherit := map[string]*os.File{logKey: log}
		for _, f := range ext {
			if f.Key() != logKey { // the same host file again
				o, err := os.OpenFile(f.Path, os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer o.Close()
				inherit[f.Key()] = o
			}
		}
		t1 := time.Now()
		pid, err := Restore(ctx, path, RestoreOptions{ImageDir: img, Root: root, LogDir: filepath.Join(tr.dir, name),
			ExternalMounts: map[string]string{"dev-null": "/dev/null"}, Inherit: inherit})
		log.Close()
		took := time.Since(t1)
		if err != nil {
			ls, _ := exec.Command("ls", "-lan", img).CombinedOutput()
			t.Logf("%s", ls)
		}
		// The restored mount namespace holds its own reference.
		_ = unix.Unmount(root, unix.MNT_DETACH)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { kill(pid) })
		// Continued, not restarted: a fresh loop would have counted to
		// about 6 by now.
		time.Sleep(300 * time.Millisecond)
		n, err := counter(pid)
		if err != nil || n < before {
			t.Fatalf("%s: counter %d, %v after restore; checkpointed at ≥ %d", name, n, err, before)
		}
		t.Logf("%s: restore %v, pid %d, counter %d (checkpointed at ≥ %d)", name, took.Round(time.Millisecond), pid, n, before)
		if got, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/2", pid)); err != nil || got != logPath {
			t.Errorf("%s: stderr %q, %v; want the inherited %s", name, got, err, logPath)
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/etc/marker", pid)); err != nil || strings.TrimSpace(string(b)) != "layer" {
			t.Errorf("%s: overlay file: %q, %v", name, b, err)
		}
		if got, err := dialIn(pid, "127.0.0.1:8080"); err != nil || got != "hi" {
			t.Errorf("%s: listener: %q, %v", name, got, err)
		}
	}
	waitCounter(t, tr.pid, before+10)
}

func TestBuildTag(t *testing.T) {
	for tag, want := range map[string]bool{BuildTag: true, PinnedVersion + "+space9": true, PinnedVersion + "+space2": false, "4.2+space3": false, "": false} {
		if got := tagAtLeast(tag, BuildTag); got != want {
			t.Errorf("tagAtLeast(%q) = %v", tag, got)
		}
	}
	// scripts/criu.sh must write the tag the driver asks for.
	b, err := os.ReadFile("../../scripts/criu.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `build="$CRIU_VERSION+space5"`) || !strings.HasSuffix(BuildTag, "+space5") {
		t.Errorf("scripts/criu.sh's build tag and criu.BuildTag (%s) differ", BuildTag)
	}
}

// TestDropInterfaces: the named entries leave a netdev image, the others
// stay byte for byte, and the address, route and rule images go.
func TestDropInterfaces(t *testing.T) {
	frame := func(typ uint64, name string) []byte {
		var m []byte
		m = protowire.AppendTag(m, 1, protowire.VarintType)
		m = protowire.AppendVarint(m, typ)
		m = protowire.AppendTag(m, 5, protowire.BytesType)
		m = protowire.AppendString(m, name)
		return append(binary.LittleEndian.AppendUint32(nil, uint32(len(m))), m...)
	}
	hdr := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, imgCommonMagic), 0x57464056)
	img := append(append(append(append([]byte(nil), hdr...), frame(1, "lo")...), frame(2, "eth0")...), frame(2, "veth9")...)
	dir := t.TempDir()
	for _, f := range []string{"netdev-9.img", "ifaddr-9.img", "route-9.img", "route6-9.img", "rule-9.img", "iptables-9.img"} {
		b := []byte("x")
		if f == "netdev-9.img" {
			b = img
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := DropInterfaces(dir, []string{"eth0"}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "netdev-9.img"))
	if err != nil {
		t.Fatal(err)
	}
	want := append(append(append([]byte(nil), hdr...), frame(1, "lo")...), frame(2, "veth9")...)
	if !bytes.Equal(got, want) {
		t.Errorf("netdev image:\n got %x\nwant %x", got, want)
	}
	for f, keep := range map[string]bool{"ifaddr-9.img": false, "route-9.img": false, "route6-9.img": false, "rule-9.img": false, "iptables-9.img": true} {
		if _, err := os.Stat(filepath.Join(dir, f)); (err == nil) != keep {
			t.Errorf("%s: kept %v, want %v", f, err == nil, keep)
		}
	}
}

// TestOwnDir: the cache directory is used only when it is root's own,
// mode 0700, and not a link.
func TestOwnDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the cache directory is root's")
	}
	base := t.TempDir()
	fresh := filepath.Join(base, "fresh")
	if got := ownDir(fresh); got != fresh {
		t.Errorf("ownDir(new dir) = %q", got)
	}
	if fi, err := os.Stat(fresh); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("made %v %v, want mode 0700", fi, err)
	}
	wide := filepath.Join(base, "wide")
	if err := os.Mkdir(wide, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(wide, 0o777); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(base, "other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(other, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(fresh, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{wide, other, link, file} {
		if got := ownDir(d); got != "" {
			t.Errorf("ownDir(%s) = %q, want refused", filepath.Base(d), got)
		}
	}
}

// TestKdatCache: where /run is not a tmpfs, CRIU (patch 0006) keeps its
// kernel-feature cache in the directory kdatDir names, and a check with
// the cache skips the kernel probes.
func TestKdatCache(t *testing.T) {
	path := requireCRIU(t)
	if isTmpfs("/run") {
		t.Skip("/run is a tmpfs: CRIU keeps its cache in /run/criu.kdat itself")
	}
	if !isTmpfs("/dev/shm") {
		t.Skip("no tmpfs at /dev/shm for the cache: CRIU probes the kernel every time")
	}
	b, _ := os.ReadFile(filepath.Join(filepath.Dir(path), "DONE"))
	if tag := strings.TrimSpace(string(b)); !tagAtLeast(tag, BuildTag) {
		t.Skipf("criu at %s is build %q, not scripts/criu.sh's %s (patch 0006 reads %s)", path, tag, BuildTag, KdatEnv)
	}
	dir := kdatDir()
	if dir == "" {
		t.Fatal("no cache directory although /run is not a tmpfs and /dev/shm is")
	}
	var took []time.Duration
	for range 3 {
		t0 := time.Now()
		if _, err := Check(context.Background(), path); err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(t0))
	}
	t.Logf("criu check: %v (the first may write the cache)", took)
	fi, err := os.Stat(filepath.Join(dir, "criu.kdat"))
	if err != nil || fi.Size() == 0 {
		t.Fatalf("no cache in %s after criu check: %v %v", dir, fi, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "criu.kdat.tmp")); err == nil {
		t.Errorf("criu left %s/criu.kdat.tmp behind", dir)
	}
	// The cache is what CRIU reads: a run with its log says so.
	out, err := command(context.Background(), path, "check", "-v4", "-o", "-").CombinedOutput()
	if err != nil {
		t.Fatalf("criu check -v4: %v: %s", err, errorLines(string(out), 3))
	}
	if !bytes.Contains(out, []byte("Loaded kdat cache from "+filepath.Join(dir, "criu.kdat"))) {
		t.Errorf("criu check did not load the cache from %s: %s", dir, errorLines(string(out), 3))
	}
}

// TestDumpCutShort: dumps whose context ends at points spread over a whole
// dump (seizing, the parasite, writing pages) leave the tree running: its
// counter goes on. CRIU is not killed at the context's end (killed while
// its parasite was in a sandbox's PID 1, it killed the sandbox), so a dump
// under way then completes; one that overruns its Overrun is killed.
func TestDumpCutShort(t *testing.T) {
	path := requireCRIU(t)
	tr := newTree(t)
	waitCounter(t, tr.pid, 3)
	dump := func(d, overrun time.Duration) (time.Duration, error) {
		img := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		t0 := time.Now()
		err := Dump(ctx, path, DumpOptions{PID: tr.pid, ImageDir: img, LeaveRunning: true, Overrun: overrun,
			ExternalMounts: map[string]string{"/dev/null": "dev-null"}, ExternalFiles: mustExternal(t, tr.pid)})
		return time.Since(t0), err
	}
	full, err := dump(time.Minute, 0)
	if err != nil {
		t.Fatalf("a whole dump: %v", err)
	}
	t.Logf("a whole dump takes %v", full.Round(time.Millisecond))
	cut, late := 0, 0
	for round := range 3 {
		for step := 1; step <= 12; step++ {
			limit := full * time.Duration(step) / 10
			took, err := dump(limit, 0)
			cut++
			if err != nil {
				t.Errorf("round %d: a dump cut at %v failed after %v: %v", round, limit, took.Round(time.Millisecond), err)
			} else if took > limit {
				late++
			}
			n0, _ := counter(tr.pid)
			deadline := time.Now().Add(3 * time.Second)
			for {
				n1, err1 := counter(tr.pid)
				if err1 == nil && n1 > n0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("round %d: a dump cut at %v (took %v: %v) left the tree standing still: counter %d then %d, %v",
						round, limit, took.Round(time.Millisecond), err, n0, n1, err1)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	t.Logf("%d dumps with a deadline inside the dump, %d of them completed after it", cut, late)
	if late == 0 {
		t.Errorf("no dump outlived its context: they were cut, not left to complete")
	}
	// The backstop: a dump still running its Overrun after the deadline is
	// killed and says so. (This may harm the tree: it is the last one.)
	took, err := dump(time.Millisecond*5, time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "after its deadline, killed") || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a dump past its overrun: %v (after %v), want it killed", err, took)
	}
	if took > full+5*time.Second {
		t.Errorf("a dump past its overrun returned after %v", took)
	}
	t.Logf("past its overrun: %v after %v", err, took.Round(time.Millisecond))
}

func mustExternal(t *testing.T, pid int) []ExternalFile {
	t.Helper()
	ext, err := ExternalFiles(pid)
	if err != nil {
		t.Fatal(err)
	}
	return ext
}
