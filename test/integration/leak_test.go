package integration

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// leaks lists what sandboxes left on the host: mounts, cgroups, processes
// of sandbox uids in this server's cgroups, state files and sockets.
func (e *env) leaks() []string {
	var out []string
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, e.DataDir) || strings.Contains(line, e.RunDir) {
			out = append(out, "mount: "+line)
		}
	}
	filepath.WalkDir("/sys/fs/cgroup", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if strings.Count(p, "/") > 10 {
			return filepath.SkipDir
		}
		// Every hierarchy, managed or not (runsc makes its groups in
		// blkio, devices, freezer, ... too), every driver's base.
		if parent := filepath.Base(filepath.Dir(p)); (parent == e.CgroupBase() || parent == e.CgroupBase()+"-gvisor" || parent == e.CgroupBase()+"-qemu") &&
			strings.HasPrefix(filepath.Base(p), "sbx-") {
			out = append(out, "cgroup: "+p)
			return filepath.SkipDir
		}
		return nil
	})
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", d.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			if strings.HasPrefix(line, "Uid:") {
				uid, _ := strconv.Atoi(strings.Fields(line)[1])
				cg, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cgroup"))
				// Only this server's sandboxes: other servers may run on the
				// host at the same time (their cgroup base differs). Each
				// sandbox has its own uid block of the pool; those made
				// with the pool off share 100000..165535.
				if uid >= 100000 && strings.Contains(string(cg), "/"+e.CgroupBase()+"/") {
					cmd, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
					out = append(out, fmt.Sprintf("process %s uid %d: %q", d.Name(), uid, cmd))
				}
			}
		}
	}
	for _, dir := range []string{filepath.Join(e.DataDir, "sandboxes"), filepath.Join(e.DataDir, "logs"), e.RunDir} {
		ents, _ := os.ReadDir(dir)
		for _, d := range ents {
			out = append(out, "file: "+filepath.Join(dir, d.Name()))
		}
	}
	return out
}

