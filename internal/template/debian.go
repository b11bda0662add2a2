package template

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// debianSuites are the suite names that identify a Debian archive in the
// host's apt sources (third-party repositories use other suite names).
var debianSuites = map[string]bool{
	"buster": true, "bullseye": true, "bookworm": true, "trixie": true, "forky": true, "sid": true,
	"oldstable": true, "stable": true, "testing": true, "unstable": true,
}

// hostMirror returns the first Debian mirror in the host's apt sources.
func hostMirror() string {
	var files []string
	for _, g := range []string{"/etc/apt/sources.list", "/etc/apt/sources.list.d/*.list", "/etc/apt/sources.list.d/*.sources"} {
		ms, _ := filepath.Glob(g)
		files = append(files, ms...)
	}
	for _, f := range files {
		b, err := readBounded(f, 1<<20)
		if err != nil {
			continue
		}
		if mirror := parseAptSources(string(b), strings.HasSuffix(f, ".sources")); mirror != "" {
			return mirror
		}
	}
	return defaultMirror
}

// parseAptSources returns the URI of the first enabled "deb" entry for a
// plain Debian suite (not -security/-updates) in one sources file, either
// one-line (sources.list) or deb822 (.sources) format.
func parseAptSources(text string, deb822 bool) string {
	ok := func(uri string, suites []string) bool {
		if validateMirror(uri) != nil {
			return false
		}
		for _, s := range suites {
			if debianSuites[s] {
				return true
			}
		}
		return false
	}
	if !deb822 {
		for _, line := range strings.Split(text, "\n") {
			line, _, _ = strings.Cut(line, "#")
			f := strings.Fields(line)
			if len(f) < 3 || f[0] != "deb" {
				continue
			}
			f = f[1:]
			if strings.HasPrefix(f[0], "[") { // [option=value ...]
				for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
					f = f[1:]
				}
				if len(f) > 0 {
					f = f[1:]
				}
			}
			if len(f) >= 2 && ok(f[0], f[1:2]) {
				return f[0]
			}
		}
		return ""
	}
	for _, stanza := range strings.Split(strings.ReplaceAll(text, "\r", ""), "\n\n") {
		fields := map[string]string{}
		for _, line := range strings.Split(stanza, "\n") {
			if line == "" || line[0] == '#' || line[0] == ' ' || line[0] == '\t' {
				continue
			}
			k, v, found := strings.Cut(line, ":")
			if found {
				fields[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			}
		}
		if strings.EqualFold(fields["enabled"], "no") || !strings.Contains(" "+fields["types"]+" ", " deb ") {
			continue
		}
		suites := strings.Fields(fields["suites"])
		for _, uri := range strings.Fields(fields["uris"]) {
			if ok(uri, suites) {
				return uri
			}
		}
	}
	return ""
}

func validateMirror(mirror string) error {
	u, err := url.Parse(mirror)
	if err != nil || strings.ContainsAny(mirror, " \t\n\x00") ||
		(u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "file") || (u.Scheme != "file" && u.Host == "") {
		return fmt.Errorf("%w: mirror %q (want an http, https or file URL)", ErrInvalid, mirror)
	}
	return nil
}

// mmdebstrapVersion returns `mmdebstrap --version` output (part of the
// digest), cached per manager since it costs a perl start.
func (m *Manager) mmdebstrapVersion(ctx context.Context) (string, error) {
	m.mu.Lock()
	v, ok := m.mmdeb[m.opts.MmdebstrapPath]
	m.mu.Unlock()
	if ok {
		return v, nil
	}
	bin, err := exec.LookPath(m.opts.MmdebstrapPath)
	if err != nil {
		return "", fmt.Errorf("%w: mmdebstrap not available: %w", ErrUnsupported, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "--version")
	cmd.Stdout = &limitedBuffer{buf: &out, max: 4096}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("template: mmdebstrap --version: %w", err)
	}
	v = strings.TrimSpace(out.String())
	if v == "" {
		return "", errors.New("template: mmdebstrap --version printed nothing")
	}
	m.mu.Lock()
	m.mmdeb[m.opts.MmdebstrapPath] = v
	m.mu.Unlock()
	return v, nil
}

