package multinode

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/driver/gvisor"
	"github.com/space-sandbox/space/internal/store/postgres"
)

// ckptDriver is the driver the checkpoint tests run their nodes with:
// gVisor where runsc is installed (checkpoints keep processes), else
// namespace (files only).
func ckptDriver() (driver, dirs string) {
	if _, err := gvisor.FindRunsc(""); err == nil {
		return "gvisor", "gvisor"
	}
	return "namespace", "sandboxes"
}

// restartEvent is one sandbox.state event of a sandbox.
type restartEvent struct {
	State   string `json:"state"`
	Reason  string `json:"reason"`
	Node    string `json:"node"`
	AgeMS   *int64 `json:"checkpoint_age_ms"`
	Checkpt string `json:"checkpoint"`
}

// stateEvents returns the sandbox.state events of sandbox id in project p1.
func stateEvents(t *testing.T, dsn, id string) []restartEvent {
	t.Helper()
	st, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var out []restartEvent
	for after := int64(0); ; {
		evs, err := st.EventsAfter(context.Background(), "p1", after, 500)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			after = e.Seq
			if e.Type != "sandbox.state" || e.SandboxID != id {
				continue
			}
			var ev restartEvent
			if err := json.Unmarshal(e.Data, &ev); err != nil {
				t.Fatalf("event %d: %v", e.Seq, err)
			}
			out = append(out, ev)
		}
		if len(evs) < 500 {
			return out
		}
	}
}

