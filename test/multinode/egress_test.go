package multinode

// TestMultiNodeEgress: sandbox networks with remote nodes. Two `space node
// --egress` processes (each its own pool, veth prefix and nftables table)
// and one node without egress, behind two `space server --remote-nodes`
// replicas, all inside a network namespace this test makes (the test
// re-executes itself in it), with a fake upstream world in a second
// namespace behind a veth: a resolver and two web servers, allowed.test
// and denied.test, on addresses the gateway treats as public. Checked:
// allowlisted sandboxes are placed on the egress nodes (one each), reach
// allowed.test through their node's gateway and are denied denied.test;
// a policy changed through the other replica takes effect; the decision
// log reads the same through either replica, and live (SSE); blocked
// sandboxes (on the plain node, and on an egress node after a policy
// change) reach nothing; a network for a sandbox of the plain node is
// 503 and not stored; a node restarted within the timeout re-adopts its
// sandbox with its policy.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/internal/store/postgres"
	"github.com/space-sandbox/space/internal/store/postgres/pgtest"
	"github.com/space-sandbox/space/test/testenv"
)

// The fake upstream world (addresses outside every reserved range, so the
// gateway dials them; they exist only inside the test's namespaces).
const (
	wanDNS     = "11.0.0.53"
	allowedIP  = "11.0.0.10"
	deniedIP   = "11.0.0.20"
	uplinkHost = "192.0.2.1"
	uplinkWan  = "192.0.2.254"
)

const innerNetnsEnv = "SPACE_TEST_PRIVATE_NETNS" // as netnstest

