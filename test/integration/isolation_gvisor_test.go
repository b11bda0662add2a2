package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/driver/gvisor"
	"github.com/space-sandbox/space/test/testenv"
)

// gvisorEnv starts a second `space server`, with --driver gvisor, for the
// isolation cases below; it is stopped when the calling test ends.
func gvisorEnv(t *testing.T) *env {
	t.Helper()
	need(t)
	if _, err := gvisor.FindRunsc(os.Getenv("SPACE_RUNSC")); err != nil {
		t.Skipf("gvisor driver unavailable: %v", err)
	}
	srv, err := testenv.New("space-itgv-")
	if err != nil {
		t.Fatal(err)
	}
	srv.Driver = gvisor.Name
	srv.Args = []string{"--builtins", "minimal"}
	if p := os.Getenv("SPACE_RUNSC"); p != "" {
		srv.Args = append(srv.Args, "--runsc", p)
	}
	e := &env{Server: srv, baseline: map[string]bool{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- gvisor server log (tail) ----\n%s", srv.LogTail(8000))
		}
		srv.Stop()
		srv.Remove()
	})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if e.key, err = srv.CreateKey("p1"); err != nil {
		t.Fatal(err)
	}
	if err := e.waitTemplate("minimal", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestIsolationGvisor runs the isolation probe and the process, file,
// user and leak checks against the gvisor driver. gVisor implements the
// syscalls itself; where the namespace driver's answer is the host
// kernel's, here it is gVisor's, so besides the errno the test asserts the
// effect on the host. Differences from the namespace driver's suite (see
// docs/drivers.md):
//   - uid 0 inside maps to host uid UIDBase in the OCI spec, but gVisor
//     shows its own root user namespace inside (/proc/self/uid_map is
//     "0 0 4294967295"): the test checks the host uid of runsc's sandbox
//     and gofer processes instead.
//   - The sandbox's processes are not host processes at all (the sentry
//     runs them): the test checks that a command's argv appears in no host
//     process.
func TestIsolationGvisor(t *testing.T) {
	e := gvisorEnv(t)
	t.Run("info", func(t *testing.T) {
		st, m, err := e.call("GET", "/v1/info", e.key, nil)
		if err != nil || st != 200 {
			t.Fatalf("GET /v1/info: %d %v %v", st, m, err)
		}
		if m["driver"] != gvisor.Name || m["egress"] != false || m["runsc"] == nil || !strings.Contains(fmt.Sprint(m["driver_reason"]), "--driver gvisor") {
			t.Errorf("/v1/info = %v", m)
		}
	})
	t.Run("probe", func(t *testing.T) {
		sb := e.create(t, nil)
		defer sb.delete(t)
		uploadProbe(t, sb)
		ln, err := net.Listen("tcp", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		port := ln.Addr().(*net.TCPAddr).Port
		target := "127.0.0.1:" + itoa(port)
		if ip := hostAddr(t); ip != "" {
			target = ip + ":" + itoa(port)
		}
		out, _, ex := sb.run(t, map[string]any{"argv": []string{"/tmp/probe", target}})
		if ex.Code != 0 {
			t.Fatalf("probe: %+v %s", ex, out)
		}
		var res map[string]string
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("probe output %q: %v", out, err)
		}
		t.Logf("probe: %v", res)
		// gVisor refuses all of these itself (EPERM without the caps,
		// ENOSYS where it has no such call, EINVAL for a threaded
		// unshare(CLONE_NEWUSER)), as the namespace driver's seccomp does.
		for _, k := range []string{"mount_tmpfs", "mount_proc", "init_module", "finit_module", "kexec_load", "bpf",
			"perf_event_open", "keyctl", "userfaultfd", "unshare_user", "unshare_mount", "ptrace_agent", "read_agent_mem",
			"raw_packet_socket", "connect_host"} {
			if res[k] == "" {
				t.Errorf("%s succeeded inside the gVisor sandbox; it must fail", k)
			}
		}
		if strings.TrimSpace(res["interfaces"]) != "lo" {
			t.Errorf("sandbox network interfaces = %q, want only lo (no --egress: runsc --network=none)", res["interfaces"])
		}
		// Whatever gVisor's answer, nothing reached the host's mount table.
		if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), "probe-mnt") {
			t.Errorf("a mount made inside the sandbox shows on the host")
		}
	})

	t.Run("processes-files-users", func(t *testing.T) {
		a := e.create(t, nil)
		defer a.delete(t)
		b := e.create(t, nil)
		defer b.delete(t)
		marker := filepath.Join("/tmp", "space-host-marker-"+a.ID)
		os.WriteFile(marker, []byte("host secret"), 0o644)
		defer os.Remove(marker)
		if out, ex := a.sh(t, "cat "+marker); ex.Code == 0 {
			t.Fatalf("sandbox read a host file: %q", out)
		}
		b.start(t, map[string]any{"argv": []string{"sleep", "77.25"}})
		time.Sleep(200 * time.Millisecond)
		if out, _ := a.sh(t, "ps -o pid,args"); strings.Contains(out, "77.25") || strings.Contains(out, "space server") || strings.Contains(out, "runsc") {
			t.Fatalf("sandbox sees foreign processes:\n%s", out)
		}
		// b's sleep runs inside b's sentry and is no host process.
		if uid := hostUIDOf(t, "77.25"); uid != "" {
			t.Errorf("a sandbox command is a host process (uid %s)", uid)
		}
		a.sh(t, "echo mine > /tmp/only-in-a")
		if out, ex := b.sh(t, "cat /tmp/only-in-a"); ex.Code == 0 {
			t.Fatalf("sandbox b read sandbox a's file: %q", out)
		}
		if out, _ := a.sh(t, "find / -xdev -type s 2>/dev/null; ls "+e.RunDir+" 2>&1"); strings.Contains(out, ".sock") && !strings.Contains(out, "No such file") {
			t.Fatalf("sandbox sees agent sockets:\n%s", out)
		}
		if out, _ := a.sh(t, "id -u"); strings.TrimSpace(out) != "0" {
			t.Fatalf("id -u inside: %q", out)
		}
		// Root inside is the unprivileged host uid of runsc's processes.
		uids := runscUIDs(t, e, a.ID)
		if len(uids) < 2 {
			t.Fatalf("found %d runsc processes of sandbox %s on the host, want its sandbox and gofer", len(uids), a.ID)
		}
		for pid, uid := range uids {
			if uid == "" || uid == "0" {
				t.Errorf("runsc process %s of the sandbox runs as host uid %q", pid, uid)
			}
		}
	})

	t.Run("no-leaks", func(t *testing.T) {
		sb := e.create(t, nil)
		inst := instanceOf(t, e, sb.ID)
		sb.delete(t)
		var left []string
		for i := 0; i < 50; i++ {
			if left = gvisorLeftovers(e, inst); len(left) == 0 {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("left behind after delete: %v", left)
	})
}

// instanceOf returns the driver instance id of sandbox id.
func instanceOf(t *testing.T, e *env, id string) string {
	t.Helper()
	st, m, err := e.call("GET", "/v1/sandboxes/"+id, e.key, nil)
	if err != nil || st != 200 {
		t.Fatalf("get sandbox: %d %v %v", st, m, err)
	}
	inst, _ := m["instance"].(string)
	if inst == "" {
		inst = id
	}
	return inst
}

// runscUIDs maps the host pids of the runsc processes serving a sandbox
// (its sentry and gofer) to their real uids.
func runscUIDs(t *testing.T, e *env, sandboxID string) map[string]string {
	t.Helper()
	inst := instanceOf(t, e, sandboxID)
	out := map[string]string{}
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		cmd, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil || !strings.HasPrefix(string(cmd), "runsc-") || !strings.HasSuffix(strings.TrimRight(string(cmd), "\x00"), inst) {
			continue
		}
		st, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "status"))
		for _, line := range strings.Split(string(st), "\n") {
			if strings.HasPrefix(line, "Uid:") {
				out[d.Name()] = strings.Fields(line)[1]
			}
		}
	}
	return out
}

// gvisorLeftovers lists what instance inst left on the host: mounts, its
// state and socket dirs, runsc processes.
func gvisorLeftovers(e *env, inst string) []string {
	var out []string
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, inst) {
			out = append(out, "mount: "+line)
		}
	}
	for _, p := range []string{filepath.Join(e.DataDir, "gvisor", inst), filepath.Join(e.RunDir, "gvisor", inst)} {
		if _, err := os.Lstat(p); err == nil {
			out = append(out, "file: "+p)
		}
	}
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		if cmd, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline")); err == nil && strings.HasPrefix(string(cmd), "runsc") && strings.Contains(string(cmd), inst) {
			out = append(out, "process: "+d.Name())
		}
	}
	return out
}
