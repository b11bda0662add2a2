package template

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

const (
	etcHosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	hostname = "space\n"
	// resolvConf is a placeholder: the sandbox runtime writes the real one
	// (pointing at the egress gateway).
	resolvConf = "# written by the sandbox runtime\n"
)

// appletRE accepts only the install locations busybox uses, so a strange
// --list-full output cannot place links elsewhere.
var appletRE = regexp.MustCompile(`^(bin|sbin|usr/bin|usr/sbin)/[A-Za-z0-9._+\[\]-]{1,64}$`)

// buildBusybox writes the "minimal" tree: a static busybox, a link for each
// applet, the standard directories and account files. Owners are the
// in-sandbox ids; shiftTree maps them later.
func (m *Manager) buildBusybox(ctx context.Context, root string, bin []byte, p Progress) error {
	applets, err := m.busyboxApplets(ctx)
	if err != nil {
		return err
	}
	total := int64(len(applets) + 20)
	p("busybox", 0, total, "populating")
	dirs := []struct {
		name string
		mode os.FileMode
		uid  int
	}{
		{"bin", 0o755, 0}, {"sbin", 0o755, 0}, {"usr", 0o755, 0}, {"usr/bin", 0o755, 0},
		{"usr/sbin", 0o755, 0}, {"etc", 0o755, 0}, {"tmp", os.ModeSticky | 0o777, 0}, {"root", 0o700, 0},
		{"proc", 0o555, 0}, {"sys", 0o555, 0}, {"dev", 0o755, 0}, {"home", 0o755, 0},
		{"home/user", 0o755, 1000}, {"var", 0o755, 0}, {"var/tmp", os.ModeSticky | 0o777, 0}, {"run", 0o755, 0},
	}
	for _, d := range dirs {
		p := filepath.Join(root, d.name)
		if err := os.Mkdir(p, 0o700); err != nil {
			return fmt.Errorf("template: busybox: %w", err)
		}
		if err := os.Lchown(p, d.uid, d.uid); err != nil {
			return fmt.Errorf("template: busybox: %w", err)
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return fmt.Errorf("template: busybox: %w", err)
		}
	}
	files := []struct {
		name string
		mode os.FileMode
		data []byte
	}{
		{"bin/busybox", 0o755, bin},
		{"etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n" +
			"user:x:1000:1000:user:/home/user:/bin/sh\n" +
			"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")},
		{"etc/group", 0o644, []byte("root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n")},
		{"etc/hosts", 0o644, []byte(etcHosts)},
		{"etc/hostname", 0o644, []byte(hostname)},
		{"etc/resolv.conf", 0o644, []byte(resolvConf)},
	}
	for _, f := range files {
		if err := writeNewFile(filepath.Join(root, f.name), f.data, f.mode); err != nil {
			return fmt.Errorf("template: busybox: %w", err)
		}
	}
	for i, a := range applets {
		if a == "bin/busybox" {
			continue
		}
		// Relative targets resolve the same inside the sandbox and when the
		// tree is inspected from the host.
		target := strings.Repeat("../", strings.Count(a, "/")) + "bin/busybox"
		if strings.HasPrefix(a, "bin/") {
			target = "busybox"
		}
		if err := os.Symlink(target, filepath.Join(root, filepath.FromSlash(a))); err != nil {
			return fmt.Errorf("template: busybox applet %s: %w", a, err)
		}
		if i%64 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			p("busybox", int64(i), total, a)
		}
	}
	p("busybox", total, total, fmt.Sprintf("%d applets", len(applets)))
	return nil
}

// busyboxApplets runs `busybox --list-full` and returns the validated,
// de-duplicated install paths.
func (m *Manager) busyboxApplets(ctx context.Context) ([]string, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, m.opts.BusyboxPath, "--list-full")
	cmd.Stdout = &limitedBuffer{buf: &out, max: 1 << 20}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("template: busybox --list-full: %w", err)
	}
	seen := map[string]bool{}
	var list []string
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		a := strings.TrimSpace(sc.Text())
		if a == "" || seen[a] {
			continue
		}
		if !appletRE.MatchString(a) || path.Clean(a) != a {
			m.opts.Logf("template: busybox: skipping applet path %q", a)
			continue
		}
		seen[a] = true
		list = append(list, a)
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("template: busybox --list-full listed no applets")
	}
	return list, nil
}

// writeNewFile creates name (which must not exist), writes data and sets
// mode explicitly so the umask does not matter.
func writeNewFile(name string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscallNoFollow, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return werr
	}
	return os.Chmod(name, mode)
}

// limitedBuffer fails writes past max so a misbehaving child cannot make us
// buffer without bound.
type limitedBuffer struct {
	buf *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(b []byte) (int, error) {
	if l.buf.Len()+len(b) > l.max {
		return 0, fmt.Errorf("output larger than %d bytes", l.max)
	}
	return l.buf.Write(b)
}