func TestMultiNodeEgress(t *testing.T) {
	if !inPrivateNetns(t) {
		return
	}
	began := time.Now()
	w := startUpstreams(t)
	defer w.close()
	dsn := pgtest.FreshDSN(t)
	env, err := testenv.New("space-mnegress")
	if err != nil {
		if env != nil {
			env.Remove()
		}
		t.Fatal(err)
	}
	fetcher := buildFetcher(t, env.Work)
	c, secret := newFrame(t, env, dsn)
	for i := 0; i < 3; i++ {
		dataDir := filepath.Join(env.Work, fmt.Sprintf("node%d", i+1))
		runDir, err := os.MkdirTemp("/tmp", "spe")
		if err != nil {
			t.Fatal(err)
		}
		c.runDirs = append(c.runDirs, runDir)
		c.dirs = append(c.dirs, dataDir)
		name := fmt.Sprintf("e%d", i+1)
		if i == 2 {
			name = "plain3"
		}
		p := &proc{name: name, bin: env.Bin, log: filepath.Join(env.Work, fmt.Sprintf("node%d.log", i+1)),
			addrFile: filepath.Join(env.Work, fmt.Sprintf("node%d.addr", i+1)), dataDir: dataDir}
		p.args = []string{"node", "--name", p.name, "--store", dsn, "--driver", "namespace", "--data-dir", dataDir, "--run-dir", runDir,
			"--template-dir", filepath.Join(dataDir, "templates"), "--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0",
			"--uid-base", fmt.Sprint(100000 + i*65536*4), "--builtins", "minimal", "--cluster-secret-file", secret,
			"--heartbeat", "500ms"}
		if i < 2 {
			// Several nodes on one host: each its own pool, names and table.
			p.args = append(p.args, "--egress", "--egress-pool", fmt.Sprintf("10.%d.0.0/24", 210+i), "--egress-if-prefix", fmt.Sprintf("mne%d", i+1),
				"--egress-table", fmt.Sprintf("space-mne%d", i+1), "--egress-dns", wanDNS)
		} else {
			// No egress, and the most memory: blocked sandboxes go here.
			p.args = append(p.args, "--memory-bytes", fmt.Sprint(int64(1)<<40))
		}
		c.nodes = append(c.nodes, p)
	}
	for _, name := range []string{"srv-a", "srv-b"} {
		p := &proc{name: name, bin: env.Bin, log: filepath.Join(env.Work, name+".log"), addrFile: filepath.Join(env.Work, name+".addr")}
		p.args = []string{"server", "--remote-nodes", "--node-name", name, "--store", dsn, "--data-dir", filepath.Join(env.Work, name),
			"--listen", "127.0.0.1:0", "--cluster-secret-file", secret, "--node-timeout", nodeTimeout.String()}
		c.servers = append(c.servers, p)
	}
	withLinkCerts(t, env.Bin, env.Work, c.nodes, c.servers)
	for _, p := range c.nodes {
		p.start(t)
	}
	for _, p := range c.servers {
		p.start(t)
	}
	c.apiKey(env.Bin)
	st, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	waitNodes(t, st, c.nodes)
	nodes, _ := st.ListNodes(context.Background())
	for _, n := range nodes {
		if n.Kind == "node" && n.Egress != (n.Name != "plain3") {
			t.Fatalf("node %s advertises egress %v", n.Name, n.Egress)
		}
	}
	t.Logf("cluster up in %v", time.Since(began).Round(time.Millisecond))
	a, b := c.servers[0], c.servers[1]
	if m := c.mustCall(b, "GET", "/v1/info", nil); m["egress"] != true {
		t.Fatalf("%s: /v1/info %v, want egress true", b.name, m)
	}

	// Two allowlisted sandboxes: the scheduler spreads them over the two
	// nodes (a replica counts its own placements until heartbeats do).
	allow := map[string]any{"mode": "allowlist", "allow": []string{"allowed.test:80"}}
	type sbx struct{ id, node, url, tok string }
	create := func(via *proc, network map[string]any) sbx {
		t.Helper()
		body := map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 64 << 20}}
		if network != nil {
			body["network"] = network
		}
		m := c.mustCall(via, "POST", "/v1/sandboxes", body)
		sb, sess := m["sandbox"].(map[string]any), m["session"].(map[string]any)
		if done := c.waitOp(via, opID(m), 60*time.Second); done["state"] != "succeeded" {
			t.Fatalf("create via %s: %v", via.name, done)
		}
		s := sbx{id: sb["id"].(string), node: sb["node"].(string), url: sess["data_url"].(string), tok: sess["token"].(string)}
		upload(t, s.url, s.tok, s.id, "/tmp/mnfetch", fetcher)
		return s
	}
	s1 := create(a, allow)
	s2 := create(a, allow)
	t.Logf("allowlisted sandboxes on %s and %s", s1.node, s2.node)
	if s1.node == s2.node || !strings.HasPrefix(s1.node, "e") || !strings.HasPrefix(s2.node, "e") {
		t.Fatalf("allowlisted sandboxes on %s and %s, want e1 and e2", s1.node, s2.node)
	}
	fetch := func(s sbx, host string) (string, bool) {
		t.Helper()
		out, code, err := exec1(s.url, s.tok, s.id, "/tmp/mnfetch", "http://"+host+"/")
		if err != nil {
			t.Fatalf("exec in %s: %v", s.id, err)
		}
		return out, code == 0
	}
	for _, s := range []sbx{s1, s2} {
		if out, ok := fetch(s, "allowed.test"); !ok || out != "hello from allowed.test\n" {
			t.Fatalf("%s on %s: allowed.test: %q %v", s.id, s.node, out, ok)
		}
		if out, ok := fetch(s, "denied.test"); ok || strings.Contains(out, "hello") {
			t.Fatalf("%s on %s: denied.test was reached: %q", s.id, s.node, out)
		}
	}
	if w.hits(deniedIP) != 0 {
		t.Fatalf("denied.test saw %d requests", w.hits(deniedIP))
	}

	// The policy of s1 (created through A) changed through B: now only
	// denied.test.
	c.mustCall(b, "PUT", "/v1/sandboxes/"+s1.id+"/network", map[string]any{"mode": "allowlist", "allow": []string{"denied.test:80"}})
	if out, ok := fetch(s1, "denied.test"); !ok || out != "hello from denied.test\n" {
		t.Fatalf("after the change through %s: denied.test: %q %v", b.name, out, ok)
	}
	if out, ok := fetch(s1, "allowed.test"); ok || strings.Contains(out, "hello") {
		t.Fatalf("after the change: allowed.test still reached: %q", out)
	}
	if m := c.mustCall(a, "GET", "/v1/sandboxes/"+s1.id, nil); !strings.Contains(fmt.Sprint(m["network"]), "denied.test") {
		t.Fatalf("%s shows the policy %v", a.name, m["network"])
	}

	// The decision log, through either replica: both names, allowed and denied.
	for _, via := range []*proc{a, b} {
		m := c.mustCall(via, "GET", "/v1/sandboxes/"+s1.id+"/network/log", nil)
		ds, _ := m["decisions"].([]any)
		seen := map[string]bool{}
		for _, x := range ds {
			d := x.(map[string]any)
			name, _ := d["name"].(string)
			verdict, _ := d["verdict"].(string)
			seen[name+" "+verdict] = true
		}
		for _, want := range []string{"allowed.test allow", "denied.test deny", "denied.test allow", "allowed.test deny"} {
			if !seen[want] {
				t.Fatalf("log of %s through %s lacks %q: %v", s1.id, via.name, want, seen)
			}
		}
	}

	// The live log (SSE) through B sees a decision made after it opened.
	m := c.mustCall(a, "GET", "/v1/sandboxes/"+s1.id+"/network/log", nil)
	ds, _ := m["decisions"].([]any)
	last := ds[len(ds)-1].(map[string]any)["seq"].(float64)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/v1/sandboxes/%s/network/log?after=%d", b.addr["control"], s1.id, int64(last)), nil)
	req.Header.Set("X-API-Key", c.key)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("follow the log through %s: %v %v", b.name, resp, err)
	}
	if _, ok := fetch(s1, "denied.test"); !ok {
		t.Fatal("denied.test (allowed now) not reached")
	}
	sc := bufio.NewScanner(resp.Body)
	live := false
	for !live && sc.Scan() {
		live = strings.HasPrefix(sc.Text(), "data: ") && strings.Contains(sc.Text(), `"denied.test"`) && strings.Contains(sc.Text(), `"allow"`)
	}
	resp.Body.Close()
	if !live {
		t.Fatalf("the live log through %s did not show the new decision: %v", b.name, sc.Err())
	}

	// Blocked sandboxes reach nothing, not by name, not by address: one
	// (the default policy) on the node without egress, and s2 on its
	// egress node once its policy is set to blocked through B.
	s3 := create(b, nil)
	if s3.node != "plain3" {
		t.Fatalf("blocked sandbox on %s, want plain3 (most free memory)", s3.node)
	}
	c.mustCall(b, "PUT", "/v1/sandboxes/"+s2.id+"/network", map[string]any{"mode": "blocked"})
	before := w.hits(allowedIP) + w.hits(deniedIP)
	for _, s := range []sbx{s3, s2} {
		for _, target := range []string{"allowed.test", allowedIP} {
			if out, ok := fetch(s, target); ok || strings.Contains(out, "hello") {
				t.Fatalf("blocked sandbox on %s reached %s: %q", s.node, target, out)
			}
		}
	}
	if w.hits(allowedIP)+w.hits(deniedIP) != before {
		t.Fatal("the upstream saw a request from a blocked sandbox")
	}
	// A network for the sandbox of the node without egress: 503, and its
	// record keeps the blocked policy.
	if st, m := c.call(a, "PUT", "/v1/sandboxes/"+s3.id+"/network", allow); st != http.StatusServiceUnavailable {
		t.Fatalf("allowlist on plain3: %d %v, want 503", st, m)
	}
	if m := c.mustCall(b, "GET", "/v1/sandboxes/"+s3.id, nil); strings.Contains(fmt.Sprint(m["network"]), "allowlist") {
		t.Fatalf("the refused policy was stored: %v", m["network"])
	}
	// s1's node restarted within the timeout re-adopts it with its policy.
	for _, p := range c.nodes {
		if p.name == s1.node {
			p.signal(syscall.SIGTERM)
			p.start(t)
		}
	}
	if out, ok := fetch(s1, "denied.test"); !ok || out != "hello from denied.test\n" {
		t.Fatalf("after %s restarted: denied.test (allowed): %q %v", s1.node, out, ok)
	}
	if out, ok := fetch(s1, "allowed.test"); ok || strings.Contains(out, "hello") {
		t.Fatalf("after %s restarted: allowed.test reached: %q", s1.node, out)
	}
	for _, s := range []sbx{s1, s2, s3} {
		if done := c.waitOp(a, opID(c.mustCall(a, "DELETE", "/v1/sandboxes/"+s.id, nil)), 30*time.Second); done["state"] != "succeeded" {
			t.Fatalf("delete %s: %v", s.id, done)
		}
	}
	t.Logf("done in %v", time.Since(began).Round(time.Millisecond))
}

