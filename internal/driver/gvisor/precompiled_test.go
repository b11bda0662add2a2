package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/driver"
)

// TestPrecompiledSeccomp: the runsc that scripts/runsc.sh builds carries
// gVisor's precompiled seccomp programs, so neither the Sentry nor the
// gofer compiles its host filter at start (12 ms of runsc's boot without
// them). runsc's debug logs say which it did.
func TestPrecompiledSeccomp(t *testing.T) {
	requireRunsc(t)
	if b, err := os.ReadFile(filepath.Join(filepath.Dir(runscPath), "VERSION")); err != nil || !strings.Contains(string(b), "precompiled-seccomp") {
		t.Skipf("%s is not a build of scripts/runsc.sh with precompiled seccomp programs (VERSION %q, %v)", runscPath, b, err)
	}
	o := testOptions(t, shortDir(t))
	o.Debug = true
	d := newDriver(t, o)
	inst := create(t, d, "precomp", driver.Limits{})
	defer inst.Destroy(context.Background())
	logs, err := filepath.Glob(filepath.Join(inst.dir, "logs", "*"))
	if err != nil || len(logs) == 0 {
		t.Fatalf("no runsc debug logs in %s (%v)", filepath.Join(inst.dir, "logs"), err)
	}
	loaded := map[string]bool{}
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		for _, part := range []string{".boot.", ".gofer."} {
			if !strings.Contains(filepath.Base(l), part) {
				continue
			}
			if strings.Contains(string(b), "No precompiled program found") {
				t.Errorf("%s: runsc compiled its seccomp program at start: no precompiled one for its options", filepath.Base(l))
			}
			if strings.Contains(string(b), "Loaded precompiled seccomp instructions") {
				loaded[part] = true
			}
		}
	}
	for _, part := range []string{".boot.", ".gofer."} {
		if !loaded[part] {
			t.Errorf("the %s log does not show precompiled seccomp instructions loaded (logs: %v)", strings.Trim(part, "."), logs)
		}
	}
}
