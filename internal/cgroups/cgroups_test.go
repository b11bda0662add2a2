package cgroups

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const hybridMountinfo = `25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 25 0:27 / /sys/fs/cgroup rw,relatime shared:9 - tmpfs tmpfs rw,mode=755
32 31 0:28 / /sys/fs/cgroup/cpu rw,relatime shared:10 - cgroup cgroup rw,cpu
33 31 0:29 / /sys/fs/cgroup/cpuacct rw,relatime shared:11 - cgroup cgroup rw,cpuacct
34 31 0:30 / /sys/fs/cgroup/cpuset rw,relatime shared:12 - cgroup cgroup rw,cpuset
35 31 0:31 / /sys/fs/cgroup/memory rw,relatime shared:13 - cgroup cgroup rw,memory
36 31 0:32 / /sys/fs/cgroup/devices rw,relatime shared:14 - cgroup cgroup rw,devices
37 31 0:33 / /sys/fs/cgroup/freezer rw,relatime shared:15 - cgroup cgroup rw,freezer
38 31 0:34 / /sys/fs/cgroup/pids rw,relatime shared:16 - cgroup cgroup rw,pids
39 31 0:35 / /sys/fs/cgroup/systemd rw,relatime shared:17 - cgroup cgroup rw,name=systemd
40 31 0:36 / /sys/fs/cgroup/unified rw,relatime shared:18 - cgroup2 cgroup2 rw
`

const hybridProcCgroup = `9:name=systemd:/
8:pids:/
6:freezer:/
4:memory:/process_api/abc
1:cpu:/
2:cpuacct:/
0::/
`

func TestDetectHybrid(t *testing.T) {
	m, err := NewFromTables([]byte(hybridMountinfo), []byte(hybridProcCgroup), "")
	if err != nil {
		t.Fatal(err)
	}
	if m.Layout() != LayoutHybrid {
		t.Fatalf("layout %v", m.Layout())
	}
	p := m.Paths("sbx1")
	want := Paths{
		Dirs: []string{
			"/sys/fs/cgroup/cpu/space/sbx1",
			"/sys/fs/cgroup/memory/process_api/abc/space/sbx1",
			"/sys/fs/cgroup/pids/space/sbx1",
			"/sys/fs/cgroup/unified/space/sbx1",
		},
		Memory:  "/sys/fs/cgroup/memory/process_api/abc/space/sbx1",
		CPU:     "/sys/fs/cgroup/cpu/space/sbx1",
		Pids:    "/sys/fs/cgroup/pids/space/sbx1",
		Unified: "/sys/fs/cgroup/unified/space/sbx1",
	}
	if fmt.Sprint(p) != fmt.Sprint(want) {
		t.Fatalf("paths\n got %+v\nwant %+v", p, want)
	}
	if err := m.Validate(p, "sbx1"); err != nil {
		t.Fatal(err)
	}
}