// waitCheckpoint waits until sandbox id has a checkpoint whose capture began
// after since, and returns the sandbox.
func (c *cluster) waitCheckpoint(s *proc, id string, since time.Time, limit time.Duration) map[string]any {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	var sb map[string]any
	for time.Now().Before(deadline) {
		sb = c.mustCall(s, "GET", "/v1/sandboxes/"+id, nil)
		if at, err := time.Parse(time.RFC3339Nano, str(sb["checkpoint_at"])); err == nil && at.After(since) {
			return sb
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.t.Fatalf("no checkpoint of %s after %v within %v: %v", id, since, limit, sb)
	return nil
}

func str(v any) string { s, _ := v.(string); return s }

// A node lost with checkpointed sandboxes: the sandbox with checkpoints
// (checkpoint_seconds) comes back running on the other node from its
// latest checkpoint, with its id, its session token, its files (and on
// gVisor its processes), through lost → restarting → running events that
// say how old the state is; the one without stays lost with the reason.
// When the lost node returns it removes both of its old instances.
func TestFleetCheckpointRestart(t *testing.T) {
	driver, sub := ckptDriver()
	snapDir, err := os.MkdirTemp("", "space-ckpt-snaps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(snapDir) })
	c := newFleet(t, fleetOpts{nodes: 2, replicas: 2, driver: driver, snapStore: "dir:" + snapDir})
	a, b := c.servers[0], c.servers[1]
	limits := map[string]any{"memory_bytes": 256 << 20}
	create := func(body map[string]any) (id, node, url, tok string) {
		t.Helper()
		m := c.mustCall(a, "POST", "/v1/sandboxes", body)
		if done := c.waitOp(a, opID(m), 90*time.Second); done["state"] != "succeeded" {
			t.Fatalf("create: %v", done)
		}
		sb, sess := m["sandbox"].(map[string]any), m["session"].(map[string]any)
		return sb["id"].(string), sb["node"].(string), sess["data_url"].(string), sess["token"].(string)
	}
	// Hostile intervals are refused.
	for _, bad := range []any{1, -5, 604801, "x"} {
		if st, m := c.call(a, "POST", "/v1/sandboxes", map[string]any{"template": "minimal", "checkpoint_seconds": bad}); st != 400 {
			t.Fatalf("checkpoint_seconds %v: %d %v, want 400", bad, st, m)
		}
	}
	ck, from, url, tok := create(map[string]any{"template": "minimal", "limits": limits, "checkpoint_seconds": 5})
	// The un-checkpointed sandbox must share the victim node (placement
	// spreads: the ones that land elsewhere stay until the end).
	var plain string
	var extra []string
	for i := 0; plain == "" && i < 6; i++ {
		id, node, _, _ := create(map[string]any{"template": "minimal", "limits": limits})
		if node == from {
			plain = id
		} else {
			extra = append(extra, id)
		}
	}
	if plain == "" {
		t.Fatalf("6 creates never landed on %s", from)
	}
	var victim, other *proc
	for _, p := range c.nodes {
		if p.name == from {
			victim = p
		} else {
			other = p
		}
	}
	script := "echo kept > /tmp/f"
	if driver == "gvisor" {
		script += " && " + counterLoop("/tmp/count") + " sleep 0.5"
	}
	if out, code, err := exec1(url, tok, ck, "sh", "-c", script); err != nil || code != 0 {
		t.Fatalf("write the file: %q %d %v", out, code, err)
	}
	written := time.Now()
	before := c.waitCheckpoint(a, ck, written, 60*time.Second)
	if before["checkpoint_seconds"] != float64(5) || str(before["checkpoint"]) == "" {
		t.Fatalf("checkpointed sandbox: %v", before)
	}
	victim.signal(syscall.SIGKILL)
	killed := time.Now()
	c.waitState(b, plain, "lost", 4*nodeTimeout)
	c.waitState(b, ck, "running", 4*nodeTimeout+90*time.Second)
	back := c.mustCall(b, "GET", "/v1/sandboxes/"+ck, nil)
	t.Logf("%s sandbox %s: node %s killed, running on %s %v later: %s", driver, ck, from, back["node"],
		time.Since(killed).Round(time.Millisecond), back["state_reason"])
	if back["node"] != other.name || !strings.Contains(str(back["state_reason"]), "restarted on node "+other.name) {
		t.Fatalf("after the restart: %v", back)
	}
	lost := c.mustCall(b, "GET", "/v1/sandboxes/"+plain, nil)
	if r := str(lost["state_reason"]); !strings.Contains(r, "node lost") || !strings.Contains(r, from) {
		t.Fatalf("un-checkpointed sandbox: %v", lost)
	}
	// Events: lost, then restarting and running with the state's age.
	evs := stateEvents(t, c.dsn, ck)
	var states []string
	for _, e := range evs {
		states = append(states, e.State)
	}
	i := slices.Index(states, "lost")
	if i < 0 || i+2 >= len(evs) || states[i+1] != "restarting" || states[i+2] != "running" {
		t.Fatalf("events of %s: %v, want … lost, restarting, running", ck, states)
	}
	for _, e := range evs[i+1 : i+3] {
		if e.AgeMS == nil || *e.AgeMS <= 0 || *e.AgeMS > time.Since(written).Milliseconds() || e.Node != other.name || e.Checkpt == "" {
			t.Fatalf("%s event: %+v (age must be within the time since the file was written)", e.State, e)
		}
	}
	t.Logf("restarted from a checkpoint %d ms old", *evs[i+2].AgeMS)
	// The same session token works on the other node's data plane.
	otherURL := other.addr["data"]
	if out, code, err := exec1(otherURL, tok, ck, "cat", "/tmp/f"); err != nil || code != 0 || out != "kept\n" {
		t.Fatalf("file after the restart (old token, %s): %q %d %v", otherURL, out, code, err)
	}
	if driver == "gvisor" {
		count := func() int {
			out, code, err := exec1(otherURL, tok, ck, "cat", "/tmp/count")
			n, perr := strconv.Atoi(strings.TrimSpace(out))
			if err != nil || code != 0 || perr != nil {
				t.Fatalf("read the counter: %q %d %v", out, code, err)
			}
			return n
		}
		first := count()
		if first < 5 {
			t.Fatalf("counter %d after the restart: the process started afresh instead of coming back", first)
		}
		deadline := time.Now().Add(30 * time.Second)
		for count() <= first {
			if time.Now().After(deadline) {
				t.Fatalf("counter stuck at %d after the restart: the process is not running", first)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// Deleting the lost sandbox works; the returning node removes both
	// of its old instances (the deleted one and the one that moved).
	if done := c.waitOp(a, opID(c.mustCall(a, "DELETE", "/v1/sandboxes/"+plain, nil)), 60*time.Second); done["state"] != "succeeded" {
		t.Fatalf("delete the lost sandbox: %v", done)
	}
	victim.start(t)
	deadline := time.Now().Add(30 * time.Second)
	for left := driverDirs(victim.dataDir, sub); len(left) > 0; left = driverDirs(victim.dataDir, sub) {
		if time.Now().After(deadline) {
			t.Fatalf("old instances still on %s after it came back: %v", from, left)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, code, err := exec1(otherURL, tok, ck, "cat", "/tmp/f"); err != nil || code != 0 || out != "kept\n" {
		t.Fatalf("restarted sandbox after %s came back: %q %d %v", from, out, code, err)
	}
	for _, id := range append(extra, ck) {
		if done := c.waitOp(a, opID(c.mustCall(a, "DELETE", "/v1/sandboxes/"+id, nil)), 60*time.Second); done["state"] != "succeeded" {
			t.Fatalf("delete %s: %v", id, done)
		}
	}
	// Its checkpoints went with it.
	st, err := postgres.Open(context.Background(), c.dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if snaps, err := st.ListSnapshots(context.Background(), core.SnapshotFilter{SandboxID: ck, States: []core.SnapshotState{core.SnapshotReady}}); err != nil || len(snaps) != 0 {
		t.Fatalf("checkpoints left after the delete: %d %v", len(snaps), err)
	}
}
