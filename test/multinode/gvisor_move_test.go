package multinode

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/driver/gvisor"
	"github.com/space-sandbox/space/internal/store/postgres"
)

// State moves between gVisor nodes with different --uid-base (each node
// on a shared host has its own range): a sandbox hibernated on one node
// wakes on the other after the first is killed with SIGKILL, with its
// files and its running processes (a counter held in a shell's memory
// goes on from where it was, not from 1), and a snapshot taken on the
// dead node forks onto the other. Before restoreArgs, runsc refused:
// `"UIDMappings" does not match across checkpoint restore`.
func TestFleetGVisorStateMoves(t *testing.T) {
	if _, err := gvisor.FindRunsc(""); err != nil {
		t.Skipf("needs runsc (scripts/runsc.sh): %v", err)
	}
	snapDir, err := os.MkdirTemp("", "space-fleet-snaps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(snapDir) })
	c := newFleet(t, fleetOpts{nodes: 2, replicas: 2, driver: "gvisor", snapStore: "dir:" + snapDir})
	t.Cleanup(func() {
		for _, d := range c.dirs {
			if left := driverDirs(d, "gvisor"); len(left) > 0 {
				t.Errorf("gVisor sandboxes left in %s: %v", d, left)
			}
		}
	})
	a, b := c.servers[0], c.servers[1]
	m := c.mustCall(a, "POST", "/v1/sandboxes", map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 256 << 20}})
	if done := c.waitOp(a, opID(m), 90*time.Second); done["state"] != "succeeded" {
		t.Fatalf("create: %v", done)
	}
	sb, sess := m["sandbox"].(map[string]any), m["session"].(map[string]any)
	id, from := sb["id"].(string), sb["node"].(string)
	url, tok := sess["data_url"].(string), sess["token"].(string)
	var victim, other *proc
	for _, p := range c.nodes {
		if p.name == from {
			victim = p
		} else {
			other = p
		}
	}
	if out, code, err := exec1(url, tok, id, "sh", "-c",
		"echo travels > /tmp/h && "+counterLoop("/tmp/count")+" sleep 0.5; cat /tmp/count"); err != nil || code != 0 {
		t.Fatalf("start the counter: %q %d %v", out, code, err)
	}
	count := func(url, tok string) int {
		t.Helper()
		out, code, err := exec1(url, tok, id, "cat", "/tmp/count")
		n, perr := strconv.Atoi(strings.TrimSpace(out))
		if err != nil || code != 0 || perr != nil {
			t.Fatalf("read the counter: %q %d %v", out, code, err)
		}
		return n
	}
	m = c.mustCall(a, "POST", "/v1/sandboxes/"+id+"/snapshots", nil)
	snapID := m["snapshot"].(map[string]any)["id"].(string)
	if done := c.waitOp(a, opID(m), 90*time.Second); done["state"] != "succeeded" {
		t.Fatalf("snapshot on %s: %v", from, done)
	}
	if done := c.waitOp(b, opID(c.mustCall(b, "POST", "/v1/sandboxes/"+id+"/hibernate", nil)), 90*time.Second); done["state"] != "succeeded" {
		t.Fatalf("hibernate on %s: %v", from, done)
	}
	// The counter's value when hibernated is on disk (the layer).
	victim.signal(syscall.SIGKILL)
	st, err := postgres.Open(context.Background(), c.dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deadline := time.Now().Add(4 * nodeTimeout)
	for lost := false; !lost; {
		if time.Now().After(deadline) {
			t.Fatalf("node %s not marked lost", from)
		}
		nodes, err := st.ListNodes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			lost = lost || n.Name == from && n.State == core.NodeLost
		}
		time.Sleep(100 * time.Millisecond)
	}
	t0 := time.Now()
	if done := c.waitOp(a, opID(c.mustCall(a, "POST", "/v1/sandboxes/"+id+"/resume", nil)), 90*time.Second); done["state"] != "succeeded" {
		t.Fatalf("wake on another node after %s was killed: %v", from, done)
	}
	woken := c.mustCall(b, "GET", "/v1/sandboxes/"+id, nil)
	if woken["state"] != "running" || woken["node"] != other.name {
		t.Fatalf("after the wake %s is %v on %v, want running on %s", id, woken["state"], woken["node"], other.name)
	}
	t.Logf("hibernated gVisor sandbox of killed %s (uid base %s) woke on %s (uid base %s) in %v", from, arg(victim, "--uid-base"),
		other.name, arg(other, "--uid-base"), time.Since(t0).Round(time.Millisecond))
	url, tok = c.session(b, id)
	if out, code, err := exec1(url, tok, id, "cat", "/tmp/h"); err != nil || code != 0 || out != "travels\n" {
		t.Fatalf("files after the move: %q %d %v", out, code, err)
	}
	// The counter process came along: it goes on from its value (at
	// least 5 after half a second), it did not start again.
	first := count(url, tok)
	if first < 5 {
		t.Fatalf("counter %d after the move: the process restarted instead of being restored", first)
	}
	deadline = time.Now().Add(30 * time.Second)
	for count(url, tok) <= first {
		if time.Now().After(deadline) {
			t.Fatalf("counter stuck at %d after the move: the process is not running", first)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A snapshot taken on the dead node forks onto the other, processes too.
	m = c.mustCall(b, "POST", "/v1/snapshots/"+snapID+"/fork", map[string]any{"limits": map[string]any{"memory_bytes": 256 << 20}})
	for _, x := range m["sandboxes"].([]any) {
		f := x.(map[string]any)
		fsb, fs := f["sandbox"].(map[string]any), f["session"].(map[string]any)
		fid := fsb["id"].(string)
		if done := c.waitOp(b, opID(f), 90*time.Second); done["state"] != "succeeded" || fsb["node"] != other.name {
			t.Fatalf("fork of a snapshot of killed %s on %v: %v", from, fsb["node"], done)
		}
		out, code, err := exec1(fs["data_url"].(string), fs["token"].(string), fid, "sh", "-c", "cat /tmp/h; a=$(cat /tmp/count); sleep 1; b=$(cat /tmp/count); test $b -gt $a && echo counting")
		if err != nil || code != 0 || out != "travels\ncounting\n" {
			t.Fatalf("fork on %s: %q %d %v", other.name, out, code, err)
		}
		if done := c.waitOp(a, opID(c.mustCall(a, "DELETE", "/v1/sandboxes/"+fid, nil)), 60*time.Second); done["state"] != "succeeded" {
			t.Fatalf("delete fork: %v", done)
		}
	}
	if done := c.waitOp(a, opID(c.mustCall(a, "DELETE", "/v1/sandboxes/"+id, nil)), 60*time.Second); done["state"] != "succeeded" {
		t.Fatalf("delete: %v", done)
	}
}

// arg returns the value of flag in p's arguments.
func arg(p *proc, flag string) string {
	for i := 0; i+1 < len(p.args); i++ {
		if p.args[i] == flag {
			return p.args[i+1]
		}
	}
	return fmt.Sprint("(no ", flag, ")")
}
