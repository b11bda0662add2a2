package multinode

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

// ownPostgres is a PostgreSQL cluster of the test's own (its directory and
// port), started by scripts/postgres.sh, so the test can restart it without
// touching the shared server other tests use.
type ownPostgres struct {
	script, dir, port string
}

func startOwnPostgres(t *testing.T) (*ownPostgres, string) {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "..", "scripts", "postgres.sh"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	// Short: the unix socket lives in it.
	dir, err := os.MkdirTemp("/tmp", "spg")
	if err != nil {
		t.Fatal(err)
	}
	pg := &ownPostgres{script: script, dir: dir, port: port}
	dsn, err := pg.run("start")
	if err != nil {
		os.RemoveAll(dir)
		if strings.Contains(err.Error(), "not installed") {
			t.Skipf("needs the postgresql binaries: %v", err)
		}
		t.Fatalf("start PostgreSQL in %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if _, err := pg.run("destroy"); err != nil {
			t.Errorf("destroy PostgreSQL in %s: %v", dir, err)
		}
	})
	return pg, strings.TrimSpace(dsn)
}

func (pg *ownPostgres) run(verb string) (string, error) {
	cmd := exec.Command("bash", pg.script, verb)
	cmd.Env = append(os.Environ(), "SPACE_PG_DIR="+pg.dir, "SPACE_PG_PORT="+pg.port, "SPACE_PG_NO_INSTALL=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("postgres.sh %s: %w: %s", verb, err, stderr.String())
	}
	return string(out), nil
}

// acked is a create the API acknowledged (202), as a client saw it.
type acked struct {
	id, op, node string
	checkpoint   bool
	wrote        time.Time // when the file was written (zero: never)
}

