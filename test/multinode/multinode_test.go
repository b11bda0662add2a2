// Package multinode runs SPACE scaled out on one machine: PostgreSQL, two
// `space server --remote-nodes` replicas and three `space node` processes
// (each with its own data dir, run dir, cgroup base, uid range and ports),
// all real processes. It checks placement across nodes, that either replica
// serves every sandbox, that a node killed with SIGKILL has its sandboxes
// reported lost within the heartbeat timeout while the others keep
// working, and that a replica killed with SIGKILL leaves no operation
// running forever. The nodes share a snapshot store (S3, served in the
// test by gofakes3 on loopback): a hibernated sandbox of the killed node
// resumes on another node, and a snapshot taken there forks elsewhere.
package multinode

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/postgres"
	"github.com/space-sandbox/space/internal/store/postgres/pgtest"
	"github.com/space-sandbox/space/test/testenv"
)

const (
	nodeTimeout = 4 * time.Second
	sandboxes   = 60
)

// proc is one `space` process of the cluster.
type proc struct {
	name, bin, log, addrFile string
	dataDir                  string // nodes only
	args                     []string
	addr                     map[string]string
	cmd                      *exec.Cmd
	done                     chan struct{}
	// killed: the last run ended without a clean stop (SIGKILL), so it
	// did not tidy the host (empty cgroup parents, run dir); the sweep
	// starts it once more and stops it.
	killed bool
}

func (p *proc) start(t *testing.T) {
	t.Helper()
	os.Remove(p.addrFile)
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(p.bin, append(p.args, "--addr-file", p.addrFile)...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	p.done, p.killed = make(chan struct{}), false
	go func(c *exec.Cmd, done chan struct{}) { c.Wait(); f.Close(); close(done) }(p.cmd, p.done)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if raw, err := os.ReadFile(p.addrFile); err == nil && json.Unmarshal(raw, &p.addr) == nil {
			// A restart keeps the ports, as a real deployment would.
			for i := 0; i+1 < len(p.args); i++ {
				switch p.args[i] {
				case "--listen":
					p.args[i+1] = strings.TrimPrefix(strings.TrimPrefix(p.addr["rpc"]+p.addr["control"], "http://"), "https://")
				case "--data-listen":
					p.args[i+1] = strings.TrimPrefix(p.addr["data"], "http://")
				}
			}
			return
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited at start; log:\n%s", p.name, p.tail())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("%s did not start; log:\n%s", p.name, p.tail())
}

func (p *proc) signal(sig syscall.Signal) {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(sig)
	p.killed = sig == syscall.SIGKILL
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		p.killed = true
		<-p.done
	}
}

func (p *proc) tail() string {
	raw, _ := os.ReadFile(p.log)
	if len(raw) > 6000 {
		raw = raw[len(raw)-6000:]
	}
	return string(raw)
}

// boot gives the cluster's processes node-link certificates, starts the
// nodes then the servers, makes a key of project p1 and waits until every
// node has registered with the template (built once per uid range into the
// shared cache).
func (c *cluster) boot(t *testing.T, env *testenv.Server) {
	t.Helper()
	withLinkCerts(t, env.Bin, env.Work, c.nodes, c.servers)
	for _, p := range c.nodes {
		p.start(t)
	}
	for _, p := range c.servers {
		p.start(t)
	}
	out, err := exec.Command(env.Bin, "keys", "create", "--store", c.dsn, "--project", "p1").Output()
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	c.key = strings.TrimSpace(string(out))
	st, err := postgres.Open(context.Background(), c.dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	waitNodes(t, st, c.nodes)
}

type cluster struct {
	t       *testing.T
	dsn     string
	key     string
	nodes   []*proc
	servers []*proc
	dirs    []string // node data dirs (cgroup bases derive from them)
	runDirs []string
}

func (c *cluster) call(s *proc, method, path string, body any) (int, map[string]any) {
	st, m, err := testenv.DoJSON(method, s.addr["control"]+path, map[string]string{"X-API-Key": c.key}, body)
	if err != nil {
		c.t.Fatalf("%s %s on %s: %v", method, path, s.name, err)
	}
	return st, m
}

func (c *cluster) mustCall(s *proc, method, path string, body any) map[string]any {
	c.t.Helper()
	st, m := c.call(s, method, path, body)
	if st/100 != 2 {
		c.t.Fatalf("%s %s on %s: %d %v", method, path, s.name, st, m)
	}
	return m
}

// waitOp long-polls an operation on s until it is done.
func (c *cluster) waitOp(s *proc, id string, limit time.Duration) map[string]any {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		m := c.mustCall(s, "GET", "/v1/operations/"+id+"?wait=5s", nil)
		if st := m["state"]; st == "succeeded" || st == "failed" || st == "cancelled" {
			return m
		}
	}
	c.t.Fatalf("operation %s not done on %s after %v", id, s.name, limit)
	return nil
}

// list returns id → sandbox of every sandbox s lists.
func (c *cluster) list(s *proc) map[string]map[string]any {
	out := map[string]map[string]any{}
	m := c.mustCall(s, "GET", "/v1/sandboxes?limit=1000", nil)
	page, _ := m["sandboxes"].([]any)
	for _, x := range page {
		sb := x.(map[string]any)
		out[sb["id"].(string)] = sb
	}
	return out
}

// opID is the operation id of a 202 answer.
func opID(m map[string]any) string {
	op, _ := m["operation"].(map[string]any)
	id, _ := op["id"].(string)
	return id
}

// session asks s for a data-plane session of a sandbox.
func (c *cluster) session(s *proc, id string) (url, token string) {
	c.t.Helper()
	m := c.mustCall(s, "POST", "/v1/sandboxes/"+id+"/session", nil)
	return m["data_url"].(string), m["token"].(string)
}

// exec runs argv in a sandbox through its node's data plane and returns
// stdout and the exit code.
func exec1(dataURL, token, id string, argv ...string) (string, int, error) {
	hdr := map[string]string{"Authorization": "Bearer " + token}
	st, m, err := testenv.DoJSON("POST", dataURL+"/v1/sandboxes/"+id+"/commands", hdr, map[string]any{"argv": argv})
	if err != nil || st != 201 {
		return "", -1, fmt.Errorf("start command: %d %v %v", st, m, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", dataURL+"/v1/sandboxes/"+id+"/commands/"+m["id"].(string)+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", -1, err
	}
	defer resp.Body.Close()
	var out strings.Builder
	sc := bufio.NewScanner(resp.Body)
	ev := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			ev = line[7:]
		case strings.HasPrefix(line, "data: ") && (ev == "stdout" || ev == "stderr"):
			b, _ := base64.StdEncoding.DecodeString(line[6:])
			out.Write(b)
		case strings.HasPrefix(line, "data: ") && ev == "exit":
			var ex struct {
				ExitCode int `json:"exit_code"`
			}
			json.Unmarshal([]byte(line[6:]), &ex)
			return out.String(), ex.ExitCode, nil
		}
	}
	return out.String(), -1, fmt.Errorf("event stream ended without exit: %v", sc.Err())
}