// debianMilestones are mmdebstrap's "I:" messages in the order they appear,
// used to turn its log into done/total progress.
var debianMilestones = []string{
	"chroot architecture",
	"finding correct signed-by",
	"running apt-get update",
	"downloading packages",
	"extracting archives",
	"installing essential packages",
	"installing remaining packages",
	"cleaning package lists",
	"success in",
}

// buildDebian runs mmdebstrap into root, then adds the sandbox user and
// host files. mmdebstrap runs in its own mount namespace and process group
// so that the /proc, /sys and /dev mounts it makes inside the target die
// with it even if it is killed, and can never be recursed into by cleanup.
func (m *Manager) buildDebian(ctx context.Context, root string, r recipe, p Progress) error {
	bin, err := exec.LookPath(m.opts.MmdebstrapPath)
	if err != nil {
		return fmt.Errorf("%w: mmdebstrap not available: %w", ErrUnsupported, err)
	}
	args := []string{"--mode=root", "--variant=" + r.Variant, "--format=directory"}
	if r.NoRecommends {
		args = append(args, `--aptopt=APT::Install-Recommends "false"`)
	}
	if len(r.Packages) > 0 {
		args = append(args, "--include="+strings.Join(r.Packages, ","))
	}
	args = append(args, "--", r.Suite, root, r.Mirror)
	start := time.Now()
	done := int64(0)
	total := int64(len(debianMilestones))
	lw := &lineWriter{max: 4096, keep: 40, onLine: func(line string) {
		msg, ok := strings.CutPrefix(line, "I: ")
		if !ok {
			return
		}
		for i, ms := range debianMilestones {
			if int64(i+1) > done && strings.HasPrefix(msg, ms) {
				done = int64(i + 1)
				break
			}
		}
		p("debian", done, total, msg)
	}}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.Stdout = lw
	cmd.Stderr = lw
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:      true,
		Unshareflags: syscall.CLONE_NEWNS, // Go also makes / rprivate in the child
		Pdeathsig:    syscall.SIGKILL,
	}
	// SIGTERM first: mmdebstrap then unmounts and exits by itself.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	p("debian", 0, total, "mmdebstrap "+strings.Join(args, " "))
	// Pdeathsig fires when the forking thread exits, not the process: keep
	// this goroutine on its thread so no other goroutine (say, one that
	// locks a thread for setns and lets it die) can end that thread early.
	runtime.LockOSThread()
	err = cmd.Run()
	runtime.UnlockOSThread()
	if cmd.Process != nil {
		// Stragglers (apt, dpkg). While one lives the group id stays taken;
		// with none left, hitting another group needs the pid recycled
		// within microseconds.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("template: mmdebstrap failed after %s: %w\n%s", time.Since(start).Round(time.Millisecond), err, lw.tail())
	}
	m.opts.Logf("template: mmdebstrap %s %v finished in %s", r.Suite, r.Packages, time.Since(start).Round(time.Millisecond))
	return customizeDebian(root, p)
}

