package multinode

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/store/postgres/pgtest"
	"github.com/space-sandbox/space/test/testenv"
)

// fleetOpts shape a small fleet: n nodes behind the given replicas.
type fleetOpts struct {
	nodes    int
	replicas int
	// driver of every node (default namespace); nodeArgs adds flags per node.
	driver   string
	nodeArgs func(i int) []string
	// snapStore: the nodes' --snapshot-store ("" = none).
	snapStore string
	// dsn: a PostgreSQL database of the test's own ("" = a fresh one on
	// the shared server of $SPACE_TEST_POSTGRES).
	dsn string
	// serverArgs adds flags to every replica.
	serverArgs []string
}

// newFleet starts PostgreSQL-backed replicas and nodes as separate
// processes, waits until every node advertises minimal, and stops and
// checks everything (no sandbox, mount or cgroup left) at cleanup.
func newFleet(t *testing.T, o fleetOpts) *cluster {
	t.Helper()
	if os.Getenv(pgtest.EnvDSN) == "" && o.dsn == "" {
		t.Skipf("needs PostgreSQL: set %s (export %s=$(bash scripts/postgres.sh))", pgtest.EnvDSN, pgtest.EnvDSN)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (sandbox drivers)")
	}
	if o.driver == "" {
		o.driver = "namespace"
	}
	dsn := o.dsn
	if dsn == "" {
		dsn = pgtest.FreshDSN(t)
	}
	env, err := testenv.New("space-fleet")
	if err != nil {
		if env != nil {
			env.Remove()
		}
		t.Fatal(err)
	}
	c := &cluster{t: t, dsn: dsn}
	secret := filepath.Join(env.Work, "cluster-secret")
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte(hex.EncodeToString(raw)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range append(append([]*proc{}, c.servers...), c.nodes...) {
			p.signal(syscall.SIGTERM)
		}
		sweep(t, dsn, c.nodes)
		leftovers(t, c.dirs)
		for _, d := range c.runDirs {
			os.RemoveAll(d)
		}
		if !t.Failed() {
			env.Remove()
		} else {
			t.Logf("logs kept in %s", env.Work)
		}
	})
	for i := 0; i < o.nodes; i++ {
		dataDir := filepath.Join(env.Work, fmt.Sprintf("node%d", i+1))
		runDir, err := os.MkdirTemp("/tmp", "spf")
		if err != nil {
			t.Fatal(err)
		}
		c.runDirs = append(c.runDirs, runDir)
		c.dirs = append(c.dirs, dataDir)
		p := &proc{name: fmt.Sprintf("n%d", i+1), bin: env.Bin, log: filepath.Join(env.Work, fmt.Sprintf("node%d.log", i+1)),
			addrFile: filepath.Join(env.Work, fmt.Sprintf("node%d.addr", i+1)), dataDir: dataDir}
		p.args = []string{"node", "--name", p.name, "--store", dsn, "--driver", o.driver, "--data-dir", dataDir, "--run-dir", runDir,
			"--template-dir", filepath.Join(dataDir, "templates"), "--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0",
			"--uid-base", fmt.Sprint(1100000 + i*65536*4), "--builtins", "minimal", "--cluster-secret-file", secret,
			"--heartbeat", "500ms"}
		if o.snapStore != "" {
			p.args = append(p.args, "--snapshot-store", o.snapStore)
		}
		if o.nodeArgs != nil {
			p.args = append(p.args, o.nodeArgs(i)...)
		}
		c.nodes = append(c.nodes, p)
	}
	for i := 0; i < o.replicas; i++ {
		name := fmt.Sprintf("srv-%c", 'a'+i)
		p := &proc{name: name, bin: env.Bin, log: filepath.Join(env.Work, name+".log"), addrFile: filepath.Join(env.Work, name+".addr")}
		p.args = []string{"server", "--remote-nodes", "--node-name", name, "--store", dsn, "--data-dir", filepath.Join(env.Work, name),
			"--listen", "127.0.0.1:0", "--cluster-secret-file", secret, "--node-timeout", nodeTimeout.String()}
		p.args = append(p.args, o.serverArgs...)
		c.servers = append(c.servers, p)
	}
	c.boot(t, env)
	return c
}

