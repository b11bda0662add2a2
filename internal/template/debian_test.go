package template

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBaseDebian builds the "base" builtin with mmdebstrap for real. It
// needs root, mmdebstrap and the Debian mirror, and takes tens of seconds.
func TestBaseDebian(t *testing.T) {
	if os.Getenv("SPACE_TEST_DEBIAN") != "1" {
		t.Skip("set SPACE_TEST_DEBIAN=1 to run mmdebstrap (needs root, network to the Debian mirror, ~40 s)")
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Skip("mmdebstrap not installed")
	}
	m := newTestManager(t, Options{})
	m.opts.NoSync = false
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var last string
	var pl progressLog
	start := time.Now()
	tpl, err := m.EnsureBuiltin(ctx, BuiltinBase, func(stage string, done, total int64, msg string) {
		pl.fn(stage, done, total, msg)
		if stage == "debian" && msg != last {
			t.Logf("%6.1fs %s %d/%d %s", time.Since(start).Seconds(), stage, done, total, msg)
			last = msg
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("base: built in %s: %d files, %d MiB, %s", took.Round(time.Millisecond), tpl.Files, tpl.SizeBytes>>20, tpl.Digest)
	if pl.count("debian") < 5 || pl.count("customize") == 0 {
		t.Errorf("progress: %v", pl.stages)
	}
	r := tpl.RootfsDir
	for _, p := range []string{".", "usr/bin/python3", "etc/passwd", "usr/bin/passwd"} {
		assertOwner(t, filepath.Join(r, p), testBase, testBase)
	}
	assertOwner(t, filepath.Join(r, "home/user"), testBase+1000, testBase+1000)
	assertOwner(t, filepath.Join(r, "home/user/.bashrc"), testBase+1000, testBase+1000)
	if st := lstat(t, filepath.Join(r, "usr/bin/passwd")); st.Mode&syscall.S_ISUID == 0 {
		t.Errorf("setuid lost on passwd: %o", st.Mode)
	}
	ents, _ := os.ReadDir(filepath.Join(r, "dev"))
	for _, e := range ents {
		if e.Type()&(os.ModeDevice|os.ModeCharDevice) != 0 {
			t.Errorf("device node left: dev/%s", e.Name())
		}
	}
	if b, _ := os.ReadFile(filepath.Join(r, "etc/hostname")); string(b) != hostname {
		t.Errorf("hostname %q", b)
	}
	passwd, _ := os.ReadFile(filepath.Join(r, "etc/passwd"))
	if !strings.Contains(string(passwd), "user:x:1000:1000:user:/home/user:/bin/bash") {
		t.Errorf("passwd:\n%s", passwd)
	}
	out, err := exec.Command("chroot", "--userspec=1000:1000", r, "/usr/bin/python3", "-c", "import ssl, os; print(6*7, os.getcwd())").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "42") {
		t.Errorf("python3 in chroot: %v: %s", err, out)
	}
	start = time.Now()
	tpl2, err := m.EnsureBuiltin(ctx, BuiltinBase, nil)
	if err != nil || tpl2.Digest != tpl.Digest {
		t.Fatalf("second EnsureBuiltin: %v %s", err, tpl2.Digest)
	}
	t.Logf("base: cache hit in %s", time.Since(start))
}

// fakeMmdebstrap writes a shell script standing in for mmdebstrap: it
// answers --version, prints "I:" lines and creates a tiny tree like the real
// one (device nodes, host hostname and resolv.conf included). body runs
// last, with $target set.
func fakeMmdebstrap(t *testing.T, body string) string {
	t.Helper()
	script := `#!/bin/sh
if [ "$1" = "--version" ]; then echo "mmdebstrap 0.0-fake"; exit 0; fi
while [ "$1" != "--" ]; do echo "$1" >> "$(dirname "$0")/args"; shift; done
shift; suite=$1; target=$2; mirror=$3
echo "I: chroot architecture amd64 is equal to the host's architecture" >&2
echo "I: running apt-get update..." >&2
mkdir -p "$target/etc/skel" "$target/bin" "$target/dev" "$target/usr/bin"
printf 'root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' > "$target/etc/passwd"
printf 'root:x:0:\n' > "$target/etc/group"
printf 'root:*:19000:0:99999:7:::\n' > "$target/etc/shadow"
echo 'alias ll=ls' > "$target/etc/skel/.bashrc"
echo vm > "$target/etc/hostname"
echo 'nameserver 10.0.0.1' > "$target/etc/resolv.conf"
cp /bin/busybox "$target/bin/bash"
cp /bin/busybox "$target/usr/bin/passwd"; chmod 4755 "$target/usr/bin/passwd"
mknod "$target/dev/null" c 1 3
echo "I: installing remaining packages inside the chroot..." >&2
` + body + `
echo "I: success in 0.1 seconds" >&2
`
	p := filepath.Join(t.TempDir(), "mmdebstrap")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDebianWithFakeMmdebstrap(t *testing.T) {
	fake := fakeMmdebstrap(t, "")
	m := newTestManager(t, Options{MmdebstrapPath: fake, Mirror: "http://mirror.invalid/debian"})
	var pl progressLog
	var msgs []string
	tpl, err := m.Build(context.Background(), BuildRequest{Name: "deb", Source: SourceDebian, Packages: []string{"python3", "curl", "python3"}},
		func(stage string, done, total int64, msg string) {
			pl.fn(stage, done, total, msg)
			if stage == "debian" {
				msgs = append(msgs, msg)
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	args, _ := os.ReadFile(filepath.Join(filepath.Dir(fake), "args"))
	if want := "--mode=root\n--variant=minbase\n--format=directory\n--include=curl,python3\n"; string(args) != want {
		t.Errorf("mmdebstrap options %q, want %q", args, want)
	}
	if len(msgs) < 4 || !strings.HasPrefix(msgs[len(msgs)-1], "success") {
		t.Errorf("progress messages %q", msgs)
	}
	r := tpl.RootfsDir
	passwd, _ := os.ReadFile(filepath.Join(r, "etc/passwd"))
	if !strings.HasSuffix(string(passwd), "user:x:1000:1000:user:/home/user:/bin/bash\n") {
		t.Errorf("passwd:\n%s", passwd)
	}
	shadow, _ := os.ReadFile(filepath.Join(r, "etc/shadow"))
	if !strings.Contains(string(shadow), "\nuser:*:") {
		t.Errorf("shadow:\n%s", shadow)
	}
	for name, want := range map[string]string{"etc/hostname": hostname, "etc/resolv.conf": resolvConf, "etc/hosts": etcHosts, "home/user/.bashrc": "alias ll=ls\n"} {
		if b, _ := os.ReadFile(filepath.Join(r, name)); string(b) != want {
			t.Errorf("%s = %q, want %q", name, b, want)
		}
	}
	assertOwner(t, filepath.Join(r, "home/user/.bashrc"), testBase+1000, testBase+1000)
	assertOwner(t, filepath.Join(r, "usr/bin/passwd"), testBase, testBase)
	if st := lstat(t, filepath.Join(r, "usr/bin/passwd")); st.Mode&0o7777 != 0o4755 {
		t.Errorf("setuid not restored after chown: %o", st.Mode&0o7777)
	}
	if _, err := os.Lstat(filepath.Join(r, "dev/null")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("device node kept: %v", err)
	}

	// Same recipe (package order and duplicates do not matter): cached.
	tpl2, err := m.Build(context.Background(), BuildRequest{Name: "deb2", Source: SourceDebian, Packages: []string{"curl", "python3"}}, nil)
	if err != nil || tpl2.Digest != tpl.Digest {
		t.Errorf("reordered packages: %v, %s vs %s", err, tpl2.Digest, tpl.Digest)
	}
	tpl3, err := m.Build(context.Background(), BuildRequest{Name: "deb3", Source: SourceDebian, Packages: []string{"curl"}}, nil)
	if err != nil || tpl3.Digest == tpl.Digest {
		t.Errorf("different packages: %v, same digest %s", err, tpl3.Digest)
	}
}

func TestDebianFailureAndCancel(t *testing.T) {
	t.Run("failure", func(t *testing.T) {
		fake := fakeMmdebstrap(t, `echo "E: Unable to locate package nope" >&2; exit 1`)
		m := newTestManager(t, Options{MmdebstrapPath: fake})
		_, err := m.Build(context.Background(), BuildRequest{Name: "deb", Source: SourceDebian, Packages: []string{"nope"}}, nil)
		if err == nil || !strings.Contains(err.Error(), "E: Unable to locate package nope") {
			t.Errorf("error %v lacks mmdebstrap's message", err)
		}
		assertEmptyDir(t, m.tmpDir())
		assertEmptyDir(t, m.rootfsRoot())
	})
	t.Run("cancel", func(t *testing.T) {
		fake := fakeMmdebstrap(t, `echo "I: downloading packages with apt..." >&2; sleep 60 & echo $! > "$(dirname "$0")/child"; wait`)
		m := newTestManager(t, Options{MmdebstrapPath: fake})
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := m.Build(ctx, BuildRequest{Name: "deb", Source: SourceDebian}, nil)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("error %v, want deadline exceeded", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("cancel took %s", d)
		}
		b, _ := os.ReadFile(filepath.Join(filepath.Dir(fake), "child"))
		if pid := strings.TrimSpace(string(b)); pid != "" {
			if _, err := os.Stat("/proc/" + pid); err == nil {
				if st, _ := os.ReadFile("/proc/" + pid + "/stat"); !strings.Contains(string(st), ") Z") {
					t.Errorf("child %s of mmdebstrap still running", pid)
				}
			}
		}
		assertEmptyDir(t, m.tmpDir())
		assertEmptyDir(t, m.rootfsRoot())
	})
	t.Run("missing", func(t *testing.T) {
		m := newTestManager(t, Options{MmdebstrapPath: "/nonexistent/mmdebstrap"})
		if _, err := m.EnsureBuiltin(context.Background(), BuiltinBase, nil); !errors.Is(err, ErrUnsupported) {
			t.Errorf("missing mmdebstrap: %v", err)
		}
	})
}
