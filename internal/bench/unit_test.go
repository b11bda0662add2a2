package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	var s []time.Duration
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	got := Summarize(s)
	want := Summary{N: 100, Min: 1, P50: 50, P95: 95, P99: 99, Max: 100, Mean: 50.5}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if s[0] != 100*time.Millisecond {
		t.Error("Summarize sorted its input")
	}
	if got := Summarize(nil); got != (Summary{}) {
		t.Errorf("empty: %+v", got)
	}
	if got := Summarize([]time.Duration{1500 * time.Microsecond}); got.P50 != 1.5 || got.P99 != 1.5 {
		t.Errorf("one sample: %+v", got)
	}
	if m := medianFloat([]float64{3, 1, 2, 10}); m != 2 {
		t.Errorf("median %v", m)
	}
}

func TestReadCommandEvents(t *testing.T) {
	big := strings.Repeat("x", 600<<10) // longer than the reader's buffer
	enc := base64.StdEncoding.EncodeToString
	stream := ": keep-alive\n\n" +
		"id: 1\nevent: stdout\ndata: " + enc([]byte("hello ")) + "\n\n" +
		"id: 2\nevent: stderr\ndata: " + enc([]byte("oops")) + "\n\n" +
		"id: 3\nevent: stdout\ndata:" + enc([]byte(big)) + "\n\n" +
		"id: 4\nevent: exit\ndata: {\"exit_code\":3}\n\n" +
		"id: 5\nevent: stdout\ndata: " + enc([]byte("after exit")) + "\n\n"
	var out strings.Builder
	r, err := readCommandEvents(bufio.NewReaderSize(strings.NewReader(stream), 256<<10), func(p []byte) { out.Write(p) })
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode != 3 || r.Stdout != int64(6+len(big)) || r.Events != 2 || string(r.Stderr) != "oops" {
		t.Errorf("result %+v", r)
	}
	if out.String() != "hello "+big {
		t.Errorf("stdout mismatch (%d bytes)", out.Len())
	}

	for name, s := range map[string]string{
		"no exit":    "event: stdout\ndata: aGk=\n\n",
		"bad base64": "event: stdout\ndata: !!!\n\n",
		"bad exit":   "event: exit\ndata: {\n\n",
		"signal":     "event: exit\ndata: {\"exit_code\":-1,\"signal\":\"SIGKILL\"}\n\n",
	} {
		if _, err := readCommandEvents(bufio.NewReaderSize(strings.NewReader(s), 256<<10), nil); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

const testMountinfo = `25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
35 33 0:30 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
36 33 0:31 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,memory
37 33 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,cpu,cpuacct
38 33 0:33 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,pids
39 33 0:34 /inner /mnt/cg\040x rw,relatime shared:15 - cgroup cgroup rw,freezer
`

func TestOwnPlaces(t *testing.T) {
	procCgroup := `12:freezer:/inner/job
11:pids:/
10:cpu,cpuacct:/a
9:memory:/process_api/abc
1:name=systemd:/
0::/u
`
	got := ownPlaces([]byte(testMountinfo), []byte(procCgroup))
	want := map[string]string{
		"/mnt/cg x/job":                         "freezer",
		"/sys/fs/cgroup/pids":                   "pids",
		"/sys/fs/cgroup/cpu,cpuacct/a":          "cpu",
		"/sys/fs/cgroup/memory/process_api/abc": "memory",
		"/sys/fs/cgroup/unified/u":              "",
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for _, p := range got {
		w, ok := want[p.dir]
		if !ok || strings.Join(p.ctls, ",") != w {
			t.Errorf("unexpected place %+v", p)
		}
	}
	mounts := parseCgroupMounts([]byte(testMountinfo))
	if len(mounts) != 6 || !mounts[0].v2 || mounts[5].point != "/mnt/cg x" || mounts[5].root != "/inner" {
		t.Errorf("mounts %+v", mounts)
	}
}

func TestOCISpec(t *testing.T) {
	raw, err := json.Marshal(ociSpec("/rootfs", "/x/c"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Root struct {
			Path     string `json:"path"`
			Readonly bool   `json:"readonly"`
		} `json:"root"`
		Process struct {
			Args []string `json:"args"`
		} `json:"process"`
		Linux struct {
			CgroupsPath string `json:"cgroupsPath"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Root.Path != "/rootfs" || !spec.Root.Readonly || spec.Process.Args[0] != "/bin/true" || spec.Linux.CgroupsPath != "/x/c" {
		t.Errorf("spec %s", raw)
	}
}

func TestChecks(t *testing.T) {
	r := &Result{
		Cold:        &ColdResult{Create: Summary{P50: 12}},
		Warm:        &WarmResult{Create: Summary{P50: 6}},
		Exec:        &Summary{P50: 1},
		Stdout:      &StdoutResult{Median: 299},
		Idle:        &IdleResult{Wanted: 500, Created: 500, Alive: 499, PerSandboxMiB: 1},
		Crun:        &CrunResult{Run: Summary{N: 5, P50: 10}},
		Concurrency: []ConcurrencyLevel{{Clients: 16, CyclesPerSec: 120, Running: Summary{P50: 150}}},
	}
	got := map[string]bool{}
	for _, c := range checks(r) {
		got[c.Name] = c.Pass
	}
	want := map[string]bool{
		"cold create→ready p50": true, "warm create→ready p50": false, "exec `true` round trip p50": true,
		"stdout throughput": false, "memory per idle sandbox": true, "idle sandboxes alive at once": false,
		"full cycles/s, 16 clients": true, "create→running p50, 16 clients": false,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: pass=%v, want %v", k, got[k], v)
		}
	}
	if len(checks(&Result{})) != len(want) {
		t.Error("a missing phase must still be listed (as not measured)")
	}
	// 14 ms against crun's 10 is 1.4×: over the 1.3× target.
	r.Cold.Create.P50 = 14
	for _, c := range checks(r) {
		if c.Name == "cold create→ready p50" && (c.Pass || !strings.Contains(c.Value, "1.40×")) {
			t.Errorf("cold check %+v", c)
		}
	}
}

func TestWriteCompare(t *testing.T) {
	earlier := &Result{Date: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		Cold: &ColdResult{Create: Summary{P50: 10}}, Exec: &Summary{P50: 2},
		Idle: &IdleResult{Created: 1, PerSandboxMiB: 1.5}}
	now := &Result{Date: earlier.Date.Add(time.Hour),
		Cold: &ColdResult{Create: Summary{P50: 12}}, Exec: &Summary{P50: 1},
		Concurrency: []ConcurrencyLevel{{Clients: 4, CyclesPerSec: 30}},
		Idle:        &IdleResult{Created: 1, PerSandboxMiB: 1.5}}
	var b bytes.Buffer
	if err := WriteCompare(&b, earlier, now); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"+20.0 % worse", "-50.0 % better", "memory per idle sandbox", "+0.0 %"} {
		if !strings.Contains(out, want) {
			t.Errorf("lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "4 clients") {
		t.Errorf("a figure the earlier report lacks is listed:\n%s", out)
	}
	dir := t.TempDir()
	raw, _ := json.Marshal(earlier)
	if err := os.WriteFile(dir+"/r.json", raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if r, err := ReadResult(dir + "/r.json"); err != nil || r.Cold.Create.P50 != 10 {
		t.Errorf("ReadResult: %+v, %v", r, err)
	}
	if err := os.WriteFile(dir+"/x.json", []byte(`{"x":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadResult(dir + "/x.json"); err == nil {
		t.Error("a JSON file that is no report was read")
	}
}

func TestServePorts(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- ServePorts(ctx, "127.0.0.1:0", pw) }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		t.Fatalf("first line %q: %v", line, err)
	}
	c := newPortClient(addr, 1, "tok")
	defer c.CloseIdleConnections()
	if err := getBody(ctx, c, "http://8080-sbx-1.localhost:1/small", int64(len(SmallBody))); err != nil {
		t.Fatal(err)
	}
	if err := getBody(ctx, c, "http://"+addr+"/1mib", LargeBytes); err != nil {
		t.Fatal(err)
	}
	if err := getBody(ctx, c, "http://"+addr+"/nothing", 0); err == nil {
		t.Fatal("404 accepted")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The fleet's share of the single server's rate per client count: the
// median of the paired rounds (two rounds: their mean), in the order of
// the levels, each count once.
func TestSummarizeShares(t *testing.T) {
	got := summarizeShares([]int{16, 32, 16}, map[int][]float64{16: {95, 80, 101}, 32: {88, 92}})
	want := []FleetShare{{Clients: 16, Rounds: 3, Median: 95, Min: 80, Max: 101}, {Clients: 32, Rounds: 2, Median: 90, Min: 88, Max: 92}}
	if len(got) != len(want) {
		t.Fatalf("shares %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("share %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestResolveIn follows links as a sandbox sees them: absolute targets
// from the tree's root, and never out of it.
func TestResolveIn(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"bin", "usr/bin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		"bin/true":     "/bin/busybox",           // absolute: from root
		"usr/bin/true": "../../bin/true",         // relative, through another link
		"bin/escape":   "../../../../etc/passwd", // climbs: stays at root
		"bin/loop":     "/bin/loop",
		"bin/dir":      "/usr",
	}
	for l, target := range links {
		if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"/bin/true", "usr/bin/true", "/bin/busybox"} {
		got, err := resolveIn(root, p)
		if err != nil || got != filepath.Join(root, "bin/busybox") {
			t.Errorf("resolveIn(%q) = %q, %v; want the tree's bin/busybox", p, got, err)
		}
	}
	for _, p := range []string{"/bin/escape", "/bin/loop", "/bin/dir", "/bin/none"} {
		if got, err := resolveIn(root, p); err == nil {
			t.Errorf("resolveIn(%q) = %q, want an error", p, got)
		}
	}
}