// customizeDebian adds the unprivileged "user" account (uid/gid 1000, home
// from /etc/skel) and writes /etc/hosts and /etc/hostname. The tree comes
// from Debian packages, but writes still go through os.Root.
func customizeDebian(rootPath string, p Progress) error {
	p("customize", 0, 1, "adding user")
	root, err := os.OpenRoot(rootPath)
	if err != nil {
		return fmt.Errorf("template: customize: %w", err)
	}
	defer root.Close()
	shell := "/bin/sh"
	if _, err := root.Lstat("bin/bash"); err == nil {
		shell = "/bin/bash"
	}
	appends := []struct{ file, prefix, line string }{
		{"etc/passwd", "user:", "user:x:1000:1000:user:/home/user:" + shell},
		{"etc/group", "user:", "user:x:1000:"},
		{"etc/shadow", "user:", "user:*:19000:0:99999:7:::"},
		{"etc/gshadow", "user:", "user:!::"},
	}
	for _, a := range appends {
		if err := appendLineIfMissing(root, a.file, a.prefix, a.line); err != nil {
			return err
		}
	}
	if err := root.MkdirAll("home/user", 0o755); err != nil {
		return fmt.Errorf("template: customize: %w", err)
	}
	if err := root.Chmod("home/user", 0o755); err != nil {
		return fmt.Errorf("template: customize: %w", err)
	}
	if err := root.Lchown("home/user", 1000, 1000); err != nil {
		return fmt.Errorf("template: customize: %w", err)
	}
	if skel, err := root.Open("etc/skel"); err == nil {
		ents, _ := skel.ReadDir(-1)
		skel.Close()
		for _, e := range ents {
			if !e.Type().IsRegular() {
				continue
			}
			b, err := root.ReadFile("etc/skel/" + e.Name())
			if err != nil {
				return fmt.Errorf("template: customize: %w", err)
			}
			dst := "home/user/" + e.Name()
			if err := root.WriteFile(dst, b, 0o644); err != nil {
				return fmt.Errorf("template: customize: %w", err)
			}
			if err := root.Chmod(dst, 0o644); err != nil {
				return fmt.Errorf("template: customize: %w", err)
			}
			if err := root.Lchown(dst, 1000, 1000); err != nil {
				return fmt.Errorf("template: customize: %w", err)
			}
		}
	}
	// mmdebstrap copies the host's hostname and resolv.conf: neither may leak
	// into a template. resolv.conf stays as a placeholder the runtime fills.
	for _, f := range []struct{ name, data string }{{"etc/hosts", etcHosts}, {"etc/hostname", hostname}, {"etc/resolv.conf", resolvConf}} {
		if err := root.Remove(f.name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("template: customize: %w", err)
		}
		if err := root.WriteFile(f.name, []byte(f.data), 0o644); err != nil {
			return fmt.Errorf("template: customize: %w", err)
		}
		if err := root.Chmod(f.name, 0o644); err != nil {
			return fmt.Errorf("template: customize: %w", err)
		}
	}
	p("customize", 1, 1, "done")
	return nil
}

// appendLineIfMissing appends line to name unless a line starting with
// prefix exists. A missing file (no gshadow in some variants) is skipped.
func appendLineIfMissing(root *os.Root, name, prefix, line string) error {
	b, err := root.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("template: customize %s: %w", name, err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			return nil
		}
	}
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("template: customize %s: %w", name, err)
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		line = "\n" + line
	}
	_, werr := f.WriteString(line + "\n")
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("template: customize %s: %w", name, werr)
	}
	return nil
}

// lineWriter splits a child's output into lines for onLine and keeps the
// last few for error messages. Overlong lines are cut at max bytes.
type lineWriter struct {
	mu     sync.Mutex
	max    int
	keep   int
	onLine func(string)
	cur    []byte
	last   []string
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			room := w.max - len(w.cur)
			if room > 0 {
				w.cur = append(w.cur, b[:min(room, len(b))]...)
			}
			break
		}
		room := w.max - len(w.cur)
		if room > 0 {
			w.cur = append(w.cur, b[:min(room, i)]...)
		}
		w.flush()
		b = b[i+1:]
	}
	return n, nil
}

func (w *lineWriter) flush() {
	line := strings.TrimRight(string(w.cur), "\r")
	w.cur = w.cur[:0]
	w.last = append(w.last, line)
	if len(w.last) > w.keep {
		w.last = w.last[len(w.last)-w.keep:]
	}
	w.onLine(line)
}

func (w *lineWriter) tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.cur) > 0 {
		w.flush()
	}
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(strings.Join(w.last, "\n")))
	for sc.Scan() {
		b.WriteString("  " + sc.Text() + "\n")
	}
	return b.String()
}