// A fleet under load survives chaos: while clients create a few sandboxes
// a second through either replica (retrying through the other, with an
// Idempotency-Key), a node is killed with SIGKILL, a replica is killed
// with SIGKILL, PostgreSQL (the test's own cluster) is restarted and
// another node is drained (space node drain). No
// acknowledged create is lost: each operation ends visibly, each sandbox
// ends running (checkpointed ones of the killed node on another node, with
// their files as of their checkpoint) or in a terminal state with a reason.
func TestFleetChaos(t *testing.T) {
	pg, dsn := startOwnPostgres(t)
	snapDir, err := os.MkdirTemp("", "space-chaos-snaps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(snapDir) })
	// Project p1 checkpoints every 5 s by default; every other create opts out.
	c := newFleet(t, fleetOpts{nodes: 3, replicas: 2, snapStore: "dir:" + snapDir, dsn: dsn,
		serverArgs: []string{"--checkpoint-default", "p1=5s"}})
	var (
		mu     sync.Mutex
		acks   []*acked
		down   = map[string]bool{} // replicas killed
		errors []string
	)
	alive := func() []*proc {
		mu.Lock()
		defer mu.Unlock()
		var out []*proc
		for _, s := range c.servers {
			if !down[s.name] {
				out = append(out, s)
			}
		}
		return out
	}
	// call retries through the live replicas until one answers below 500
	// (connection refused, PostgreSQL restarting) or 40 s pass.
	callAs := func(apiKey string, first int, method, path string, body any, key string) (int, map[string]any) {
		deadline := time.Now().Add(40 * time.Second)
		for i := first; ; i++ {
			reps := alive()
			s := reps[i%len(reps)]
			st, m, err := testenv.DoJSON(method, s.addr["control"]+path, map[string]string{"X-API-Key": apiKey, "Idempotency-Key": key}, body)
			if err == nil && st < 500 {
				return st, m
			}
			if time.Now().After(deadline) {
				return st, map[string]any{"error": fmt.Sprint(err, m)}
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	call := func(first int, method, path string, body any, key string) (int, map[string]any) {
		return callAs(c.key, first, method, path, body, key)
	}
	// waitOp follows an operation through the live replicas.
	waitOp := func(op string, limit time.Duration) map[string]any {
		deadline := time.Now().Add(limit)
		for time.Now().Before(deadline) {
			st, m := call(0, "GET", "/v1/operations/"+op+"?wait=3s", nil, "")
			if st == 200 && (m["state"] == "succeeded" || m["state"] == "failed" || m["state"] == "cancelled") {
				return m
			}
		}
		return nil
	}
	const clients, perClient = 3, 20 // ~3 creates a second for ~20-30 s
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for i := 0; i < perClient; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				ckpt := i%2 == 0
				body := map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 64 << 20, "cpu_millis": 100, "pids": 64}}
				if !ckpt {
					body["checkpoint_seconds"] = 0
				}
				st, m := call(w+i, "POST", "/v1/sandboxes", body, fmt.Sprintf("chaos-%d-%d", w, i))
				if st != 202 {
					mu.Lock()
					errors = append(errors, fmt.Sprintf("create %d/%d: %d %v", w, i, st, m))
					mu.Unlock()
					continue
				}
				sb, sess := m["sandbox"].(map[string]any), m["session"].(map[string]any)
				if want := map[bool]any{true: float64(5), false: nil}[ckpt]; sb["checkpoint_seconds"] != want {
					mu.Lock()
					errors = append(errors, fmt.Sprintf("create %d/%d: checkpoint_seconds %v, want %v (project default 5)", w, i, sb["checkpoint_seconds"], want))
					mu.Unlock()
				}
				a := &acked{id: sb["id"].(string), op: opID(m), node: str(sb["node"]), checkpoint: ckpt}
				mu.Lock()
				acks = append(acks, a)
				mu.Unlock()
				if done := waitOp(a.op, 60*time.Second); done == nil || done["state"] != "succeeded" {
					continue // settled later (failed, with a reason)
				}
				if _, code, err := exec1(str(sess["data_url"]), str(sess["token"]), a.id, "sh", "-c", "echo "+a.id+" > /tmp/f"); err == nil && code == 0 {
					mu.Lock()
					a.wrote = time.Now()
					mu.Unlock()
				}
			}
		}(w)
	}
	// The chaos, each step once the previous one has settled. The node of
	// the first sandbox with a checkpoint dies first.
	var victim *proc
	var all map[string]map[string]any
	for deadline := time.Now().Add(45 * time.Second); victim == nil; time.Sleep(300 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no sandbox got a checkpoint within 45 s")
		}
		all = c.list(c.servers[1])
		for _, sb := range all {
			for _, n := range c.nodes {
				if victim == nil && sb["node"] == n.name && sb["state"] == "running" && str(sb["checkpoint"]) != "" {
					victim = n
				}
			}
		}
	}
	onVictim := map[string]map[string]any{}
	withCkpt := 0
	for id, sb := range all {
		if sb["node"] == victim.name && sb["state"] == "running" {
			onVictim[id] = sb
			if str(sb["checkpoint"]) != "" {
				withCkpt++
			}
		}
	}
	victim.signal(syscall.SIGKILL)
	t.Logf("killed node %s with %d running sandboxes", victim.name, len(onVictim))
	for id := range onVictim {
		waitSettled(t, c, c.servers[1], id, victim.name, 4*nodeTimeout+30*time.Second)
	}
	replica := c.servers[0]
	mu.Lock()
	down[replica.name] = true
	mu.Unlock()
	replica.signal(syscall.SIGKILL)
	t.Logf("killed replica %s", replica.name)
	time.Sleep(3 * time.Second)
	if _, err := pg.run("stop"); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.run("start"); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted PostgreSQL")
	// Drain another node while creates may still arrive: its sandboxes
	// move (hibernated, woken elsewhere), nothing new lands on it.
	var drained *proc
	for _, n := range c.nodes {
		if n != victim && drained == nil {
			drained = n
		}
	}
	admin := c.adminKey()
	st, m := callAs(admin, 0, "POST", "/v1/nodes/"+drained.name+"/drain", nil, "chaos-drain")
	if st != 202 {
		t.Fatalf("drain %s: %d %v", drained.name, st, m)
	}
	dr := parseDrain(t, waitOp(opID(m), 3*time.Minute))
	t.Logf("drained %s: %d moved, %d stayed %v", drained.name, len(dr.moved), len(dr.stayed), dr.stayed)
	for id, reason := range dr.stayed {
		if reason == "" {
			t.Errorf("drain left %s without a reason", id)
		}
	}
	wg.Wait()
	close(stop)
	mu.Lock()
	for _, e := range errors {
		t.Errorf("%s", e)
	}
	mu.Unlock()
	// Every acknowledged create ends visibly: its operation is done and its
	// sandbox is running or terminal with a reason.
	s := c.servers[1]
	running, terminal := 0, 0
	reasons := map[string]int{}
	for _, a := range acks {
		if done := waitOp(a.op, 60*time.Second); done == nil {
			t.Errorf("operation %s of acknowledged create %s never finished", a.op, a.id)
			continue
		}
		notOn := ""
		if _, ok := onVictim[a.id]; ok {
			notOn = victim.name
		}
		sb := waitSettled(t, c, s, a.id, notOn, 60*time.Second)
		switch st := sb["state"]; {
		case st == "running":
			running++
			url, tok := c.session(s, a.id)
			out, code, err := exec1(url, tok, a.id, "cat", "/tmp/f")
			want := a.id + "\n"
			if a.wrote.IsZero() {
				want = "?" // never written (its first node died under the client), or written and the answer lost
			}
			if _, ok := onVictim[a.id]; ok {
				// As of its checkpoint: the file is there if the checkpoint
				// restored began after it was written.
				at, _ := time.Parse(time.RFC3339Nano, str(sb["checkpoint_at"]))
				if !a.wrote.IsZero() && !at.After(a.wrote) {
					want = "?"
				}
			}
			if err != nil || want != "?" && (out != want || code != 0) {
				t.Errorf("%s on %v: /tmp/f %q %d %v, want %q", a.id, sb["node"], out, code, err, want)
			}
		case st == "deleted" || st == "failed" || st == "lost":
			terminal++
			reasons[fmt.Sprint(st, ": ", str(sb["state_reason"]))]++
			if str(sb["state_reason"]) == "" {
				t.Errorf("%s is %s without a reason", a.id, st)
			}
			if _, ok := onVictim[a.id]; ok && a.checkpoint && str(sb["checkpoint"]) != "" {
				t.Errorf("checkpointed %s of killed %s not restarted: %v", a.id, victim.name, sb)
			}
		default:
			t.Errorf("%s ends %v: %v", a.id, st, sb)
		}
	}
	for id, sb := range c.list(s) {
		if sb["node"] == drained.name && (sb["state"] == "running" || sb["state"] == "paused") {
			if _, ok := dr.stayed[id]; !ok {
				t.Errorf("%s is %v on drained %s", id, sb["state"], drained.name)
			}
		}
	}
	restarted := 0
	for id, before := range onVictim {
		sb := c.mustCall(s, "GET", "/v1/sandboxes/"+id, nil)
		switch {
		case sb["state"] == "running" && sb["node"] != victim.name:
			restarted++
		case str(before["checkpoint"]) != "":
			t.Errorf("%s had checkpoint %s when %s was killed, ends %v: %v", id, before["checkpoint"], victim.name, sb["state"], sb["state_reason"])
		}
	}
	t.Logf("%d creates acknowledged: %d running, %d terminal; %d of the killed node's %d (%d with a checkpoint) restarted from checkpoints",
		len(acks), running, terminal, restarted, len(onVictim), withCkpt)
	for r, n := range reasons {
		t.Logf("%d× %s", n, r)
	}
	if len(acks) < clients*perClient/2 {
		t.Errorf("only %d of %d creates acknowledged", len(acks), clients*perClient)
	}
	// Clean up through the API; the killed node returns and removes its
	// old instances.
	parallel(len(acks), 8, func(i int) {
		if st, m := call(i, "DELETE", "/v1/sandboxes/"+acks[i].id, nil, ""); st == 202 {
			waitOp(opID(m), 60*time.Second)
		}
	})
	victim.start(t)
	deadline := time.Now().Add(30 * time.Second)
	for left := driverDirs(victim.dataDir, "sandboxes"); len(left) > 0; left = driverDirs(victim.dataDir, "sandboxes") {
		if time.Now().After(deadline) {
			t.Fatalf("old instances still on %s after it came back: %v", victim.name, left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitSettled polls a sandbox until it is running (on another node than
// notOn) or terminal; lost is final only without a checkpoint or once its
// restart was given up.
func waitSettled(t *testing.T, c *cluster, s *proc, id, notOn string, limit time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(limit)
	var sb map[string]any
	for time.Now().Before(deadline) {
		st, m, err := testenv.DoJSON("GET", s.addr["control"]+"/v1/sandboxes/"+id, map[string]string{"X-API-Key": c.key}, nil)
		if err == nil && st == 200 {
			sb = m
			switch m["state"] {
			case "running":
				if m["node"] != notOn {
					return m
				}
			case "lost":
				if str(m["checkpoint"]) == "" || strings.Contains(str(m["state_reason"]), "not restarted") {
					return m
				}
			case "deleted", "failed":
				return m
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("sandbox %s not settled after %v: %v", id, limit, sb)
	return nil
}