// reexecInNetns runs this one test again in a new network namespace; the
// database is reached through its unix socket (the namespace has no
// route to the host's loopback).
func reexecInNetns(t *testing.T) {
	dsn := os.Getenv(pgtest.EnvDSN)
	u, err := url.Parse(dsn)
	if err != nil || u.Port() == "" {
		t.Skipf("cannot rewrite %s for a unix socket", dsn)
	}
	sockDir := os.Getenv("SPACE_PG_DIR")
	if sockDir == "" {
		sockDir = "/tmp/space-pg"
	}
	if _, err := os.Stat(filepath.Join(sockDir, ".s.PGSQL."+u.Port())); err != nil {
		t.Skipf("the egress cluster runs in its own network namespace and needs PostgreSQL's unix socket: %v", err)
	}
	q := u.Query()
	q.Set("host", sockDir)
	q.Set("port", u.Port())
	u.Host = ""
	u.RawQuery = q.Encode()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run", "^"+t.Name()+"$", "-test.v", "-test.count", "1")
	cmd.Env = append(os.Environ(), innerNetnsEnv+"=1", pgtest.EnvDSN+"="+u.String())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	t.Logf("in a private network namespace:\n%s", out)
	if err != nil {
		t.Fatalf("%s in its namespace: %v", t.Name(), err)
	}
	if strings.Contains(string(out), "--- SKIP") {
		t.Skip("skipped in its namespace")
	}
}

