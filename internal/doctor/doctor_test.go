package doctor

import (
	"context"
	"encoding/json"
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
	point, fstype, _, _, err := mountOf("/proc/self")
	if err != nil {
		t.Fatal(err)
	}
	if point != "/proc" || fstype != "proc" {
		t.Errorf("/proc/self is on %s (%s), want /proc (proc)", point, fstype)
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
