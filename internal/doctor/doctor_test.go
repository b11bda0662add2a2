package doctor

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/cgroups"
)

// The JSON document is an interface (scripts, docs): its keys are fixed.
func TestReportJSONShape(t *testing.T) {
	r := Report{
		Host:   Host{Kernel: "6.1.0", Arch: "amd64", CPUs: 2, Root: true, DataDir: "/var/lib/space"},
		Checks: []Check{{Name: "kvm", OK: false, Detail: "/dev/kvm: no such file or directory", For: "drivers firecracker, qemu with KVM"}},
		Driver: Driver{Auto: "namespace", Reason: "no /dev/kvm", Log: []string{"driver: namespace (no /dev/kvm)"}},
	}
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	keys := func(v any) []string {
		var out []string
		for k := range v.(map[string]any) {
			out = append(out, k)
		}
		sort.Strings(out)
		return out
	}
	for _, c := range []struct {
		what string
		got  []string
		want []string
	}{
		{"top", keys(doc), []string{"checks", "driver", "host"}},
		{"host", keys(doc["host"]), []string{"arch", "cpus", "data_dir", "kernel", "root"}},
		{"check", keys(doc["checks"].([]any)[0]), []string{"detail", "for", "name", "ok"}},
		{"driver", keys(doc["driver"]), []string{"auto", "log", "reason"}},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s keys: %v, want %v", c.what, c.got, c.want)
		}
	}
	r.Driver = Driver{Reason: "…", Error: "namespace: must run as root"}
	raw, _ = json.Marshal(r)
	doc = nil
	json.Unmarshal(raw, &doc)
	if got := keys(doc["driver"]); !reflect.DeepEqual(got, []string{"auto", "error", "reason"}) {
		t.Errorf("driver keys when none works: %v", got)
	}
}

// Probe makes every check it names, in order, each with a detail, on any
// host (root or not).
func TestProbeMakesEveryCheck(t *testing.T) {
	r := Probe(context.Background(), Options{DataDir: t.TempDir() + "/not/yet"})
	var names []string
	for _, c := range r.Checks {
		names = append(names, c.Name)
		if c.Detail == "" || c.For == "" {
			t.Errorf("check %s: empty detail or for: %+v", c.Name, c)
		}
		t.Logf("%-16s %-5v %s", c.Name, c.OK, c.Detail)
	}
	if !reflect.DeepEqual(names, CheckNames) {
		t.Errorf("checks %v, want %v", names, CheckNames)
	}
	if r.Host.Kernel == "" || r.Host.CPUs < 1 {
		t.Errorf("host: %+v", r.Host)
	}
}

func TestMountOfFindsDeepestMount(t *testing.T) {
	m, err := mountOf("/proc/self")
	if err != nil {
		t.Fatal(err)
	}
	if m.point != "/proc" || m.fstype != "proc" || m.dev == "" {
		t.Errorf("/proc/self is on %+v, want /proc (proc) with a device", m)
	}
	if got := existingParent("/proc/definitely/not/here"); got != "/proc" {
		t.Errorf("existingParent: %s", got)
	}
}

// The cgroups check says whether favordynmods is on: without it every
// create waits for an RCU grace period, which an operator should see.
func TestCgroupLayoutShowsDynMods(t *testing.T) {
	d, err := cgroups.ReadDynMods()
	if err != nil {
		t.Fatal(err)
	}
	if d.Mount == "" {
		t.Skip("no cgroup v2 mount on this host: nothing to show")
	}
	ok, detail := cgroupLayout()
	if !ok {
		t.Skipf("no usable cgroup layout here: %s", detail)
	}
	if !strings.HasSuffix(detail, "; "+d.String()) {
		t.Errorf("cgroups detail %q does not end with the favordynmods state %q", detail, d.String())
	}
}

// data_dir_fs tells an ext4 without a journal from one with it, on real
// loop-mounted filesystems the test makes.
func TestDataDirFSJournal(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a loop device needs root")
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		t.Skip("no mkfs.ext4 (e2fsprogs)")
	}
	if ok, detail := loopDevices(); !ok {
		t.Skip(detail)
	}
	for _, c := range []struct {
		name     string
		features string
		wantOK   bool
		want     string
	}{
		{"journal", "has_journal", true, "ext4 with a journal"},
		{"no journal", "^has_journal", false, "ext4 without a journal"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			img, mnt := filepath.Join(dir, "img"), filepath.Join(dir, "mnt")
			if err := os.Mkdir(mnt, 0o755); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(mkfs, "-q", "-F", "-O", c.features, img, "16M").CombinedOutput(); err != nil {
				t.Fatalf("mkfs.ext4: %v\n%s", err, out)
			}
			if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
				t.Skipf("loop mount: %v\n%s", err, out)
			}
			t.Cleanup(func() {
				if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
					t.Errorf("umount: %v\n%s", err, out)
				}
			})
			ok, detail := dataDirFS(filepath.Join(mnt, "space", "not-yet"))
			if ok != c.wantOK || !strings.Contains(detail, c.want) || !strings.Contains(detail, mnt) {
				t.Errorf("dataDirFS = %v, %q; want %v and %q on %s", ok, detail, c.wantOK, c.want, mnt)
			}
			f, err := FSOf(mnt)
			if err != nil || f.Point != mnt || f.Type != "ext4" || !strings.HasPrefix(f.String(), c.want+" on "+mnt) {
				t.Errorf("FSOf(%s) = %+v (%q), %v; want %q", mnt, f, f.String(), err, c.want)
			}
		})
	}
	// Not ext4: nothing to say against it.
	if ok, detail := dataDirFS("/proc/self"); !ok || !strings.Contains(detail, "(proc,") {
		t.Errorf("dataDirFS(/proc/self) = %v, %q", ok, detail)
	}
}
