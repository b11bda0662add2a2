// Package cgroupv2 runs the quickstart round trip (server, sandbox,
// command, files, delete) on a host that mounts cgroup v2 only: a QEMU
// (TCG) Debian guest that scripts/cgroupv2-vm.sh builds and boots, since
// the machines this project is tested on mount cgroups hybrid. The guest's
// systemd runs `space server --driver namespace` as a Delegate=yes service;
// the test reaches it through ports forwarded to 127.0.0.1.
package cgroupv2

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

// need skips unless the guest is cached or SPACE_TEST_CGROUPV2=1 asks
// for it (then a missing piece fails the test, and the first run builds
// the cache: a few minutes).
func need(t *testing.T) {
	t.Helper()
	required := os.Getenv("SPACE_TEST_CGROUPV2") == "1"
	skip := func(why string) {
		if required {
			t.Fatalf("SPACE_TEST_CGROUPV2=1 but %s", why)
		}
		t.Skip(why)
	}
	if testing.Short() && !required {
		t.Skip("-short: the TCG guest takes minutes")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		skip("no qemu-system-x86_64 (scripts/vm-deps.sh)")
	}
	if !required && exec.Command("bash", filepath.Join(testenv.RepoRoot(), "scripts/cgroupv2-vm.sh"), "built").Run() != nil {
		skip("the cgroup-v2 guest is not cached: scripts/cgroupv2-vm.sh build (or SPACE_TEST_CGROUPV2=1) makes it")
	}
}

// freePort returns a loopback TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// console reads the guest's serial log.
type console string

func (c console) text() string {
	b, _ := os.ReadFile(string(c))
	return string(b)
}

