package multinode

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/criu"
	"github.com/space-sandbox/space/internal/driver/gvisor"
	"github.com/space-sandbox/space/internal/store/postgres"
	"github.com/space-sandbox/space/test/testenv"
)

// Draining nodes for upgrades (space node drain/undrain): a drained node
// gets no placement, its sandboxes move to another node sharing the
// snapshot store with their ids and session tokens, and a rolling upgrade
// of every node (drain, restart, undrain, one after the other) keeps
// every sandbox: its files on every driver, its running processes where
// the driver captures them (gVisor).

// adminKey makes an operator key of project p1.
func (c *cluster) adminKey() string {
	c.t.Helper()
	out, err := exec.Command(c.nodes[0].bin, "keys", "create", "--store", c.dsn, "--project", "p1", "--admin").Output()
	if err != nil {
		c.t.Fatalf("keys create --admin: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// as calls s with key.
func (c *cluster) as(key string, s *proc, method, path string, body any) (int, map[string]any) {
	c.t.Helper()
	st, m, err := testenv.DoJSON(method, s.addr["control"]+path, map[string]string{"X-API-Key": key}, body)
	if err != nil {
		c.t.Fatalf("%s %s on %s: %v", method, path, s.name, err)
	}
	return st, m
}

// nodeRecord returns the registry's record of node name, through s.
func (c *cluster) nodeRecord(key string, s *proc, name string) map[string]any {
	c.t.Helper()
	st, m := c.as(key, s, "GET", "/v1/nodes", nil)
	if st != 200 {
		c.t.Fatalf("GET /v1/nodes: %d %v", st, m)
	}
	for _, x := range m["nodes"].([]any) {
		if n := x.(map[string]any); n["name"] == name && n["kind"] == "node" {
			return n
		}
	}
	c.t.Fatalf("node %s not in the registry: %v", name, m)
	return nil
}

// drainResult is a node.drain operation's result.
type drainResult struct {
	moved  map[string]string // sandbox → node it moved to
	procs  map[string]string // sandbox → what came back of its processes
	stayed map[string]string // sandbox → reason
	hib    int
}

func parseDrain(t *testing.T, op map[string]any) drainResult {
	t.Helper()
	if op["state"] != "succeeded" {
		t.Fatalf("drain: %v", op)
	}
	res := op["result"].(map[string]any)
	out := drainResult{moved: map[string]string{}, procs: map[string]string{}, stayed: map[string]string{}}
	for _, x := range res["moved"].([]any) {
		m := x.(map[string]any)
		out.moved[m["sandbox"].(string)] = m["to"].(string)
		out.procs[m["sandbox"].(string)], _ = m["processes"].(string)
	}
	for _, x := range res["stayed"].([]any) {
		m := x.(map[string]any)
		out.stayed[m["sandbox"].(string)] = m["reason"].(string)
	}
	out.hib = int(res["hibernated"].(float64))
	return out
}

// upgradeSandbox is one sandbox the rolling upgrade must keep.
type upgradeSandbox struct {
	id, tok string
	paused  bool
}

func TestFleetRollingUpgrade(t *testing.T) { rollingUpgrade(t, "namespace", 3) }

func TestFleetRollingUpgradeGVisor(t *testing.T) {
	if _, err := gvisor.FindRunsc(""); err != nil {
		t.Skipf("needs runsc (scripts/runsc.sh): %v", err)
	}
	rollingUpgrade(t, "gvisor", 2)
}

// rollingUpgrade: n nodes of driver sharing a dir: snapshot store, two
// replicas. Sandboxes spread over the nodes (one paused; on gVisor each
// runs a counter process); then each node in turn is drained (the first
// with the CLI), restarted and undrained. Placement never picks a drained
// node, the drain survives the node's restart, and after every step every
// sandbox answers with its original session token through a node's data
// listener, with its file, paused where it was paused, and on gVisor
// with its counter still counting from where it was.
func rollingUpgrade(t *testing.T, driver string, n int) {
	snapDir, err := os.MkdirTemp("", "space-drain-snaps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(snapDir) })
	c := newFleet(t, fleetOpts{nodes: n, replicas: 2, driver: driver, snapStore: "dir:" + snapDir})
	admin := c.adminKey()
	gv := driver == "gvisor"
	// Processes move with a sandbox on gVisor, and on namespace where the
	// nodes have scripts/criu.sh's CRIU (on unless --namespace-criu=false).
	procs := gv
	if _, _, err := criu.ProbeSandboxes(context.Background(), ""); err == nil && driver == "namespace" {
		procs = true
	}
	mem := 32 << 20
	if gv {
		mem = 256 << 20
	}
	create := func(via *proc) upgradeSandbox {
		t.Helper()
		m := c.mustCall(via, "POST", "/v1/sandboxes", map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": mem}})
		if done := c.waitOp(via, opID(m), 90*time.Second); done["state"] != "succeeded" {
			t.Fatalf("create: %v", done)
		}
		sb, sess := m["sandbox"].(map[string]any), m["session"].(map[string]any)
		s := upgradeSandbox{id: sb["id"].(string), tok: sess["token"].(string)}
		script := "echo " + s.id + " > /tmp/keep"
		if procs {
			script += " && " + counterLoop("/tmp/count") + " sleep 0.3"
		}
		if out, code, err := exec1(sess["data_url"].(string), s.tok, s.id, "sh", "-c", script); err != nil || code != 0 {
			t.Fatalf("prepare %s: %q %d %v", s.id, out, code, err)
		}
		return s
	}
	var all []upgradeSandbox
	for i := 0; i < 2*n; i++ {
		all = append(all, create(c.servers[i%2]))
	}
	all[0].paused = true
	if done := c.waitOp(c.servers[0], opID(c.mustCall(c.servers[0], "POST", "/v1/sandboxes/"+all[0].id+"/pause", nil)), 60*time.Second); done["state"] != "succeeded" {
		t.Fatalf("pause: %v", done)
	}
	counts := map[string]int{}
	// check: every sandbox is live with its file, through any ready
	// node's data listener (never one being restarted), with the token
	// it was created with.
	check := func(step string, up []*proc) {
		t.Helper()
		seen := c.list(c.servers[1])
		for i, s := range all {
			sb := seen[s.id]
			want := "running"
			if s.paused {
				want = "paused"
			}
			if sb == nil || sb["state"] != want {
				t.Fatalf("%s: sandbox %s is %v, want %s", step, s.id, sb, want)
			}
			if s.paused {
				continue
			}
			via := up[i%len(up)].addr["data"]
			if out, code, err := exec1(via, s.tok, s.id, "cat", "/tmp/keep"); err != nil || code != 0 || out != s.id+"\n" {
				t.Fatalf("%s: sandbox %s on %v through %s: %q %d %v", step, s.id, sb["node"], via, out, code, err)
			}
			if !procs {
				continue
			}
			out, code, err := exec1(via, s.tok, s.id, "cat", "/tmp/count")
			v, perr := strconv.Atoi(strings.TrimSpace(out))
			if err != nil || code != 0 || perr != nil {
				t.Fatalf("%s: counter of %s: %q %d %v", step, s.id, out, code, err)
			}
			// The process came along: its value did not go back, and it
			// still counts.
			if v < counts[s.id] || v < 2 {
				t.Fatalf("%s: counter of %s is %d, was %d: the process restarted", step, s.id, v, counts[s.id])
			}
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				out, _, _ := exec1(via, s.tok, s.id, "cat", "/tmp/count")
				if w, _ := strconv.Atoi(strings.TrimSpace(out)); w > v {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: counter of %s stuck at %d: the process is not running", step, s.id, v)
				}
			}
			counts[s.id] = v
		}
	}
	check("before the upgrade", c.nodes)
	for k, node := range c.nodes {
		var op map[string]any
		t0 := time.Now()
		if k == 0 {
			// The CLI verb, as an operator runs it.
			cmd := exec.Command(node.bin, "node", "drain", node.name, "--json", "--url", c.servers[0].addr["control"])
			cmd.Env = append(os.Environ(), "SPACE_API_KEY="+admin)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("space node drain %s: %v\n%s", node.name, err, out)
			}
			if err := json.Unmarshal(out, &op); err != nil {
				t.Fatalf("space node drain output: %v: %s", err, out)
			}
		} else {
			st, m := c.as(admin, c.servers[k%2], "POST", "/v1/nodes/"+node.name+"/drain", nil)
			if st != 202 {
				t.Fatalf("drain %s: %d %v", node.name, st, m)
			}
			op = c.waitOp(c.servers[k%2], opID(m), 5*time.Minute)
		}
		res := parseDrain(t, op)
		if len(res.stayed) != 0 {
			t.Fatalf("drain of %s left sandboxes: %v", node.name, res.stayed)
		}
		for id, to := range res.moved {
			if to == node.name {
				t.Fatalf("drain of %s moved %s onto itself", node.name, id)
			}
			// What the driver promises: processes on gVisor and on
			// namespace with CRIU, files only on namespace without.
			if want := map[bool]string{true: "captured", false: "not captured"}[procs]; !strings.HasPrefix(res.procs[id], want) {
				t.Fatalf("drain of %s moved %s with processes %q, want %s", node.name, id, res.procs[id], want)
			}
		}
		listed := c.list(c.servers[0])
		for id, sb := range listed {
			if sb["node"] == node.name && sb["state"] != "deleted" {
				t.Fatalf("after the drain of %s, sandbox %s is still there (%v)", node.name, id, sb["state"])
			}
		}
		t.Logf("drained %s: %d sandboxes moved in %v", node.name, len(res.moved), time.Since(t0).Round(time.Millisecond))
		if rec := c.nodeRecord(admin, c.servers[1], node.name); rec["drained"] != true {
			t.Fatalf("registry after the drain: %v", rec)
		}
		// No placement on the drained node, through either replica.
		fresh := create(c.servers[(k+1)%2])
		if sb := c.list(c.servers[0])[fresh.id]; sb["node"] == node.name {
			t.Fatalf("sandbox %s placed on drained %s", fresh.id, node.name)
		}
		all = append(all, fresh)
		var up []*proc
		for _, p := range c.nodes {
			if p != node {
				up = append(up, p)
			}
		}
		check("after draining "+node.name, up)
		// The upgrade: the node stops and starts again; it stays drained.
		node.signal(syscall.SIGTERM)
		node.start(t)
		st, err := postgres.Open(context.Background(), c.dsn, postgres.Options{})
		if err != nil {
			t.Fatal(err)
		}
		waitNodes(t, st, c.nodes)
		st.Close()
		if rec := c.nodeRecord(admin, c.servers[0], node.name); rec["drained"] != true {
			t.Fatalf("registry after %s restarted: %v", node.name, rec)
		}
		st2, m := c.as(admin, c.servers[k%2], "POST", "/v1/nodes/"+node.name+"/undrain", nil)
		if st2 != 200 || m["node"].(map[string]any)["drained"] == true {
			t.Fatalf("undrain %s: %d %v", node.name, st2, m)
		}
		check("after upgrading "+node.name, c.nodes)
	}
	// A project key may not drain; the events told the project.
	if st, m := c.call(c.servers[0], "POST", "/v1/nodes/"+c.nodes[0].name+"/drain", nil); st != 403 {
		t.Fatalf("drain with a project key: %d %v", st, m)
	}
	if moved := c.countEvents(c.servers[0], "sandbox.moved", len(all)-1); moved < len(all)-1 {
		t.Fatalf("%d sandbox.moved events for %d sandboxes over %d drains", moved, len(all), n)
	}
	for _, s := range all {
		if done := c.waitOp(c.servers[0], opID(c.mustCall(c.servers[0], "DELETE", "/v1/sandboxes/"+s.id, nil)), 60*time.Second); done["state"] != "succeeded" {
			t.Fatalf("delete %s: %v", s.id, done)
		}
	}
}

// TestFleetDrainWithoutSharedStore: nodes without a shared snapshot store
// cannot move sandboxes; a drain stops placement there, leaves its
// sandboxes running with the reason, and undrain lets placement back.
func TestFleetDrainWithoutSharedStore(t *testing.T) {
	c := newFleet(t, fleetOpts{nodes: 2, replicas: 1})
	s := c.servers[0]
	admin := c.adminKey()
	m := c.mustCall(s, "POST", "/v1/sandboxes", map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 32 << 20}})
	if done := c.waitOp(s, opID(m), 60*time.Second); done["state"] != "succeeded" {
		t.Fatalf("create: %v", done)
	}
	id, from := m["sandbox"].(map[string]any)["id"].(string), m["sandbox"].(map[string]any)["node"].(string)
	st, d := c.as(admin, s, "POST", "/v1/nodes/"+from+"/drain", nil)
	if st != 202 {
		t.Fatalf("drain: %d %v", st, d)
	}
	res := parseDrain(t, c.waitOp(s, opID(d), 2*time.Minute))
	if len(res.moved) != 0 || !strings.Contains(res.stayed[id], "no shared snapshot store") {
		t.Fatalf("drain without a shared store: moved %v, stayed %v", res.moved, res.stayed)
	}
	if sb := c.mustCall(s, "GET", "/v1/sandboxes/"+id, nil); sb["state"] != "running" || sb["node"] != from {
		t.Fatalf("the sandbox that could not move: %v", sb)
	}
	for i := 0; i < 3; i++ {
		m := c.mustCall(s, "POST", "/v1/sandboxes", map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 32 << 20}})
		if node := m["sandbox"].(map[string]any)["node"]; node == from {
			t.Fatalf("placed on drained %s", from)
		}
		c.waitOp(s, opID(m), 60*time.Second)
	}
	if st, m := c.as(admin, s, "POST", "/v1/nodes/nope/drain", nil); st != 404 {
		t.Fatalf("drain of an unknown node: %d %v", st, m)
	}
	if st, m := c.as(admin, s, "POST", "/v1/nodes/"+from+"/undrain", nil); st != 200 {
		t.Fatalf("undrain: %d %v", st, m)
	}
	// Placement there again: it has the most room now (one sandbox to
	// the other's three).
	back := false
	for i := 0; i < 6 && !back; i++ {
		m := c.mustCall(s, "POST", "/v1/sandboxes", map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 32 << 20}})
		back = m["sandbox"].(map[string]any)["node"] == from
		c.waitOp(s, opID(m), 60*time.Second)
	}
	if !back {
		t.Fatalf("nothing placed on %s after undrain", from)
	}
	for id, sb := range c.list(s) {
		if sb["state"] == "running" {
			c.waitOp(s, opID(c.mustCall(s, "DELETE", "/v1/sandboxes/"+id, nil)), 60*time.Second)
		}
	}
}

// countEvents reads the project's event stream from its start until it
// has seen want events of type typ (or 20 s passed) and returns how many.
func (c *cluster) countEvents(s *proc, typ string, want int) int {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.addr["control"]+"/v1/events?last_event_id=0", nil)
	req.Header.Set("X-API-Key", c.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("events: %v", err)
	}
	defer resp.Body.Close()
	n := 0
	for sc := bufio.NewScanner(resp.Body); n < want && sc.Scan(); {
		if sc.Text() == "event: "+typ {
			n++
		}
	}
	return n
}
