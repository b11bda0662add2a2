package egress_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/space-sandbox/space/internal/bench"
	"github.com/space-sandbox/space/internal/netns/netnstest"
	"github.com/space-sandbox/space/test/testenv"
)

// TestEgressShutdown: SIGTERM to a real `space server --egress` (in this
// package's private network namespace). With a sandbox left running, only
// what it needs stays (its veth, the table, its cgroup, its socket; the
// warm-pool sandbox's are gone) and the next start re-adopts it; with no
// sandbox left, the nftables table, the sandbox cgroups and the run dir
// are removed.
func TestEgressShutdown(t *testing.T) {
	netnstest.RequireRoot(t)
	if !netnstest.Inside() {
		t.Skip("runs only inside its private network namespace")
	}
	const table, prefix = "space-shutdown-test", "spd"
	srv, err := testenv.New("space-shutdown-")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Remove()
	defer srv.Stop()
	srv.Args = []string{"--builtins", "minimal", "--warm-pool", "1", "--warm-templates", "minimal",
		"--egress", "--egress-dns", upstreamDNS, "--egress-table", table, "--egress-if-prefix", prefix, "--egress-pool", "10.204.0.0/24"}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	key, err := srv.CreateKey("p1")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitTemplate(key, "minimal", 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl := bench.NewClient(srv.Ctrl, key)
	sb, err := cl.Create(ctx, "minimal")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Delete(context.Background(), sb.ID) // a failed run leaves no sandbox (if the server runs)
	_, m, _ := testenv.DoJSON("GET", srv.Ctrl+"/v1/sandboxes/"+sb.ID, map[string]string{"X-API-Key": key}, nil)
	inst, _ := m["instance"].(string)
	if inst == "" {
		inst = sb.ID
	}
	// The warm pool holds a second sandbox (its own veth and cgroup).
	waitFor(t, "the warm-pool sandbox's link", func() bool { return len(links(prefix)) == 2 })

	stop := func() time.Duration {
		t0 := time.Now()
		srv.Stop()
		return time.Since(t0)
	}
	took := stop()
	if took > 4*time.Second {
		t.Errorf("SIGTERM took %v (killed?)", took)
	}
	if l := links(prefix); len(l) != 1 {
		t.Errorf("after SIGTERM with one sandbox left: links %v, want only the sandbox's", l)
	}
	if ok, err := nftTableExists(table); !ok || err != nil {
		t.Errorf("the table the sandbox needs is gone: %v %v", ok, err)
	}
	if dirs := cgroupChildren(srv.CgroupBase()); len(dirs) == 0 || !allNamed(dirs, inst) {
		t.Errorf("sandbox cgroups after SIGTERM: %v, want only %s's", dirs, inst)
	}
	if ents, _ := os.ReadDir(srv.RunDir); len(ents) != 1 || !strings.HasPrefix(ents[0].Name(), inst) {
		t.Errorf("run dir after SIGTERM: %v, want only %s's socket", ents, inst)
	}
	if !strings.Contains(srv.LogTail(4000), "shutdown: 1 sandboxes keep running") {
		t.Errorf("no shutdown line in the log:\n%s", srv.LogTail(4000))
	}

	// Re-adopted at the next start, network and all.
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	res, err := cl.Exec(ctx, sb, []string{"/bin/sh", "-c", "echo still-here"}, func(b []byte) { out.Write(b) })
	if err != nil || !strings.Contains(out.String(), "still-here") {
		t.Fatalf("sandbox after restart: %v %+v %q", err, res, out.String())
	}
	if err := cl.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the warm pool again", func() bool { return len(links(prefix)) == 1 })
	took = stop()
	if took > 4*time.Second {
		t.Errorf("SIGTERM took %v (killed?)", took)
	}
	t.Logf("SIGTERM to exit with no sandbox left: %v", took)
	if l := links(prefix); len(l) != 0 {
		t.Errorf("links left: %v", l)
	}
	if ok, err := nftTableExists(table); ok || err != nil {
		t.Errorf("table %s left: %v %v", table, ok, err)
	}
	if dirs := cgroupDirsNamed(srv.CgroupBase()); len(dirs) != 0 {
		t.Errorf("cgroups left: %v", dirs)
	}
	if _, err := os.Stat(srv.RunDir); err == nil {
		ents, _ := os.ReadDir(srv.RunDir)
		t.Errorf("run dir %s left: %v", srv.RunDir, ents)
	}
	if log := srv.LogTail(4000); !strings.Contains(log, "shutdown: no sandboxes left: removed nftables table "+table) || strings.Contains(log, "; kept") {
		t.Errorf("shutdown line:\n%s", log)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for i := 0; i < 300; i++ {
		if ok() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// links are the host-side veths whose names start with prefix.
func links(prefix string) []string {
	var out []string
	ls, _ := netlink.LinkList()
	for _, l := range ls {
		if strings.HasPrefix(l.Attrs().Name, prefix) {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

// cgroupDirsNamed lists the cgroup directories named base.
func cgroupDirsNamed(base string) []string {
	var out []string
	filepath.WalkDir("/sys/fs/cgroup", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if strings.Count(p, "/") > 10 {
			return filepath.SkipDir
		}
		if d.Name() == base {
			out = append(out, p)
			return filepath.SkipDir
		}
		return nil
	})
	return out
}

// cgroupChildren lists the group directories below every base directory.
func cgroupChildren(base string) []string {
	var out []string
	for _, d := range cgroupDirsNamed(base) {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if e.IsDir() {
				out = append(out, filepath.Join(d, e.Name()))
			}
		}
	}
	return out
}

func allNamed(dirs []string, name string) bool {
	for _, d := range dirs {
		if filepath.Base(d) != name {
			return false
		}
	}
	return true
}