// lines returns the values of the "PREFIX value" lines the guest printed.
func (c console) lines(prefix string) []string {
	var out []string
	for _, l := range strings.Split(c.text(), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimRight(l, "\r"), prefix+" "); ok {
			out = append(out, v)
		}
	}
	return out
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func TestRoundTripCgroupV2Only(t *testing.T) {
	need(t)
	start := time.Now()
	root := testenv.RepoRoot()
	script := filepath.Join(root, "scripts/cgroupv2-vm.sh")
	build := exec.Command("bash", script, "build")
	build.Stderr = os.Stderr
	out, err := build.Output()
	if err != nil {
		t.Fatalf("cgroupv2-vm.sh build: %v", err)
	}
	t.Logf("guest cache %s (%v)", strings.TrimSpace(string(out)), time.Since(start).Round(time.Second))

	bin := t.TempDir()
	gb := exec.Command("go", "build", "-o", bin+"/", "./cmd/space", "./cmd/space-agent")
	gb.Dir = root
	gb.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := gb.CombinedOutput(); err != nil {
		t.Fatalf("build space: %v\n%s", err, b)
	}

	ctrl, data := freePort(t), freePort(t)
	tmp := t.TempDir()
	con := console(filepath.Join(tmp, "console.log"))
	ctlSock := filepath.Join(tmp, "ctl.sock")
	ctx, cancel := context.WithCancel(context.Background())
	vm := exec.CommandContext(ctx, "bash", script, "boot", bin, fmt.Sprint(ctrl), fmt.Sprint(data), string(con), ctlSock)
	vm.Dir = root
	// Its own process group: the cleanup ends QEMU along with the script,
	// with SIGTERM so that the script's trap removes the binary's disk.
	vm.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	vm.Cancel = func() error { return syscall.Kill(-vm.Process.Pid, syscall.SIGTERM) }
	vm.WaitDelay = 20 * time.Second
	var vmOut bytes.Buffer
	vm.Stdout, vm.Stderr = &vmOut, &vmOut
	boot := time.Now()
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	// done closes when QEMU has ended; waitErr is then its status.
	var waitErr error
	done := make(chan struct{})
	go func() { waitErr = vm.Wait(); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("guest console (tail):\n%s", tail(con.text(), 8000))
		}
	})

	// The guest prints its key once its server answers /healthz.
	var key string
	deadline := time.Now().Add(15 * time.Minute)
	for key == "" {
		select {
		case <-done:
			t.Fatalf("qemu ended: %v\n%s", waitErr, vmOut.String())
		case <-time.After(2 * time.Second):
		}
		if k := con.lines("SPACE-KEY"); len(k) > 0 {
			key = strings.TrimSpace(k[0])
		}
		if time.Now().After(deadline) {
			t.Fatalf("no key from the guest after 15 min")
		}
	}
	bootTime := time.Since(boot)
	t.Logf("guest booted and serving in %v (guest uptime %v s)", bootTime.Round(time.Second), con.lines("SPACE-UPTIME"))

	// The guest mounts cgroup2 only, and its server runs in the cgroup
	// systemd delegated to it.
	mounts := con.lines("SPACE-MOUNT")
	if len(mounts) == 0 {
		t.Fatal("the guest printed no cgroup mounts")
	}
	for _, m := range mounts {
		if f := strings.Fields(m); len(f) < 3 || f[2] != "cgroup2" {
			t.Errorf("guest mount %q is not cgroup2: the guest is not v2-only", m)
		}
	}
	if cg := con.lines("SPACE-SERVER-CGROUP"); len(cg) != 1 || !strings.HasPrefix(cg[0], "0::/system.slice/space-server.service") {
		t.Errorf("server's /proc/pid/cgroup %q, want the single v2 line 0::/system.slice/space-server.service", cg)
	}

	srv := &testenv.Server{Ctrl: fmt.Sprintf("http://127.0.0.1:%d", ctrl)}
	step := time.Now()
	if err := srv.WaitTemplate(key, "minimal", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("template minimal ready in %v", time.Since(step).Round(time.Second))

	step = time.Now()
	sb, err := srv.CreateSandbox(key, map[string]any{"template": "minimal",
		"limits": map[string]any{"memory_bytes": 64 << 20, "cpu_millis": 500}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sandbox %s created in %v", sb.ID, time.Since(step).Round(time.Millisecond))
	if want := fmt.Sprintf("http://127.0.0.1:%d", data); sb.Data != want {
		t.Fatalf("data_url %q, want %q", sb.Data, want)
	}

	step = time.Now()
	got, code, err := sb.Run("echo hello from $(hostname); cat /proc/self/cgroup", "")
	if err != nil || code != 0 || !strings.Contains(got, "hello from") {
		t.Fatalf("run: %q exit %d %v", got, code, err)
	}
	t.Logf("command in %v: %q", time.Since(step).Round(time.Millisecond), got)
	if !strings.Contains(got, "0::/") || strings.Contains(got, "memory:") {
		t.Errorf("the sandbox's /proc/self/cgroup %q: want the v2 line only", got)
	}

	step = time.Now()
	payload := "written through the data plane on a cgroup-v2-only host\n"
	if st, err := raw(sb, "PUT", "/files?path=/tmp/cgv2.txt", payload); err != nil || st != http.StatusNoContent {
		t.Fatalf("write file: %d %v", st, err)
	}
	back, err := get(sb, "/files?path=/tmp/cgv2.txt")
	if err != nil || back != payload {
		t.Fatalf("read file: %q %v", back, err)
	}
	if got, code, err := sb.Run("cat /tmp/cgv2.txt", ""); err != nil || code != 0 || got != payload {
		t.Fatalf("cat in the sandbox: %q %d %v", got, code, err)
	}
	t.Logf("file written and read back in %v", time.Since(step).Round(time.Millisecond))

	// The limits live in the v2 group: dd's 100 MiB buffer passes the
	// 64 MiB memory.max (no swap on top) and the OOM killer ends it; a
	// 16 MiB one fits. The node's samples read the group's files.
	step = time.Now()
	if _, code, err := sb.Run("dd if=/dev/zero of=/dev/null bs=16M count=1", ""); err != nil || code != 0 {
		t.Errorf("a 16 MiB buffer under a 64 MiB limit: exit %d %v", code, err)
	}
	// The shell reports how dd ended (run alone, dd would be the
	// command's process and end by signal, without an exit code).
	if got, _, err := sb.Run("dd if=/dev/zero of=/dev/null bs=100M count=1; echo rc=$?", ""); err != nil || !strings.Contains(got, "rc=137") {
		t.Errorf("a 100 MiB buffer under a 64 MiB limit: %q %v, want rc=137 (OOM kill)", got, err)
	}
	st, m, err := testenv.DoJSON("GET", srv.Ctrl+"/v1/sandboxes/"+sb.ID+"/metrics", map[string]string{"X-API-Key": key}, nil)
	if err != nil || st != http.StatusOK {
		t.Fatalf("metrics: %d %v %v", st, m, err)
	}
	samples, _ := m["metrics"].([]any)
	if len(samples) == 0 {
		t.Fatalf("no metrics samples: %v", m)
	}
	last := samples[len(samples)-1].(map[string]any)
	if mt, _ := last["mem_total"].(float64); int64(mt) != 64<<20 {
		t.Errorf("mem_total %v, want the 64 MiB limit read from memory.max", last["mem_total"])
	}
	if mu, _ := last["mem_used"].(float64); mu <= 0 {
		t.Errorf("mem_used %v, want the group's usage", last["mem_used"])
	}
	t.Logf("limits checked in %v: %v", time.Since(step).Round(time.Millisecond), last)

	// Pause freezes the group (cgroup.freeze), resume thaws it.
	step = time.Now()
	for _, verb := range []string{"pause", "resume"} {
		st, m, err := testenv.DoJSON("POST", srv.Ctrl+"/v1/sandboxes/"+sb.ID+"/"+verb, map[string]string{"X-API-Key": key}, nil)
		if err != nil || st != http.StatusAccepted {
			t.Fatalf("%s: %d %v %v", verb, st, m, err)
		}
		op, err := srv.WaitOp(key, m["operation"].(map[string]any)["id"].(string), 2*time.Minute)
		if err != nil || op["state"] != "succeeded" {
			t.Fatalf("%s op: %v %v", verb, op, err)
		}
	}
	if got, code, err := sb.Run("echo after resume", ""); err != nil || code != 0 || got != "after resume\n" {
		t.Fatalf("run after resume: %q %d %v", got, code, err)
	}
	t.Logf("pause and resume in %v", time.Since(step).Round(time.Millisecond))

	// A restart, as an upgrade does it: systemd stops the server
	// (KillMode=process leaves the sandbox running) and starts it again in
	// the unit's cgroup, whose controllers the first server delegated.
	step = time.Now()
	ctl, err := net.Dial("unix", ctlSock)
	if err != nil {
		t.Fatalf("guest control socket: %v", err)
	}
	defer ctl.Close()
	if _, err := ctl.Write([]byte("restart\n")); err != nil {
		t.Fatal(err)
	}
	var restarted []string
	for deadline := time.Now().Add(8 * time.Minute); len(restarted) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the guest did not report the restart")
		}
		time.Sleep(2 * time.Second)
		restarted = con.lines("SPACE-CTL")
	}
	if !strings.HasPrefix(restarted[0], "restart rc=0 up") {
		t.Fatalf("restart in the guest: %q", restarted[0])
	}
	cgs := con.lines("SPACE-SERVER-CGROUP")
	t.Logf("server restarted in %v (%s), now in %v", time.Since(step).Round(time.Second), restarted[0], cgs[len(cgs)-1])
	if got, code, err := sb.Run("echo still here", ""); err != nil || code != 0 || got != "still here\n" {
		t.Fatalf("run in the re-adopted sandbox: %q %d %v", got, code, err)
	}
	sb2, err := srv.CreateSandbox(key, map[string]any{"template": "minimal"})
	if err != nil {
		t.Fatalf("create after the restart: %v", err)
	}
	if got, code, err := sb2.Run("echo new", ""); err != nil || code != 0 || got != "new\n" {
		t.Fatalf("run in a sandbox made after the restart: %q %d %v", got, code, err)
	}

	step = time.Now()
	for _, s := range []testenv.Sandbox{sb, sb2} {
		st, m, err = testenv.DoJSON("DELETE", srv.Ctrl+"/v1/sandboxes/"+s.ID, map[string]string{"X-API-Key": key}, nil)
		if err != nil || st != http.StatusAccepted {
			t.Fatalf("delete: %d %v %v", st, m, err)
		}
		op, err := srv.WaitOp(key, m["operation"].(map[string]any)["id"].(string), 2*time.Minute)
		if err != nil || op["state"] != "succeeded" {
			t.Fatalf("delete op: %v %v", op, err)
		}
		if _, _, err := s.Run("true", ""); err == nil {
			t.Errorf("a command ran in the deleted sandbox %s", s.ID)
		}
	}
	t.Logf("deleted in %v; whole test %v (boot %v)", time.Since(step).Round(time.Millisecond), time.Since(start).Round(time.Second), bootTime.Round(time.Second))
}

// raw sends body to the sandbox's data plane and returns the status.
func raw(sb testenv.Sandbox, method, path, body string) (int, error) {
	req, err := http.NewRequest(method, sb.Data+"/v1/sandboxes/"+sb.ID+path, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := testenv.HTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// get reads path from the sandbox's data plane.
func get(sb testenv.Sandbox, path string) (string, error) {
	req, err := http.NewRequest("GET", sb.Data+"/v1/sandboxes/"+sb.ID+path, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	resp, err := testenv.HTTP.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return string(b), err
}