func cgroupBase(dataDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(dataDir)))
	return "space-" + hex.EncodeToString(sum[:4])
}

// parallel runs fn(i) for i < n on w workers.
func parallel(n, w int, fn func(i int)) {
	var wg sync.WaitGroup
	ch := make(chan int)
	for k := 0; k < w; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ch {
				fn(i)
			}
		}()
	}
	for i := 0; i < n; i++ {
		ch <- i
	}
	close(ch)
	wg.Wait()
}

func TestMultiNode(t *testing.T) {
	if os.Getenv(pgtest.EnvDSN) == "" {
		t.Skipf("needs PostgreSQL: set %s (export %s=$(bash scripts/postgres.sh))", pgtest.EnvDSN, pgtest.EnvDSN)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (the namespace driver)")
	}
	began := time.Now()
	dsn := pgtest.FreshDSN(t)
	env, err := testenv.New("space-multinode")
	if err != nil {
		if env != nil {
			env.Remove()
		}
		t.Fatal(err)
	}
	c := &cluster{t: t, dsn: dsn}
	snapStore := sharedSnapshotStore(t)
	secret := filepath.Join(env.Work, "cluster-secret")
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte(hex.EncodeToString(raw)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Everything stops; a node restarted here sweeps the sandboxes it
		// lost, so nothing it ran survives the test.
		for _, p := range append(append([]*proc{}, c.servers...), c.nodes...) {
			t0 := time.Now()
			p.signal(syscall.SIGTERM)
			if d := time.Since(t0); d > 2*time.Second {
				t.Logf("%s took %v to stop", p.name, d.Round(time.Millisecond))
			}
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
	for i := 0; i < 3; i++ {
		dataDir := filepath.Join(env.Work, fmt.Sprintf("node%d", i+1))
		runDir, err := os.MkdirTemp("/tmp", "spn")
		if err != nil {
			t.Fatal(err)
		}
		c.runDirs = append(c.runDirs, runDir)
		c.dirs = append(c.dirs, dataDir)
		p := &proc{name: fmt.Sprintf("n%d", i+1), bin: env.Bin, log: filepath.Join(env.Work, fmt.Sprintf("node%d.log", i+1)),
			addrFile: filepath.Join(env.Work, fmt.Sprintf("node%d.addr", i+1)), dataDir: dataDir}
		p.args = []string{"node", "--name", p.name, "--store", dsn, "--driver", "namespace", "--data-dir", dataDir, "--run-dir", runDir,
			// Its own template dir: templates are uid-shifted for a node's
			// --uid-base, and a template dir maps each name to one tree.
			"--template-dir", filepath.Join(dataDir, "templates"), "--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0",
			"--uid-base", fmt.Sprint(100000 + i*65536*4), "--builtins", "minimal", "--cluster-secret-file", secret,
			"--heartbeat", "500ms", "--snapshot-store", snapStore}
		c.nodes = append(c.nodes, p)
	}
	for _, name := range []string{"srv-a", "srv-b"} {
		p := &proc{name: name, bin: env.Bin, log: filepath.Join(env.Work, name+".log"), addrFile: filepath.Join(env.Work, name+".addr")}
		p.args = []string{"server", "--remote-nodes", "--node-name", name, "--store", dsn, "--data-dir", filepath.Join(env.Work, name),
			"--listen", "127.0.0.1:0", "--cluster-secret-file", secret, "--node-timeout", nodeTimeout.String()}
		c.servers = append(c.servers, p)
	}
	c.boot(t, env)
	t.Logf("cluster up in %v", time.Since(began).Round(time.Millisecond))

	// 60 sandboxes, created through both replicas at once.
	type created struct {
		id, op, node, dataURL, token string
		via                          *proc
	}
	made := make([]created, sandboxes)
	t0 := time.Now()
	parallel(sandboxes, 8, func(i int) {
		via := c.servers[i%2]
		m := c.mustCall(via, "POST", "/v1/sandboxes", map[string]any{"template": "minimal",
			"limits": map[string]any{"memory_bytes": 32 << 20, "cpu_millis": 100, "pids": 64}})
		sb, sess := m["sandbox"].(map[string]any), m["session"].(map[string]any)
		made[i] = created{id: sb["id"].(string), op: m["operation"].(map[string]any)["id"].(string), node: sb["node"].(string),
			dataURL: sess["data_url"].(string), token: sess["token"].(string), via: via}
	})
	parallel(sandboxes, 8, func(i int) {
		if done := c.waitOp(made[i].via, made[i].op, 60*time.Second); done["state"] != "succeeded" {
			t.Errorf("create %s: %v", made[i].id, done)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d sandboxes running in %v", sandboxes, time.Since(t0).Round(time.Millisecond))
	perNode := map[string]int{}
	nodeData := map[string]string{}
	for _, p := range c.nodes {
		nodeData[p.name] = p.addr["data"]
	}
	for _, m := range made {
		perNode[m.node]++
		if m.dataURL != nodeData[m.node] {
			t.Fatalf("sandbox %s on %s: session data_url %s, want its node's %s", m.id, m.node, m.dataURL, nodeData[m.node])
		}
	}
	for _, p := range c.nodes {
		if perNode[p.name] == 0 {
			t.Fatalf("node %s got no sandbox: %v", p.name, perNode)
		}
	}
	t.Logf("placement: %v", perNode)

	// Either replica lists all 60, running; a session from either one
	// execs in any sandbox on its node.
	for _, s := range c.servers {
		all := c.list(s)
		for _, m := range made {
			if sb := all[m.id]; sb == nil || sb["state"] != "running" || sb["node"] != m.node {
				t.Fatalf("%s lists %s as %v", s.name, m.id, sb)
			}
		}
	}
	parallel(sandboxes, 8, func(i int) {
		other := c.servers[(i+1)%2] // not the replica that created it
		url, tok := c.session(other, made[i].id)
		if url != made[i].dataURL {
			t.Errorf("session of %s from %s names %s, want %s", made[i].id, other.name, url, made[i].dataURL)
		}
		out, code, err := exec1(url, tok, made[i].id, "sh", "-c", "echo $((6*7)) "+made[i].id)
		if err != nil || code != 0 || out != "42 "+made[i].id+"\n" {
			t.Errorf("exec in %s on %s: %q %d %v", made[i].id, made[i].node, out, code, err)
		}
	})
	// A data token of one sandbox opens no other sandbox, on any node.
	if _, _, err := exec1(made[1].dataURL, made[0].token, made[1].id, "true"); err == nil {
		t.Fatalf("sandbox %s's token worked for %s", made[0].id, made[1].id)
	}
	// Port forwarding on a node: a server started in a sandbox is reached
	// through its node's data listener with a signed URL that the other
	// replica mints, and not with another sandbox's token.
	fw := made[2]
	if _, code, err := exec1(fw.dataURL, fw.token, fw.id, "sh", "-c", "mkdir -p /tmp/w && echo on-"+fw.node+" > /tmp/w/index.html && busybox httpd -p 127.0.0.1:8080 -h /tmp/w"); err != nil || code != 0 {
		t.Fatalf("start httpd: %d %v", code, err)
	}
	signed := c.mustCall(c.servers[1], "POST", "/v1/sandboxes/"+fw.id+"/ports/8080/url", map[string]any{"ttl_seconds": 60})
	if pu := signed["path_url"].(string); !strings.HasPrefix(pu, fw.dataURL+"/v1/sandboxes/"+fw.id+"/ports/8080/") {
		t.Fatalf("signed path URL %s is not on the node's data listener %s", pu, fw.dataURL)
	}
	var page string
	for i := 0; i < 50; i++ {
		resp, err := http.Get(signed["path_url"].(string))
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if page = string(b); resp.StatusCode == 200 {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if page != "on-"+fw.node+"\n" {
		t.Fatalf("forwarded port on node %s: %q", fw.node, page)
	}
	req, _ := http.NewRequest("GET", fw.dataURL+"/v1/sandboxes/"+fw.id+"/ports/8080/", nil)
	req.Header.Set("X-Access-Token", made[3].token)
	if resp, err := http.DefaultClient.Do(req); err != nil || (resp.StatusCode != 404 && resp.StatusCode != 401) {
		t.Fatalf("another sandbox's token on the forwarded port: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if t.Failed() {
		t.FailNow()
	}
	// Lifecycle on either replica: pause on B, resume on A, delete on B,
	// whoever created it.
	pr := made[0]
	if done := c.waitOp(c.servers[1], opID(c.mustCall(c.servers[1], "POST", "/v1/sandboxes/"+pr.id+"/pause", nil)), 30*time.Second); done["state"] != "succeeded" {
		t.Fatalf("pause via B: %v", done)
	}
	if done := c.waitOp(c.servers[0], opID(c.mustCall(c.servers[0], "POST", "/v1/sandboxes/"+pr.id+"/resume", nil)), 30*time.Second); done["state"] != "succeeded" {
		t.Fatalf("resume via A: %v", done)
	}
	if out, code, err := exec1(pr.dataURL, pr.token, pr.id, "echo", "back"); err != nil || code != 0 || out != "back\n" {
		t.Fatalf("exec after resume: %q %d %v", out, code, err)
	}

	// Timeouts are reaped across nodes (by one replica); snapshots are not
	// offered with remote nodes and say so.
	m := c.mustCall(c.servers[1], "POST", "/v1/sandboxes", map[string]any{"template": "minimal", "timeout_seconds": 1,
		"limits": map[string]any{"memory_bytes": 32 << 20}})
	short := m["sandbox"].(map[string]any)["id"].(string)
	c.waitOp(c.servers[1], opID(m), 30*time.Second)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if sb := c.mustCall(c.servers[0], "GET", "/v1/sandboxes/"+short, nil); sb["state"] == "deleted" {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("sandbox with a 1 s timeout: %v", sb)
		}
	}
	// A snapshot through A, forks of it through B (on any node: the nodes
	// share the snapshot store, and forks spread by free capacity), a
	// hibernation through B woken through A (on its own node, which is up).
	if out, code, err := exec1(pr.dataURL, pr.token, pr.id, "sh", "-c", "mkdir -p /tmp && echo kept > /tmp/f"); err != nil || code != 0 {
		t.Fatalf("write before snapshot: %q %d %v", out, code, err)
	}
	m = c.mustCall(c.servers[0], "POST", "/v1/sandboxes/"+pr.id+"/snapshots", nil)
	snapID := m["snapshot"].(map[string]any)["id"].(string)
	if done := c.waitOp(c.servers[0], opID(m), 30*time.Second); done["state"] != "succeeded" {
		t.Fatalf("snapshot via A: %v", done)
	}
	m = c.mustCall(c.servers[1], "POST", "/v1/snapshots/"+snapID+"/fork", map[string]any{"count": 2, "limits": map[string]any{"memory_bytes": 32 << 20}})
	for _, x := range m["sandboxes"].([]any) {
		f := x.(map[string]any)
		fsb, sess := f["sandbox"].(map[string]any), f["session"].(map[string]any)
		if fsb["node"] == "" || fsb["node"] == nil {
			t.Fatalf("fork placed on no node: %v", fsb)
		}
		if done := c.waitOp(c.servers[1], opID(f), 30*time.Second); done["state"] != "succeeded" {
			t.Fatalf("fork via B: %v", done)
		}
		if out, code, err := exec1(sess["data_url"].(string), sess["token"].(string), fsb["id"].(string), "cat", "/tmp/f"); err != nil || code != 0 || out != "kept\n" {
			t.Fatalf("exec in fork: %q %d %v", out, code, err)
		}
		if done := c.waitOp(c.servers[0], opID(c.mustCall(c.servers[0], "DELETE", "/v1/sandboxes/"+fsb["id"].(string), nil)), 30*time.Second); done["state"] != "succeeded" {
			t.Fatalf("delete fork: %v", done)
		}
	}
	if done := c.waitOp(c.servers[1], opID(c.mustCall(c.servers[1], "POST", "/v1/sandboxes/"+pr.id+"/hibernate", nil)), 30*time.Second); done["state"] != "succeeded" {
		t.Fatalf("hibernate via B: %v", done)
	}
	if done := c.waitOp(c.servers[0], opID(c.mustCall(c.servers[0], "POST", "/v1/sandboxes/"+pr.id+"/resume", nil)), 30*time.Second); done["state"] != "succeeded" {
		t.Fatalf("wake via A: %v", done)
	}
	url, tok := c.session(c.servers[0], pr.id)
	if out, code, err := exec1(url, tok, pr.id, "cat", "/tmp/f"); err != nil || code != 0 || out != "kept\n" {
		t.Fatalf("exec after wake: %q %d %v", out, code, err)
	}

	// A node restarted within the timeout re-adopts its sandboxes: they
	// keep running and serving, nothing is reported lost.
	n1 := c.nodes[0]
	n1.signal(syscall.SIGTERM)
	n1.start(t)
	for _, mm := range made {
		if mm.node != n1.name {
			continue
		}
		url, tok := c.session(c.servers[0], mm.id)
		if out, code, err := exec1(url, tok, mm.id, "echo", "still"); err != nil || code != 0 || out != "still\n" {
			t.Fatalf("exec in %s after %s restarted: %q %d %v; log:\n%s", mm.id, n1.name, out, code, err, n1.tail())
		}
	}
	afterRestart := c.list(c.servers[1])
	for _, m := range made {
		if sb := afterRestart[m.id]; sb["state"] != "running" {
			t.Fatalf("after %s restarted, %s is %v", n1.name, m.id, sb["state"])
		}
	}

	// Before the kill: a sandbox of the victim node gets a file, a
	// snapshot (through A) and is hibernated (through B).
	victim := c.nodes[2]
	var hib created
	for _, mm := range made[6:] {
		if mm.node == victim.name {
			hib = mm
			break
		}
	}
	if hib.id == "" {
		t.Fatalf("no sandbox on %s to hibernate: %v", victim.name, perNode)
	}
	if out, code, err := exec1(hib.dataURL, hib.token, hib.id, "sh", "-c", "mkdir -p /tmp && echo travels > /tmp/h"); err != nil || code != 0 {
		t.Fatalf("write before hibernate: %q %d %v", out, code, err)
	}
	m = c.mustCall(c.servers[0], "POST", "/v1/sandboxes/"+hib.id+"/snapshots", nil)
	victimSnap := m["snapshot"].(map[string]any)["id"].(string)
	if done := c.waitOp(c.servers[0], opID(m), 30*time.Second); done["state"] != "succeeded" {
		t.Fatalf("snapshot on %s: %v", victim.name, done)
	}
	if done := c.waitOp(c.servers[1], opID(c.mustCall(c.servers[1], "POST", "/v1/sandboxes/"+hib.id+"/hibernate", nil)), 30*time.Second); done["state"] != "succeeded" {
		t.Fatalf("hibernate on %s: %v", victim.name, done)
	}

	// kill -9 one node: its sandboxes are lost within the timeout (plus a
	// check interval), its hibernated one stays hibernated, the others
	// keep working.
	killedAt := time.Now()
	victim.signal(syscall.SIGKILL)
	for {
		all := c.list(c.servers[0])
		lost, other := 0, 0
		for _, m := range made {
			sb := all[m.id]
			if m.id == hib.id {
				if sb["state"] != "hibernated" {
					t.Fatalf("hibernated sandbox %s of the killed node is %v", m.id, sb["state"])
				}
				continue
			}
			if m.node == victim.name {
				if sb["state"] == "lost" {
					lost++
					if r, _ := sb["state_reason"].(string); !strings.Contains(r, "stopped heartbeating") {
						t.Fatalf("lost sandbox %s reason %q", m.id, r)
					}
				}
			} else if sb["state"] == "running" {
				other++
			}
		}
		if lost == perNode[victim.name]-1 {
			if other != sandboxes-perNode[victim.name] {
				t.Fatalf("after %s was lost, %d of %d other sandboxes run", victim.name, other, sandboxes-perNode[victim.name])
			}
			t.Logf("node %s killed: its %d sandboxes lost after %v", victim.name, lost, time.Since(killedAt).Round(time.Millisecond))
			break
		}
		if time.Since(killedAt) > nodeTimeout+3*time.Second {
			t.Fatalf("%d of %d sandboxes of %s lost %v after the kill", lost, perNode[victim.name], victim.name, time.Since(killedAt))
		}
		time.Sleep(200 * time.Millisecond)
	}
	parallel(sandboxes, 8, func(i int) {
		if made[i].node == victim.name {
			return
		}
		if out, code, err := exec1(made[i].dataURL, made[i].token, made[i].id, "echo", "ok"); err != nil || code != 0 || out != "ok\n" {
			t.Errorf("exec in %s on %s after %s died: %q %d %v", made[i].id, made[i].node, victim.name, out, code, err)
		}
	})
	// The hibernated sandbox resumes (through A) on another node, from the
	// shared snapshot store, with its files; the snapshot taken on the
	// killed node forks (through B) on another node too.
	t0 = time.Now()
	if done := c.waitOp(c.servers[0], opID(c.mustCall(c.servers[0], "POST", "/v1/sandboxes/"+hib.id+"/resume", nil)), 30*time.Second); done["state"] != "succeeded" {
		t.Fatalf("resume of %s after its node died: %v", hib.id, done)
	}
	woken := c.mustCall(c.servers[1], "GET", "/v1/sandboxes/"+hib.id, nil)
	if woken["state"] != "running" || woken["node"] == victim.name || woken["node"] == "" {
		t.Fatalf("after the resume %s is %v on %v", hib.id, woken["state"], woken["node"])
	}
	url, tok = c.session(c.servers[1], hib.id)
	if url != nodeData[woken["node"].(string)] {
		t.Fatalf("session of the moved sandbox names %s, its node %v serves %s", url, woken["node"], nodeData[woken["node"].(string)])
	}
	if out, code, err := exec1(url, tok, hib.id, "cat", "/tmp/h"); err != nil || code != 0 || out != "travels\n" {
		t.Fatalf("exec in %s after it moved to %v: %q %d %v", hib.id, woken["node"], out, code, err)
	}
	t.Logf("hibernated sandbox of killed %s resumed on %v in %v", victim.name, woken["node"], time.Since(t0).Round(time.Millisecond))
	m = c.mustCall(c.servers[1], "POST", "/v1/snapshots/"+victimSnap+"/fork", map[string]any{"limits": map[string]any{"memory_bytes": 32 << 20}})
	for _, x := range m["sandboxes"].([]any) {
		f := x.(map[string]any)
		fsb, sess := f["sandbox"].(map[string]any), f["session"].(map[string]any)
		if fsb["node"] == victim.name {
			t.Fatalf("fork placed on lost node %s", victim.name)
		}
		if done := c.waitOp(c.servers[1], opID(f), 30*time.Second); done["state"] != "succeeded" {
			t.Fatalf("fork of a snapshot of killed %s: %v", victim.name, done)
		}
		if out, code, err := exec1(sess["data_url"].(string), sess["token"].(string), fsb["id"].(string), "cat", "/tmp/h"); err != nil || code != 0 || out != "travels\n" {
			t.Fatalf("exec in fork on %v: %q %d %v", fsb["node"], out, code, err)
		}
		if done := c.waitOp(c.servers[0], opID(c.mustCall(c.servers[0], "DELETE", "/v1/sandboxes/"+fsb["id"].(string), nil)), 30*time.Second); done["state"] != "succeeded" {
			t.Fatalf("delete fork: %v", done)
		}
	}

	// New sandboxes avoid the lost node.
	m = c.mustCall(c.servers[0], "POST", "/v1/sandboxes", map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 32 << 20}})
	if n := m["sandbox"].(map[string]any)["node"]; n == victim.name {
		t.Fatalf("a sandbox was placed on lost node %s", n)
	}
	c.waitOp(c.servers[0], m["operation"].(map[string]any)["id"].(string), 30*time.Second)

	// kill -9 one replica with operations in flight: the other finishes
	// or fails every one of them, and serves every operation itself.
	b, a := c.servers[1], c.servers[0]
	var inflight []string
	var mu sync.Mutex
	parallel(6, 6, func(i int) {
		st, m := c.call(b, "POST", "/v1/sandboxes", map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 32 << 20}})
		if st == 202 {
			mu.Lock()
			inflight = append(inflight, m["operation"].(map[string]any)["id"].(string))
			mu.Unlock()
		}
	})
	for _, mm := range made[2:6] {
		if mm.node == victim.name {
			continue
		}
		if st, m := c.call(b, "DELETE", "/v1/sandboxes/"+mm.id, nil); st == 202 {
			inflight = append(inflight, opID(m))
		}
	}
	b.signal(syscall.SIGKILL)
	killedAt = time.Now()
	for _, id := range inflight {
		done := c.waitOp(a, id, nodeTimeout+20*time.Second)
		target := done["target"].(string)
		sb := c.mustCall(a, "GET", "/v1/sandboxes/"+target, nil)
		switch {
		case done["state"] == "succeeded" && (sb["state"] == "running" || sb["state"] == "deleted"):
		case done["state"] == "failed" && sb["state"] != "creating" && sb["state"] != "deleting":
		default:
			t.Fatalf("operation %s after replica %s died: %v; sandbox %v", id, b.name, done, sb)
		}
	}
	t.Logf("replica %s killed: its %d in-flight operations settled within %v", b.name, len(inflight), time.Since(killedAt).Round(time.Millisecond))
	// A serves sandboxes B created: exec, delete.
	for _, mm := range made[6:] {
		if mm.via != b || mm.node == victim.name {
			continue
		}
		url, tok := c.session(a, mm.id)
		if out, code, err := exec1(url, tok, mm.id, "echo", "a"); err != nil || code != 0 || out != "a\n" {
			t.Fatalf("exec in B's sandbox %s via A: %q %d %v", mm.id, out, code, err)
		}
		if done := c.waitOp(a, opID(c.mustCall(a, "DELETE", "/v1/sandboxes/"+mm.id, nil)), 30*time.Second); done["state"] != "succeeded" {
			t.Fatalf("delete of B's sandbox via A: %v", done)
		}
		break
	}

	// Clean up through A: delete what runs, then restart the lost node,
	// which sweeps the sandboxes it had been running.
	all := c.list(a)
	var ops []string
	for id, sb := range all {
		if s := sb["state"]; s == "running" || s == "paused" {
			if st, m := c.call(a, "DELETE", "/v1/sandboxes/"+id, nil); st == 202 {
				ops = append(ops, opID(m))
			}
		}
	}
	parallel(len(ops), 8, func(i int) {
		if done := c.waitOp(a, ops[i], 60*time.Second); done["state"] != "succeeded" {
			t.Errorf("cleanup delete: %v", done)
		}
	})
	victim.start(t)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		entries, _ := os.ReadDir(filepath.Join(c.dirs[2], "sandboxes"))
		if len(entries) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("total %v", time.Since(began).Round(time.Millisecond))
	if t.Failed() {
		for _, p := range append(c.servers, c.nodes...) {
			t.Logf("%s log:\n%s", p.name, p.tail())
		}
	}
}

// sweep removes what a failed test left behind (and fails a test that
// passed but leaked): every live sandbox is marked deleted in the store
// and each node with sandboxes left is started once more, so its start-up
// reconciliation removes them, then stopped.
func sweep(t *testing.T, dsn string, nodes []*proc) {
	failed := t.Failed()
	ctx := context.Background()
	st, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Errorf("sweep: %v", err)
		return
	}
	defer st.Close()
	live, err := st.ListSandboxes(ctx, core.SandboxFilter{Limit: 1000,
		States: []core.SandboxState{core.SandboxCreating, core.SandboxRunning, core.SandboxPaused, core.SandboxDeleting}})
	if err != nil {
		t.Errorf("sweep: %v", err)
		return
	}
	for _, sb := range live {
		st.UpdateSandbox(ctx, sb.ID, func(cur *core.Sandbox) error { cur.State = core.SandboxDeleted; return nil })
	}
	for _, p := range nodes {
		// Both drivers' instance dirs: a gVisor fleet's sandboxes leaked
		// (runsc kept running after the test) when only the namespace
		// driver's were looked at.
		left := append(driverDirs(p.dataDir, "sandboxes"), driverDirs(p.dataDir, "gvisor")...)
		if p.cmd == nil || len(left) == 0 && !p.killed {
			continue
		}
		for _, id := range left {
			sb, err := st.GetSandbox(ctx, "", id)
			if !failed {
				// The test cleaned up through the API: anything left leaked.
				t.Errorf("sandbox %s leaked on %s (its record: %s %q %v)", id, p.name, sb.State, sb.StateReason, err)
			}
		}
		if len(left) > 0 {
			t.Logf("sweep: restarting %s to remove %d leftover sandboxes", p.name, len(left))
		} else {
			t.Logf("sweep: restarting %s, killed in the test, so that its stop tidies the host", p.name)
		}
		os.Remove(p.addrFile)
		f, _ := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		cmd := exec.Command(p.bin, append(p.args, "--addr-file", p.addrFile)...)
		cmd.Stdout, cmd.Stderr = f, f
		if err := cmd.Start(); err != nil {
			f.Close()
			continue
		}
		for i := 0; i < 300; i++ {
			if _, err := os.Stat(p.addrFile); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		f.Close()
	}
}

// waitNodes waits until every node has a fresh heartbeat listing minimal.
func waitNodes(t *testing.T, st core.NodeStore, nodes []*proc) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		list, err := st.ListNodes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ready := 0
		for _, n := range list {
			for _, tpl := range n.Templates {
				if n.Kind == core.NodeKindNode && n.State == core.NodeReady && tpl == "minimal" {
					ready++
				}
			}
		}
		if ready == len(nodes) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, p := range nodes {
		t.Logf("%s log:\n%s", p.name, p.tail())
	}
	t.Fatal("nodes did not all register with template minimal")
}

// leftovers checks that no node left a sandbox directory, a mount under
// its data dir or a sandbox cgroup, and removes the (empty) cgroup bases.
func leftovers(t *testing.T, dirs []string) {
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, d := range dirs {
		if strings.Contains(string(mounts), d) {
			t.Errorf("a mount under %s is left", d)
		}
		if entries, _ := os.ReadDir(filepath.Join(d, "sandboxes")); len(entries) > 0 {
			t.Errorf("%d sandbox directories left in %s", len(entries), d)
		}
		base := cgroupBase(d)
		groups, _ := filepath.Glob("/sys/fs/cgroup/*/" + base)
		more, _ := filepath.Glob("/sys/fs/cgroup/*/*/*/" + base)
		for _, g := range append(groups, more...) {
			if kids, _ := filepath.Glob(g + "/*/"); len(kids) > 0 {
				for _, k := range kids {
					if fi, err := os.Stat(k); err == nil && fi.IsDir() {
						t.Errorf("cgroup %s is left", k)
					}
				}
			}
			os.Remove(g)
		}
	}
}