// upstreams is the fake world: its namespace and servers.
type upstreams struct {
	ns      vns.NsHandle
	closers []func()
	reqs    chan string
	count   map[string]int
}

func (w *upstreams) hits(ip string) int {
	for {
		select {
		case a := <-w.reqs:
			w.count[a]++
		default:
			return w.count[ip]
		}
	}
}

func (w *upstreams) close() {
	for _, f := range w.closers {
		f()
	}
	w.ns.Close()
}

// startUpstreams makes the "wan" namespace (a resolver and two web
// servers on its loopback) and its veth to this namespace, the default
// route of which it becomes.
func startUpstreams(t *testing.T) *upstreams {
	t.Helper()
	w := &upstreams{reqs: make(chan string, 1000), count: map[string]int{}}
	err := func() error {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		host, err := vns.Get()
		if err != nil {
			return err
		}
		defer host.Close()
		if w.ns, err = vns.New(); err != nil {
			return err
		}
		defer vns.Set(host)
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		netlink.LinkSetUp(lo)
		for _, a := range []string{wanDNS, allowedIP, deniedIP} {
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(a).To4(), Mask: net.CIDRMask(32, 32)}}); err != nil {
				return err
			}
		}
		pc, err := net.ListenPacket("udp4", wanDNS+":53")
		if err != nil {
			return err
		}
		w.closers = append(w.closers, func() { pc.Close() })
		go testenv.ServeDNS(pc, map[string]string{"allowed.test.": allowedIP, "denied.test.": deniedIP})
		for ip, name := range map[string]string{allowedIP: "allowed.test", deniedIP: "denied.test"} {
			ln, err := net.Listen("tcp4", ip+":80")
			if err != nil {
				return err
			}
			ip, name := ip, name
			srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				w.reqs <- ip
				fmt.Fprintf(rw, "hello from %s\n", name)
			}), ReadHeaderTimeout: 5 * time.Second}
			go srv.Serve(ln)
			w.closers = append(w.closers, func() { srv.Close() })
		}
		return nil
	}()
	if err != nil {
		t.Fatalf("upstream namespace: %v", err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "mneup0"}, PeerName: "mnewan0", PeerNamespace: netlink.NsFd(int(w.ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	up, err := netlink.LinkByName("mneup0")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(up, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(uplinkHost).To4(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(up); err != nil {
		t.Fatal(err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: net.ParseIP(uplinkWan).To4()}); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(w.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	peer, err := h.LinkByName("mnewan0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(peer, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(uplinkWan).To4(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(peer); err != nil {
		t.Fatal(err)
	}
	return w
}

// upload copies a local file into a sandbox (mode 0755) through its node's
// data plane.
func upload(t *testing.T, dataURL, token, id, path, local string) {
	t.Helper()
	if err := (testenv.Sandbox{ID: id, Token: token, Data: dataURL}).Upload(path, local); err != nil {
		t.Fatal(err)
	}
}
