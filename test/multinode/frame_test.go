package multinode

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/space-sandbox/space/internal/netns/netnstest"
	"github.com/space-sandbox/space/internal/store/postgres/pgtest"
	"github.com/space-sandbox/space/test/testenv"
	"github.com/vishvananda/netlink"
)

// newFrame is the frame of a cluster test: a cluster on dsn, its cluster
// secret (a file under env.Work, returned), and the cleanup that stops
// every process, sweeps what is left and keeps the logs of a failed test.
func newFrame(t *testing.T, env *testenv.Server, dsn string) (*cluster, string) {
	t.Helper()
	c := &cluster{t: t, dsn: dsn}
	secret := filepath.Join(env.Work, "cluster-secret")
	raw := make([]byte, 32)
	rand.Read(raw)
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
	return c, secret
}

// apiKey creates the test's API key (project p1) in the cluster's store.
func (c *cluster) apiKey(bin string) {
	c.t.Helper()
	out, err := exec.Command(bin, "keys", "create", "--store", c.dsn, "--project", "p1").Output()
	if err != nil {
		c.t.Fatalf("keys create: %v", err)
	}
	c.key = strings.TrimSpace(string(out))
}

// inPrivateNetns runs the test again in a network namespace of its own
// (and reports false: the caller returns) unless it is already there; it
// skips without PostgreSQL or root.
func inPrivateNetns(t *testing.T) bool {
	t.Helper()
	if os.Getenv(pgtest.EnvDSN) == "" {
		t.Skipf("needs PostgreSQL: set %s (export %s=$(bash scripts/postgres.sh))", pgtest.EnvDSN, pgtest.EnvDSN)
	}
	netnstest.RequireRoot(t)
	if !netnstest.Inside() {
		reexecInNetns(t)
		return false
	}
	if lo, err := netlink.LinkByName("lo"); err == nil {
		netlink.LinkSetUp(lo)
	}
	return true
}

// buildFetcher builds mnfetch, the HTTP client copied into sandboxes.
func buildFetcher(t *testing.T, dir string) string {
	t.Helper()
	fetcher := filepath.Join(dir, "mnfetch")
	build := exec.Command("go", "build", "-ldflags", "-s -w", "-o", fetcher, "./test/multinode/mnfetch")
	build.Dir = testenv.RepoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build mnfetch: %v\n%s", err, out)
	}
	return fetcher
}

// addNode adds a `space node` named name (namespace driver, template
// minimal, its own data, run and template dirs, uid range i, heartbeats
// every 500 ms) with extra flags.
func (c *cluster) addNode(env *testenv.Server, secret string, i int, name string, extra ...string) *proc {
	c.t.Helper()
	dataDir := filepath.Join(env.Work, name)
	runDir, err := os.MkdirTemp("/tmp", "spn")
	if err != nil {
		c.t.Fatal(err)
	}
	c.runDirs = append(c.runDirs, runDir)
	c.dirs = append(c.dirs, dataDir)
	p := &proc{name: name, bin: env.Bin, log: filepath.Join(env.Work, name+".log"), addrFile: filepath.Join(env.Work, name+".addr"), dataDir: dataDir}
	p.args = append([]string{"node", "--name", name, "--store", c.dsn, "--driver", "namespace", "--data-dir", dataDir, "--run-dir", runDir,
		"--template-dir", filepath.Join(dataDir, "templates"), "--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0",
		"--uid-base", fmt.Sprint(100000 + i*65536*4), "--builtins", "minimal", "--cluster-secret-file", secret,
		"--heartbeat", "500ms"}, extra...)
	c.nodes = append(c.nodes, p)
	return p
}

// addServer adds a `space server --remote-nodes` replica with extra flags.
func (c *cluster) addServer(env *testenv.Server, secret, name string, extra ...string) *proc {
	p := &proc{name: name, bin: env.Bin, log: filepath.Join(env.Work, name+".log"), addrFile: filepath.Join(env.Work, name+".addr")}
	p.args = append([]string{"server", "--remote-nodes", "--node-name", name, "--store", c.dsn, "--data-dir", filepath.Join(env.Work, name),
		"--listen", "127.0.0.1:0", "--cluster-secret-file", secret, "--node-timeout", nodeTimeout.String()}, extra...)
	c.servers = append(c.servers, p)
	return p
}