// Refusals with remote nodes (docs/scale-out.md): what the fleet does not
// do yet answers 503 unavailable at once, never an accepted request that
// fails or is ignored later.
func TestFleetRefusals(t *testing.T) {
	c := newFleet(t, fleetOpts{nodes: 1, replicas: 1})
	s := c.servers[0]
	for _, tc := range []struct {
		method, path string
		body         any
		want         string // in the message
	}{
		{"POST", "/v1/credentials", map[string]any{"name": "k", "secret": "s", "host": "api.test"}, "credentials"},
		{"GET", "/v1/credentials", nil, "credentials"},
		{"DELETE", "/v1/credentials/cred-0123456789abcdef", nil, "credentials"},
		{"POST", "/v1/sandboxes", map[string]any{"template": "minimal", "network": map[string]any{"mode": "allowlist",
			"allow": []string{"api.test"}, "credentials": []string{"cred-0123456789abcdef"}}}, "credentials"},
	} {
		st, m := c.call(s, tc.method, tc.path, tc.body)
		e, _ := m["error"].(map[string]any)
		if st != 503 || e["code"] != "unavailable" || !strings.Contains(fmt.Sprint(e["message"]), tc.want) {
			t.Errorf("%s %s: %d %v, want 503 unavailable about %s", tc.method, tc.path, st, m, tc.want)
		}
	}
	// Nothing was created by the refused requests.
	if all := c.list(s); len(all) != 0 {
		t.Fatalf("refused requests left sandboxes: %v", all)
	}
}

// The issue-31 reproduction end to end: 16 clients churning create → first
// command → delete against two nodes whose memory holds the live set
// (16 sandboxes of 256 MiB in 2 × 3 GiB) but not the last two seconds of
// placements. Before the placement view tracked deletes, most creates
// were refused with 429.
func TestFleetChurnNo429(t *testing.T) {
	c := newFleet(t, fleetOpts{nodes: 2, replicas: 2, nodeArgs: func(int) []string { return []string{"--memory-bytes", fmt.Sprint(3 << 30)} }})
	const clients, cycles = 16, 160
	var refused, failed atomic.Int64
	var mu sync.Mutex
	perNode := map[string]int{}
	t0 := time.Now()
	parallel(cycles, clients, func(i int) {
		via := c.servers[i%2]
		st, m := c.call(via, "POST", "/v1/sandboxes", map[string]any{"template": "minimal",
			"limits": map[string]any{"memory_bytes": 256 << 20, "cpu_millis": 100, "pids": 64}})
		if st == 429 {
			refused.Add(1)
			t.Errorf("create %d refused: %v", i, m)
			return
		}
		if st != 202 {
			failed.Add(1)
			t.Errorf("create %d: %d %v", i, st, m)
			return
		}
		sb, sess := m["sandbox"].(map[string]any), m["session"].(map[string]any)
		id := sb["id"].(string)
		if done := c.waitOp(via, opID(m), 60*time.Second); done["state"] != "succeeded" {
			t.Errorf("create %s: %v", id, done)
			return
		}
		mu.Lock()
		perNode[sb["node"].(string)]++
		mu.Unlock()
		if out, code, err := exec1(sess["data_url"].(string), sess["token"].(string), id, "echo", "hi"); err != nil || code != 0 || out != "hi\n" {
			t.Errorf("exec in %s: %q %d %v", id, out, code, err)
		}
		other := c.servers[(i+1)%2] // deleted through the other replica
		if st, m := c.call(other, "DELETE", "/v1/sandboxes/"+id, nil); st != 202 {
			t.Errorf("delete %s: %d %v", id, st, m)
		} else {
			c.waitOp(other, opID(m), 60*time.Second)
		}
	})
	d := time.Since(t0)
	t.Logf("%d cycles with %d clients in %v (%.1f/s), per node %v, 429: %d", cycles, clients, d.Round(time.Millisecond),
		float64(cycles)/d.Seconds(), perNode, refused.Load())
	if perNode["n1"] == 0 || perNode["n2"] == 0 {
		t.Errorf("not spread: %v", perNode)
	}
}