// noLeaks waits briefly (the kernel tears namespaces down asynchronously)
// and then fails on anything left.
func (e *env) noLeaks(t *testing.T) {
	t.Helper()
	var l []string
	for i := 0; i < 50; i++ {
		if l = e.newLeaks(); len(l) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("leaked after delete:\n%s", strings.Join(l, "\n"))
}

// newLeaks is leaks minus what was on the host before this test binary
// started (other programs' sandboxes are not ours to judge).
func (e *env) newLeaks() []string {
	var out []string
	for _, l := range e.leaks() {
		if !e.baseline[l] {
			out = append(out, l)
		}
	}
	return out
}

func TestLeaksAfterDelete(t *testing.T) {
	e := need(t)
	var sbs []*sandbox
	for i := 0; i < 5; i++ {
		sb := e.create(t, nil)
		sb.start(t, map[string]any{"shell": "sleep 1000 & sleep 1000"})
		sbs = append(sbs, sb)
	}
	if len(e.newLeaks()) == 0 {
		t.Fatal("leak detector sees nothing while 5 sandboxes run: it cannot be trusted")
	}
	for _, sb := range sbs {
		sb.delete(t)
	}
	e.noLeaks(t)
}

func TestCrashRestart(t *testing.T) {
	e := need(t)
	keep := e.create(t, nil)
	keep.sh(t, "echo before > /tmp/state")
	long := keep.start(t, map[string]any{"shell": "for i in 1 2 3 4 5 6 7 8 9 10; do echo tick $i; sleep 0.3; done"})
	// One sandbox mid-creation when the server dies.
	st, m, _ := e.call("POST", "/v1/sandboxes", e.key, map[string]any{"template": "minimal"})
	if st != 202 {
		t.Fatalf("create: %d %v", st, m)
	}
	midID := m["sandbox"].(map[string]any)["id"].(string)
	e.Kill9()
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	// No operation stays running.
	opID := m["operation"].(map[string]any)["id"].(string)
	if op := e.waitOp(t, opID); op["state"] == "running" || op["state"] == "pending" {
		t.Fatalf("operation still %v after restart", op["state"])
	}
	// The running sandbox is still running and usable, with its files.
	_, sm, _ := e.call("GET", "/v1/sandboxes/"+keep.ID, e.key, nil)
	if sm["state"] != "running" {
		t.Fatalf("sandbox after restart: %v", sm)
	}
	if out, ex := keep.sh(t, "cat /tmp/state"); ex.Code != 0 || out != "before\n" {
		t.Fatalf("sandbox unusable after restart: %+v %q", ex, out)
	}
	// The command that ran across the restart finishes and is followable.
	var ticks strings.Builder
	_, x := keep.stream(t, long, "", 0, func(ev event) { ticks.Write(ev.Data) })
	if x == nil || x.Code != 0 || !strings.Contains(ticks.String(), "tick 10") {
		t.Fatalf("command across restart: %+v %q", x, ticks.String())
	}
	// The one being created is either running or failed with a reason.
	_, mm, _ := e.call("GET", "/v1/sandboxes/"+midID, e.key, nil)
	switch mm["state"] {
	case "running":
		(&sandbox{e: e, ID: midID}).delete(t)
	case "failed", "lost":
		if mm["state_reason"] == "" {
			t.Fatalf("no reason: %v", mm)
		}
	default:
		t.Fatalf("mid-create sandbox after restart: %v", mm)
	}
	keep.delete(t)
	e.noLeaks(t)

	// A sandbox whose processes die while the server is down is reported lost.
	lost := e.create(t, nil)
	e.Kill9()
	e.killSandboxProcesses()
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	_, lm, _ := e.call("GET", "/v1/sandboxes/"+lost.ID, e.key, nil)
	if lm["state"] != "lost" || lm["state_reason"] == "" {
		t.Fatalf("sandbox killed during downtime: %v", lm)
	}
	e.noLeaks(t)
}

// killSandboxProcesses kills every host process of this server's
// sandboxes: those of sandbox uids in its own cgroup base. Never by uid
// alone: with the pool off, another server's sandboxes on the same host
// share the range (they all died at once when this helper did that).
func (e *env) killSandboxProcesses() {
	for _, l := range e.leaks() {
		var pid int
		if _, err := fmt.Sscanf(l, "process %d ", &pid); err != nil {
			continue
		}
		if p, err := os.FindProcess(pid); err == nil {
			p.Kill()
		}
	}
	time.Sleep(300 * time.Millisecond)
}

// TestLostAtRuntime kills a sandbox's PID 1 from the host while the server
// runs: the sandbox must be reported lost with a reason, and cleaned up.
func TestLostAtRuntime(t *testing.T) {
	e := need(t)
	sb := e.create(t, nil)
	// PID 1's command line names no host path (nor the sandbox's id): find
	// it in the driver's state.
	pid := namespacePID(t, e, instanceOf(t, e, sb.ID))
	if cmd, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline")); err != nil || !strings.Contains(string(cmd), "--init") {
		t.Fatalf("no PID 1 found for %s (pid %d: %q %v)", sb.ID, pid, cmd, err)
	}
	if p, err := os.FindProcess(pid); err != nil || p.Kill() != nil {
		t.Fatalf("kill PID 1 %d of %s: %v", pid, sb.ID, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, m, _ := e.call("GET", "/v1/sandboxes/"+sb.ID, e.key, nil)
		if m["state"] == "lost" {
			if m["state_reason"] == "" {
				t.Fatalf("lost without a reason: %v", m)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox whose PID 1 died is still %v", m["state"])
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st, _, _ := sb.dp("GET", "/commands", nil); st != 404 {
		t.Fatalf("data plane still serves a lost sandbox: %d", st)
	}
	e.noLeaks(t)
}
