package cgroups

import (
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
)

const (
	miHybrid = `30 24 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
33 30 0:29 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,memory
`
	miV2On = `31 24 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,seclabel,nsdelegate,favordynmods,memory_recursiveprot
`
	miV1 = `33 30 0:29 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,memory
`
	features = "nsdelegate\nfavordynmods\nmemory_localevents\nmemory_recursiveprot\n"
)

func TestDynModsFromTables(t *testing.T) {
	for _, tc := range []struct {
		name, mi, features string
		want               DynMods
	}{
		{"hybrid off", miHybrid, features, DynMods{Mount: "/sys/fs/cgroup/unified", Supported: true}},
		{"v2 on", miV2On, features, DynMods{Mount: "/sys/fs/cgroup", Supported: true, On: true}},
		{"old kernel", miHybrid, "nsdelegate\n", DynMods{Mount: "/sys/fs/cgroup/unified"}},
		{"v1 only", miV1, features, DynMods{Supported: true}},
	} {
		got, _, err := dynModsFromTables([]byte(tc.mi), []byte(tc.features))
		if err != nil || got != tc.want {
			t.Errorf("%s: got %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
	// The v2 mount's own flags come back for the remount to keep.
	if _, opts, _ := dynModsFromTables([]byte(miHybrid), []byte(features)); strings.Join(opts, ",") != "rw,nsdelegate" {
		t.Errorf("hybrid: super options %q, want rw,nsdelegate", opts)
	}
}

func TestCgroup2Data(t *testing.T) {
	for _, tc := range []struct {
		opts  string
		extra []string
		want  string
	}{
		{"rw,nsdelegate", []string{DynModsOption}, "nsdelegate,favordynmods"},
		{"rw,seclabel,nsdelegate,favordynmods,memory_recursiveprot", []string{DynModsOption}, "nsdelegate,favordynmods,memory_recursiveprot"},
		{"rw", []string{DynModsOption}, "favordynmods"},
		{"rw,nsdelegate,memory_localevents", nil, "nsdelegate,memory_localevents"},
	} {
		if got := cgroup2Data(strings.Split(tc.opts, ","), tc.extra...); got != tc.want {
			t.Errorf("cgroup2Data(%q, %q) = %q, want %q", tc.opts, tc.extra, got, tc.want)
		}
	}
}

// TestMountOnce mounts the host's cgroup2 hierarchy again with exactly the
// flags it has, which changes no flag, and checks that neither the mount
// nor the thread's namespace is left behind.
func TestMountOnce(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount)")
	}
	d, err := ReadDynMods()
	if err != nil {
		t.Fatal(err)
	}
	if d.Mount == "" {
		t.Skip("no cgroup v2 mount on this host")
	}
	before := v2Opts(t, d.Mount)
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	ns, _ := os.Readlink("/proc/self/ns/mnt")
	dir := t.TempDir()
	errc := make(chan error, 1)
	threadNS := make(chan string, 1)
	go func() {
		runtime.LockOSThread()
		err := mountOnce(dir, cgroup2Data(before))
		l, _ := os.Readlink("/proc/thread-self/ns/mnt")
		threadNS <- l
		errc <- err
	}()
	if got := <-threadNS; got != ns {
		t.Errorf("thread left in mount namespace %s, want %s", got, ns)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if after := v2Opts(t, d.Mount); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Errorf("flags changed: %q -> %q", before, after)
	}
	if mi2, _ := os.ReadFile("/proc/self/mountinfo"); strings.Count(string(mi2), "\n") != strings.Count(string(mi), "\n") {
		t.Errorf("mount table changed:\n%s\n->\n%s", mi, mi2)
	}
	if ns2, _ := os.Readlink("/proc/self/ns/mnt"); ns2 != ns {
		t.Errorf("process mount namespace %s -> %s", ns, ns2)
	}
}

// TestFavorDynMods turns the flag on. It changes a host-wide kernel mode
// that cannot be turned off again on Linux 6.18+, so where the flag is off
// it runs only when SPACE_TEST_CGROUP_DYNMODS=1 allows that.
func TestFavorDynMods(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount)")
	}
	d, err := ReadDynMods()
	if err != nil {
		t.Fatal(err)
	}
	if d.Mount == "" || !d.Supported {
		if _, _, err := FavorDynMods(); !errors.Is(err, ErrDynModsUnsupported) {
			t.Fatalf("FavorDynMods on %s = %v, want ErrDynModsUnsupported", d, err)
		}
		return
	}
	if !d.On && os.Getenv("SPACE_TEST_CGROUP_DYNMODS") != "1" {
		t.Skip("favordynmods is off on this host; set SPACE_TEST_CGROUP_DYNMODS=1 to let the test turn it on (host-wide, until reboot)")
	}
	before := v2Opts(t, d.Mount)
	got, changed, err := FavorDynMods()
	if err != nil {
		t.Fatal(err)
	}
	if !got.On || changed == d.On {
		t.Fatalf("FavorDynMods = %+v, changed %v (was on: %v)", got, changed, d.On)
	}
	after := v2Opts(t, d.Mount)
	for _, o := range before {
		if !strings.Contains(","+strings.Join(after, ",")+",", ","+o+",") {
			t.Errorf("flag %s lost: %q -> %q", o, before, after)
		}
	}
	if _, changed, err := FavorDynMods(); changed || err != nil {
		t.Errorf("second call: changed %v, %v", changed, err)
	}
}

func v2Opts(t *testing.T, point string) []string {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	ms, err := parseMountinfo(mi)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.v2 && m.point == point {
			return m.opts
		}
	}
	t.Fatalf("no cgroup2 mount at %s", point)
	return nil
}
