// Package cohost checks that SPACE servers sharing one host stay out of
// each other's way (issue 22): overlapping egress pools, tables and
// interface prefixes are refused at start with an error naming both, and
// stopping, killing and restarting one server (its start-up sweep
// included) leaves the other's sandboxes running untouched.
//
// The package runs in a network namespace of its own (netnstest.Main), so
// its egress servers touch only links and tables it made.
package cohost

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/netns/netnstest"
	"github.com/space-sandbox/space/test/testenv"
	"github.com/vishvananda/netlink"
)

func TestMain(m *testing.M) { netnstest.Main(m) }

// server is one egress server of the test.
type server struct {
	*testenv.Server
	key string
}

func egressArgs(pool, prefix, table string) []string {
	return []string{"--builtins", "minimal", "--egress", "--egress-dns", "127.0.0.1:53",
		"--egress-pool", pool, "--egress-if-prefix", prefix, "--egress-table", table}
}

func newServer(t *testing.T, name string, args []string) *server {
	t.Helper()
	srv, err := testenv.New("space-cohost-" + name + "-")
	if err != nil {
		t.Fatal(err)
	}
	srv.Args = args
	s := &server{Server: srv}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- server %s log (tail) ----\n%s", name, srv.LogTail(6000))
		}
		if s.key != "" && srv.PID() != 0 {
			srv.DeleteSandboxes(s.key)
		}
		srv.Stop()
		srv.Remove()
	})
	return s
}

func (s *server) start(t *testing.T) {
	t.Helper()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if s.key == "" {
		k, err := s.CreateKey("p1")
		if err != nil {
			t.Fatal(err)
		}
		s.key = k
	}
	if err := s.WaitTemplate(s.key, "minimal", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// refused starts a server that must not start and returns its log.
func refused(t *testing.T, name string, args []string) string {
	t.Helper()
	s := newServer(t, name, args)
	if err := s.Start(); err == nil {
		t.Fatalf("server %s started with %v; want a refusal", name, args)
	}
	return s.LogTail(4000)
}

func TestServersShareAHost(t *testing.T) {
	netnstest.RequireRoot(t)
	if !netnstest.Inside() {
		t.Skip("runs only inside its private network namespace")
	}
	a := newServer(t, "a", egressArgs("10.241.0.0/24", "coa", "space-coa"))
	a.start(t)

	// Collisions are refused at start, naming both sides.
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"pool", egressArgs("10.241.0.0/16", "cob", "space-cob"), []string{"10.241.0.0/16", "10.241.0.0/24"}},
		{"table", egressArgs("10.242.0.0/24", "cob", "space-coa"), []string{`"space-coa"`}},
		{"prefix", egressArgs("10.242.0.0/24", "co", "space-cob"), []string{`"co"`, `"coa"`}},
	} {
		t.Run("refuse "+c.name, func(t *testing.T) {
			log := refused(t, "x"+c.name, c.args)
			for _, w := range append(c.want, "another SPACE server", a.DataDir) {
				if !strings.Contains(log, w) {
					t.Errorf("refusal does not name %q:\n%s", w, log)
				}
			}
		})
	}

	// A's sandboxes, one with a command that keeps running.
	var sbs []testenv.Sandbox
	for i := 0; i < 2; i++ {
		sb, err := a.CreateSandbox(a.key, nil)
		if err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, sb)
	}
	if _, code, err := sbs[0].Run("(while :; do date +%s%N >> /tmp/tick; sleep 0.1; done) >/dev/null 2>&1 &", "root"); err != nil || code != 0 {
		t.Fatalf("start ticker: %d %v", code, err)
	}
	pid1 := func(sb testenv.Sandbox) string {
		out, code, err := sb.Run("cut -d' ' -f22 /proc/1/stat", "root")
		if err != nil || code != 0 {
			t.Fatalf("%s: /proc/1/stat: %d %v", sb.ID, code, err)
		}
		return out
	}
	starts := []string{pid1(sbs[0]), pid1(sbs[1])}
	aLinks := links(t, "coa")
	if len(aLinks) != 2 {
		t.Fatalf("server A's veths: %v, want 2", aLinks)
	}

	// B, next to A: start, use, stop (SIGTERM), restart (its sweep runs),
	// kill -9, restart, stop.
	b := newServer(t, "b", egressArgs("10.242.0.0/24", "cob", "space-cob"))
	b.start(t)
	bsb, err := b.CreateSandbox(b.key, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.Stop()
	b.start(t)
	if _, code, err := bsb.Run("true", "root"); err != nil || code != 0 {
		t.Fatalf("B's sandbox after B's restart: %d %v", code, err)
	}
	b.Kill9()
	b.start(t)
	if _, code, err := bsb.Run("true", "root"); err != nil || code != 0 {
		t.Fatalf("B's sandbox after B's kill -9: %d %v", code, err)
	}
	b.DeleteSandboxes(b.key)
	b.Stop()

	// A never noticed.
	for i, sb := range sbs {
		st, m, err := testenv.DoJSON("GET", a.Ctrl+"/v1/sandboxes/"+sb.ID, map[string]string{"X-API-Key": a.key}, nil)
		if err != nil || st != 200 || m["state"] != "running" {
			t.Fatalf("A's sandbox %s after B's life: %d %v %v", sb.ID, st, m, err)
		}
		if now := pid1(sb); now != starts[i] {
			t.Errorf("A's sandbox %s has a new PID 1 (start time %s, was %s)", sb.ID, now, starts[i])
		}
	}
	before, _, _ := sbs[0].Run("wc -l < /tmp/tick", "root")
	time.Sleep(500 * time.Millisecond)
	after, _, _ := sbs[0].Run("wc -l < /tmp/tick", "root")
	if strings.TrimSpace(before) == strings.TrimSpace(after) {
		t.Errorf("A's background command stopped ticking (%s lines)", strings.TrimSpace(after))
	}
	if got := links(t, "coa"); strings.Join(got, ",") != strings.Join(aLinks, ",") {
		t.Errorf("A's veths changed: %v, were %v", got, aLinks)
	}
	for _, sb := range sbs {
		if cgs, _ := filepath.Glob("/sys/fs/cgroup/*/" + a.CgroupBase() + "/" + sb.ID); len(cgs) == 0 {
			if more, _ := filepath.Glob("/sys/fs/cgroup/*/*/*/" + a.CgroupBase() + "/" + sb.ID); len(more) == 0 {
				t.Errorf("A's sandbox %s has no cgroup left", sb.ID)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(a.DataDir, "space.db")); err != nil {
		t.Errorf("A's store: %v", err)
	}
}

// links lists the host's interfaces whose names start with prefix.
func links(t *testing.T, prefix string) []string {
	t.Helper()
	ls, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range ls {
		if strings.HasPrefix(l.Attrs().Name, prefix) {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}
