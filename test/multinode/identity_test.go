package multinode

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/driver/gvisor"
)

// setArg replaces the value of flag in p's arguments.
func (p *proc) setArg(flag, value string) {
	for i := 0; i+1 < len(p.args); i++ {
		if p.args[i] == flag {
			p.args[i+1] = value
			return
		}
	}
	p.args = append(p.args, flag, value)
}

// startFails runs p expecting it to refuse to start; it returns its output.
func (p *proc) startFails(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, p.bin, append(p.args, "--addr-file", p.addrFile)...).CombinedOutput()
	if err == nil {
		t.Fatalf("%s started (and exited 0) where it should refuse; output:\n%s", p.name, out)
	}
	return string(out)
}

// running reports whether some process's command line names id (read-only
// scan of /proc: the sandbox's runsc, gofer or agent processes).
func running(id string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(raw), id) {
			continue
		}
		var pid int
		for _, ch := range e.Name() {
			pid = pid*10 + int(ch-'0')
		}
		pids = append(pids, pid)
	}
	return pids
}

// waitState polls a sandbox on s until it is in state.
func (c *cluster) waitState(s *proc, id, state string, limit time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	var last map[string]any
	for time.Now().Before(deadline) {
		if last = c.mustCall(s, "GET", "/v1/sandboxes/"+id, nil); last["state"] == state {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("sandbox %s is %v after %v, want %s", id, last["state"], limit, state)
}

// Driver identity: a node's data dir belongs to the driver that resolved
// there first. Restarted with another driver while that one has sandboxes
// there, the node refuses to start; with auto it keeps the recorded driver
// and re-adopts them. A sandbox of a lost node deleted meanwhile is
// killed when the node returns. Once no sandbox of the first driver is
// left, the node switches, and nothing of the first driver runs.
func TestFleetDriverIdentity(t *testing.T) {
	if _, err := gvisor.FindRunsc(""); err != nil {
		t.Skipf("needs runsc (scripts/runsc.sh): %v", err)
	}
	c := newFleet(t, fleetOpts{nodes: 1, replicas: 1, driver: "gvisor"})
	s, n := c.servers[0], c.nodes[0]
	if raw, _ := os.ReadFile(filepath.Join(n.dataDir, "driver")); strings.TrimSpace(string(raw)) != "gvisor" {
		t.Fatalf("data dir records driver %q, want gvisor", raw)
	}
	create := func() (id, dataURL, token string) {
		m := c.mustCall(s, "POST", "/v1/sandboxes", map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 128 << 20}})
		if done := c.waitOp(s, opID(m), 90*time.Second); done["state"] != "succeeded" {
			t.Fatalf("create: %v", done)
		}
		sb, sess := m["sandbox"].(map[string]any), m["session"].(map[string]any)
		return sb["id"].(string), sess["data_url"].(string), sess["token"].(string)
	}
	a, url, tok := create()
	if out, code, err := exec1(url, tok, a, "sh", "-c", "echo on > /tmp/mark && cat /tmp/mark"); err != nil || code != 0 || out != "on\n" {
		t.Fatalf("exec: %q %d %v", out, code, err)
	}
	// Another driver while a gVisor sandbox lives in the data dir: refused.
	n.signal(syscall.SIGTERM)
	n.setArg("--driver", "namespace")
	if out := n.startFails(t); !strings.Contains(out, "belongs to driver gvisor") {
		t.Fatalf("namespace over a gVisor data dir: %s", out)
	}
	// auto keeps the recorded driver, and the sandbox is still there.
	n.setArg("--driver", "auto")
	n.start(t)
	if out, code, err := exec1(url, tok, a, "cat", "/tmp/mark"); err != nil || code != 0 || out != "on\n" {
		t.Fatalf("after a restart with auto: %q %d %v", out, code, err)
	}
	// A lost node's sandbox deleted while it is away is killed when it returns.
	n.signal(syscall.SIGKILL)
	c.waitState(s, a, "lost", 4*nodeTimeout)
	if len(running(a)) == 0 {
		t.Fatalf("sandbox %s stopped with its node (it should outlive it)", a)
	}
	if st, m := c.call(s, "DELETE", "/v1/sandboxes/"+a, nil); st/100 != 2 {
		t.Fatalf("delete a lost sandbox: %d %v", st, m)
	}
	c.waitState(s, a, "deleted", 30*time.Second)
	n.start(t)
	deadline := time.Now().Add(30 * time.Second)
	for len(running(a)) > 0 || len(driverDirs(n.dataDir, "gvisor")) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("deleted sandbox %s still runs after its node came back: pids %v, dirs %v", a, running(a), driverDirs(n.dataDir, "gvisor"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// No gVisor sandbox left: the node switches to namespace and records it.
	n.signal(syscall.SIGTERM)
	n.setArg("--driver", "namespace")
	n.start(t)
	if raw, _ := os.ReadFile(filepath.Join(n.dataDir, "driver")); strings.TrimSpace(string(raw)) != "namespace" {
		t.Fatalf("data dir records driver %q after the switch, want namespace", raw)
	}
	b, url, tok := create()
	if out, code, err := exec1(url, tok, b, "echo", "ns"); err != nil || code != 0 || out != "ns\n" {
		t.Fatalf("exec on the namespace node: %q %d %v", out, code, err)
	}
	if d := driverDirs(n.dataDir, "sandboxes"); len(d) != 1 || d[0] != b {
		t.Fatalf("namespace sandboxes %v, want [%s]", d, b)
	}
	m := c.mustCall(s, "DELETE", "/v1/sandboxes/"+b, nil)
	c.waitOp(s, opID(m), 30*time.Second)
}

// driverDirs lists the sandbox directories under dataDir/sub.
func driverDirs(dataDir, sub string) []string {
	var ids []string
	entries, _ := os.ReadDir(filepath.Join(dataDir, sub))
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "sbx-") {
			ids = append(ids, e.Name())
		}
	}
	return ids
}