func TestDetectV2InContainer(t *testing.T) {
	// A v2-only host where the mount is rooted at our own cgroup (cgroupns)
	// and one where it is a bind of a subtree.
	mi := "40 31 0:36 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
	m, err := NewFromTables([]byte(mi), []byte("0::/kubepods/pod1/ctr\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	if m.Layout() != LayoutV2 {
		t.Fatalf("layout %v", m.Layout())
	}
	if got := m.Paths("x").Unified; got != "/sys/fs/cgroup/ctr/space/x" {
		t.Fatalf("unified %q", got)
	}
	// Our cgroup is outside the mount: fall back to the mount's root.
	m, _ = NewFromTables([]byte(mi), []byte("0::/elsewhere\n"), "")
	if got := m.Paths("x").Unified; got != "/sys/fs/cgroup/space/x" {
		t.Fatalf("unified %q", got)
	}
}

func TestDetectCoMounted(t *testing.T) {
	mi := `1 0 0:1 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
2 0 0:2 / /sys/fs/cgroup/mem\040ory rw - cgroup cgroup rw,memory
3 0 0:3 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
`
	m, err := NewFromTables([]byte(mi), []byte("3:cpu,cpuacct:/a\n2:memory:/b\n1:freezer:/\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	p := m.Paths("x")
	if len(p.Dirs) != 3 || p.Freezer != "/sys/fs/cgroup/freezer/space/x" || p.CPU != "/sys/fs/cgroup/cpu,cpuacct/a/space/x" || p.Memory != "/sys/fs/cgroup/mem ory/b/space/x" || p.Unified != "" {
		t.Fatalf("paths %+v", p)
	}
	if m.Layout() != LayoutV1 {
		t.Fatal(m.Layout())
	}
	if _, err := NewFromTables([]byte("1 0 0:1 / / rw - ext4 /dev/sda rw\n"), nil, ""); err != ErrNoCgroups {
		t.Fatalf("err %v", err)
	}
}

func TestValidate(t *testing.T) {
	m, _ := NewFromTables([]byte(hybridMountinfo), []byte(hybridProcCgroup), "")
	bad := []Paths{
		{},
		{Dirs: []string{"/etc/space/a"}},
		{Dirs: []string{"/sys/fs/cgroup/pids/space/b"}},
		{Dirs: []string{"/sys/fs/cgroup/pids/space/../../a"}},
		{Dirs: []string{"/sys/fs/cgroup/pids/x/a"}},
		{Dirs: []string{"/sys/fs/cgroup/pids/space/a"}, Memory: "/sys/fs/cgroup/memory/space/a"},
	}
	for _, p := range bad {
		if err := m.Validate(p, "a"); err == nil {
			t.Errorf("accepted %+v", p)
		}
	}
	if err := m.Validate(Paths{Dirs: []string{"/sys/fs/cgroup/pids/space/a"}}, "../a"); err == nil {
		t.Error("accepted bad id")
	}
}

// fakeTree lays out regular files that stand in for cgroupfs control files.
func fakeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, val := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(val), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestLimitsV1Fake(t *testing.T) {
	root := fakeTree(t, map[string]string{
		"memory/space/s/memory.limit_in_bytes":       "0",
		"memory/space/s/memory.memsw.limit_in_bytes": "0",
		"memory/space/s/memory.oom_control":          "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
		"cpu/space/s/cpu.cfs_period_us":              "0",
		"cpu/space/s/cpu.cfs_quota_us":               "0",
		"pids/space/s/pids.max":                      "0",
	})
	mi := fmt.Sprintf("1 0 0:1 / %[1]s/memory rw - cgroup cgroup rw,memory\n2 0 0:2 / %[1]s/cpu rw - cgroup cgroup rw,cpu\n3 0 0:3 / %[1]s/pids rw - cgroup cgroup rw,pids\n", root)
	m, err := NewFromTables([]byte(mi), []byte("1:memory:/\n2:cpu:/\n3:pids:/\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	g, err := m.Create("s")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.SetLimits(Limits{MemoryBytes: 64 << 20, CPUMillis: 500, Pids: 100}); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"memory/space/s/memory.limit_in_bytes":       "67108864",
		"memory/space/s/memory.memsw.limit_in_bytes": "67108864",
		"cpu/space/s/cpu.cfs_period_us":              "100000",
		"cpu/space/s/cpu.cfs_quota_us":               "50000",
		"pids/space/s/pids.max":                      "100",
	} {
		if got := read(t, filepath.Join(root, file)); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	if err := g.SetLimits(Limits{}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(root, "cpu/space/s/cpu.cfs_quota_us")); got != "-1" {
		t.Errorf("quota %q", got)
	}
	if got := read(t, filepath.Join(root, "pids/space/s/pids.max")); got != "max" {
		t.Errorf("pids %q", got)
	}
	if n, err := g.OOMKills(); err != nil || n != 3 {
		t.Fatalf("oom kills %d %v", n, err)
	}
	ids, err := m.List()
	if err != nil || !slices.Equal(ids, []string{"s"}) {
		t.Fatalf("list %v %v", ids, err)
	}
}

func TestLimitsV2Fake(t *testing.T) {
	root := fakeTree(t, map[string]string{
		"node/cgroup.controllers":           "cpuset cpu io memory hugetlb pids",
		"node/cgroup.subtree_control":       "",
		"node/space/cgroup.subtree_control": "",
		"node/space/s/memory.max":           "",
		"node/space/s/memory.swap.max":      "",
		"node/space/s/memory.events":        "low 0\nhigh 0\nmax 5\noom 2\noom_kill 1\n",
		"node/space/s/cpu.max":              "",
		"node/space/s/pids.max":             "",
		"node/space/s/cgroup.procs":         "",
		"node/space/s/cgroup.kill":          "",
	})
	mi := fmt.Sprintf("1 0 0:1 / %s rw - cgroup2 cgroup2 rw\n", root)
	m, err := NewFromTables([]byte(mi), []byte("0::/node\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	g, err := m.Create("s")
	if err != nil {
		t.Fatal(err)
	}
	if p := g.Paths(); p.Memory != p.Unified || p.CPU != p.Unified || p.Pids != p.Unified || len(p.Dirs) != 1 {
		t.Fatalf("paths %+v", p)
	}
	if err := g.SetLimits(Limits{MemoryBytes: 1 << 30, CPUMillis: 2000, Pids: 64}); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"node/cgroup.subtree_control":       "+cpu +memory +pids",
		"node/space/cgroup.subtree_control": "+cpu +memory +pids",
		"node/space/s/memory.max":           "1073741824",
		"node/space/s/memory.swap.max":      "0",
		"node/space/s/cpu.max":              "200000 100000",
		"node/space/s/pids.max":             "64",
	} {
		if got := read(t, filepath.Join(root, file)); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	if err := g.SetLimits(Limits{}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(root, "node/space/s/cpu.max")); got != "max 100000" {
		t.Errorf("cpu.max %q", got)
	}
	if n, err := g.OOMKills(); err != nil || n != 1 {
		t.Fatalf("oom kills %d %v", n, err)
	}
	// The file stays open between reads; each read sees its content anew
	// (rewritten in place here, as the kernel makes it afresh).
	if err := os.WriteFile(filepath.Join(root, "node/space/s/memory.events"), []byte("low 0\nhigh 0\nmax 7\noom 4\noom_kill 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := g.OOMKills(); err != nil || n != 3 || g.oom == nil {
		t.Fatalf("oom kills after a change %d %v", n, err)
	}
	_ = g.Remove(context.Background()) // a fake tree's dirs are not empty
	if g.oom != nil {
		t.Fatal("Remove left the OOM file open")
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
}

// TestRealGroup exercises the host's real cgroups with a sleeping process.
func TestRealGroup(t *testing.T) {
	requireRoot(t)
	m, err := New(fmt.Sprintf("space-test-%d", os.Getpid()))
	if err != nil {
		t.Skip("no cgroups:", err)
	}
	defer m.RemoveBase()
	t.Log(m)
	id := fmt.Sprintf("test-%d", os.Getpid())
	g, err := m.Create(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	defer g.Destroy(ctx)

	if err := g.SetLimits(Limits{MemoryBytes: 64 << 20, CPUMillis: 250, Pids: 50}); err != nil {
		t.Fatal(err)
	}
	p := g.Paths()
	if p.Pids != "" && read(t, filepath.Join(p.Pids, "pids.max")) != "50" {
		t.Error("pids.max not applied")
	}
	if p.Memory != "" && p.Memory != p.Unified && read(t, filepath.Join(p.Memory, "memory.limit_in_bytes")) != "67108864" {
		t.Error("memory limit not applied")
	}
	if p.CPU != "" && p.CPU != p.Unified && read(t, filepath.Join(p.CPU, "cpu.cfs_quota_us")) != "25000" {
		t.Error("cpu quota not applied")
	}
	// Raising the limit again needs the memsw-first order.
	if err := g.SetLimits(Limits{MemoryBytes: 128 << 20}); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	if err := g.Attach(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	pids, err := g.Procs()
	if err != nil || !slices.Equal(pids, []int{cmd.Process.Pid}) {
		t.Fatalf("procs %v %v", pids, err)
	}
	if n, err := g.OOMKills(); err != nil || n != 0 {
		t.Fatalf("oom kills %d %v", n, err)
	}
	if err := g.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Thaw(ctx); err != nil {
		t.Fatal(err)
	}
	ids, _ := m.List()
	if !slices.Contains(ids, id) {
		t.Fatalf("list %v lacks %s", ids, id)
	}
	start := time.Now()
	if err := g.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("kill+remove %v", time.Since(start))
	<-waited
	for _, d := range p.Dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still there: %v", d, err)
		}
	}
	if err := g.Destroy(ctx); err != nil {
		t.Fatalf("second destroy: %v", err)
	}
}

func TestDetectV2ProcsLeaf(t *testing.T) {
	// After enableOwn moved the node into the leaf, a restarted node must
	// still put its groups beside the leaf, not below it.
	mi := "40 31 0:36 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
	m, err := NewFromTables([]byte(mi), []byte("0::/system.slice/space.service/"+ProcsLeaf+"\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Paths("x").Unified; got != "/sys/fs/cgroup/system.slice/space.service/space/x" {
		t.Fatalf("unified %q", got)
	}
}

// TestRestartWarning: a node in a systemd unit's own cgroup on a v2-only
// host is told that restarts will fail; in the leaf, on hybrid hosts and
// outside systemd units it is not.
func TestRestartWarning(t *testing.T) {
	v2 := "40 31 0:36 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
	for _, c := range []struct {
		mountinfo, cgroup string
		warn              bool
	}{
		{v2, "0::/system.slice/space-server.service\n", true},
		{v2, "0::/system.slice/space-server.service/" + ProcsLeaf + "\n", false},
		{v2, "0::/kubepods/pod1/ctr\n", false},
		{hybridMountinfo, hybridProcCgroup, false},
	} {
		m, err := NewFromTables([]byte(c.mountinfo), []byte(c.cgroup), "")
		if err != nil {
			t.Fatal(err)
		}
		if got := m.RestartWarning(); (got != "") != c.warn || c.warn && !strings.Contains(got, "DelegateSubgroup=") {
			t.Errorf("%q: warning %q, want one: %v", c.cgroup, got, c.warn)
		}
	}
}

// TestEvacuate moves real processes out of a v2 cgroup into its leaf, as
// enableOwn does when the kernel refuses to delegate controllers from a
// cgroup that holds processes.
func TestEvacuate(t *testing.T) {
	requireRoot(t)
	m, err := New("")
	if err != nil {
		t.Skip("no cgroups:", err)
	}
	var v2 string
	for _, h := range m.hier {
		if h.v2 {
			v2 = filepath.Dir(h.base) // our own v2 cgroup
		}
	}
	if v2 == "" {
		t.Skip("no cgroup v2 hierarchy on this host")
	}
	dir := filepath.Join(v2, fmt.Sprintf("space-evac-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skip("cannot create a v2 cgroup here:", err)
	}
	leaf := filepath.Join(dir, ProcsLeaf)
	var cmds []*exec.Cmd
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		_ = os.Remove(leaf)
		_ = os.Remove(dir)
	}()
	for range 3 {
		c := exec.Command("sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
		if err := write(filepath.Join(dir, "cgroup.procs"), fmt.Sprint(c.Process.Pid)); err != nil {
			t.Fatal(err)
		}
	}
	if err := evacuate(dir, leaf); err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(read(t, filepath.Join(dir, "cgroup.procs"))); len(got) != 0 {
		t.Fatalf("still in %s: %v", dir, got)
	}
	got := strings.Fields(read(t, filepath.Join(leaf, "cgroup.procs")))
	for _, c := range cmds {
		if !slices.Contains(got, fmt.Sprint(c.Process.Pid)) {
			t.Errorf("pid %d not moved to the leaf (leaf has %v)", c.Process.Pid, got)
		}
	}
}

// TestNewUnderInPod: a node in a pod (v1 hierarchies bound at the pod
// container's own subtree, the host's tree mounted at /host/cgroup) puts
// sandboxes below the fixed parent through the host's mounts, in every v1
// hierarchy (the runtime and the kubelet kill what is left in any of the
// pod's groups), and never through the pod's own subtree.
func TestNewUnderInPod(t *testing.T) {
	pod := "/space-k8s/kubepods/pod1/ctr"
	mi := ""
	for i, c := range []string{"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "pids", "name=systemd"} {
		dir := strings.TrimPrefix(c, "name=")
		mi += fmt.Sprintf("%d 30 0:%d %s /sys/fs/cgroup/%s rw - cgroup cgroup rw,%s\n", 100+i, 40+i, pod, dir, c)
		mi += fmt.Sprintf("%d 30 0:%d / /host/cgroup/%s rw - cgroup cgroup rw,%s\n", 200+i, 40+i, dir, c)
	}
	mi += "300 30 0:60 / /host/cgroup/unified rw - cgroup2 cgroup2 rw\n"
	m, err := NewUnderFromTables([]byte(mi), "/space-k8s/space-sandboxes", "space")
	if err != nil {
		t.Fatal(err)
	}
	if m.Layout() != LayoutHybrid {
		t.Fatalf("layout %v", m.Layout())
	}
	p := m.Paths("sbx1")
	if len(p.Dirs) != 9 {
		t.Fatalf("%d dirs, want one per hierarchy (9): %v", len(p.Dirs), p.Dirs)
	}
	for _, d := range p.Dirs {
		if !strings.HasPrefix(d, "/host/cgroup/") || !strings.HasSuffix(d, "/space-k8s/space-sandboxes/space/sbx1") {
			t.Errorf("dir %s is not below the host's /space-k8s/space-sandboxes", d)
		}
	}
	if p.Memory != "/host/cgroup/memory/space-k8s/space-sandboxes/space/sbx1" || p.Freezer != "" ||
		p.Unified != "/host/cgroup/unified/space-k8s/space-sandboxes/space/sbx1" {
		t.Errorf("paths %+v", p)
	}
	if err := m.Validate(p, "sbx1"); err != nil {
		t.Fatal(err)
	}
	// A mount rooted at an ancestor of the parent reaches it too.
	m, err = NewUnderFromTables([]byte("1 30 0:36 /space-k8s /c rw - cgroup2 cgroup2 rw\n"), "/space-k8s/sb", "space")
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Paths("x").Unified; got != "/c/sb/space/x" {
		t.Errorf("unified %q", got)
	}
	// Only the pod's own subtree: nothing reaches the parent.
	if _, err := NewUnderFromTables([]byte("1 30 0:36 "+pod+" /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"), "/space-sandboxes", ""); err == nil {
		t.Error("NewUnder found a way to the parent through the pod's own subtree")
	}
	for _, bad := range []string{"", "/", "rel/x", "/a/../b"} {
		if _, err := NewUnderFromTables([]byte(mi), bad, ""); err == nil {
			t.Errorf("parent %q accepted", bad)
		}
	}
}

// TestExecInHostNamespace: a process in a cgroup namespace of its own
// (unshare --cgroup, as a pod's container on a cgroup v2 host) re-executes
// itself in PID 1's and runs on there, with its arguments. PID 1 is a shell
// in a PID namespace of the test's (the host's PID 1 may be out of reach).
func TestExecInHostNamespace(t *testing.T) {
	if os.Getenv("SPACE_TEST_HOSTNS_CHILD") == "1" {
		if err := ExecInHostNamespace(); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		ns, _ := os.Readlink("/proc/self/ns/cgroup")
		pid1, _ := os.Readlink("/proc/1/ns/cgroup")
		fmt.Printf("same=%v reexec=%s args=%d\n", ns == pid1 && ns != "", os.Getenv(hostNSEnv), len(os.Args))
		os.Exit(0)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces)")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare (util-linux)")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-test.run=^TestExecInHostNamespace$", "-test.count=1"}
	// PID 1 (sh) stays in the test's cgroup namespace; its child gets its own.
	cmd := exec.Command(unshare, append([]string{"--pid", "--fork", "--mount-proc", "sh", "-c",
		`ns=$(readlink /proc/self/ns/cgroup); unshare --cgroup sh -c '[ "$(readlink /proc/self/ns/cgroup)" != "$0" ] || exit 9; exec "$@"' "$ns" "$@"`, "sh", self}, args...)...)
	cmd.Env = append(os.Environ(), "SPACE_TEST_HOSTNS_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := fmt.Sprintf("same=true reexec=1 args=%d\n", len(args)+1)
	if string(out) != want {
		t.Fatalf("child says %q, want %q", out, want)
	}
}

// TestNewUnderReal puts a sleeping process in a group below a fixed parent
// on this host's real cgroups: it leaves its own group in every hierarchy
// (cpuset included, whose new groups start empty) for the parent's, and
// the groups and the parent go again.
func TestNewUnderReal(t *testing.T) {
	requireRoot(t)
	parent := fmt.Sprintf("/space-test-under-%d", os.Getpid())
	m, err := NewUnder(parent, "t")
	if err != nil {
		t.Skip("no cgroups:", err)
	}
	t.Log(m)
	defer func() {
		m.RemoveBase()
		for _, h := range m.hier {
			if err := unix.Rmdir(filepath.Dir(h.base)); err != nil && !errors.Is(err, unix.ENOENT) {
				t.Errorf("parent %s: %v", filepath.Dir(h.base), err)
			}
		}
	}()
	g, err := m.Create("sbx")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	defer g.Destroy(ctx)
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	if err := g.Attach(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	in := 0
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if strings.HasSuffix(line, ":"+parent+"/t/sbx") {
			in++
		}
	}
	if in != len(m.hier) {
		t.Errorf("in %d of the %d hierarchies' groups:\n%s", in, len(m.hier), raw)
	}
	if err := g.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestNewUnderV2Fake: on a v2 host the controllers are enabled from the
// hierarchy's root down through the parent to the base, so that a
// sandbox's group below the base gets its limits (a fake tree: the kernel
// keeps cgroup.subtree_control in every group).
func TestNewUnderV2Fake(t *testing.T) {
	files := map[string]string{"cgroup.controllers": "cpuset cpu io memory pids"}
	for _, d := range []string{".", "sb", "sb/pods", "sb/pods/space", "sb/pods/space/s"} {
		files[filepath.Join(d, "cgroup.subtree_control")] = ""
	}
	for _, f := range []string{"memory.max", "memory.swap.max", "cpu.max", "pids.max", "cgroup.procs"} {
		files["sb/pods/space/s/"+f] = ""
	}
	root := fakeTree(t, files)
	m, err := NewUnderFromTables([]byte(fmt.Sprintf("1 0 0:1 / %s rw - cgroup2 cgroup2 rw,nsdelegate\n", root)), "/sb/pods", "space")
	if err != nil {
		t.Fatal(err)
	}
	g, err := m.Create("s")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{".", "sb", "sb/pods", "sb/pods/space"} {
		if got := read(t, filepath.Join(root, d, "cgroup.subtree_control")); got != "+cpu +memory +pids" {
			t.Errorf("%s/cgroup.subtree_control: %q, want the controllers enabled", d, got)
		}
	}
	if err := g.SetLimits(Limits{MemoryBytes: 64 << 20, CPUMillis: 500, Pids: 10}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(root, "sb/pods/space/s/memory.max")); got != "67108864" {
		t.Errorf("memory.max %q", got)
	}
}
