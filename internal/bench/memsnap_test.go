package bench

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/driver/gvisor"
)

// needGvisor skips t in -short mode (saying what it would do), without
// root or without runsc, builds the agent, and returns runsc's path.
func needGvisor(t *testing.T, what string) string {
	t.Helper()
	if testing.Short() {
		t.Skip(what)
	}
	if os.Geteuid() != 0 {
		t.Skip("the drivers need root")
	}
	runsc, err := gvisor.FindRunsc(os.Getenv("SPACE_RUNSC"))
	if err != nil {
		t.Skipf("gvisor driver unavailable (scripts/runsc.sh builds runsc): %v", err)
	}
	agentBin.once.Do(buildAgent)
	if agentBin.err != nil {
		t.Fatal(agentBin.err)
	}
	return runsc
}

// TestSmokeMemSnap runs the memory-snapshot part once at a small size on
// gVisor (the driver whose snapshots hold processes; skipped without
// runsc): every figure must be filled and the table must print. No
// timing is asserted.
func TestSmokeMemSnap(t *testing.T) {
	runsc := needGvisor(t, "starts a gVisor server and sandboxes")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	e, err := Start(ctx, EnvOptions{AgentPath: agentBin.path, Driver: gvisor.Name, Runsc: runsc})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.Close(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	r, err := runMemSnap(ctx, e, MemSnapConfig{Runs: 1, DirtyBytes: 8 << 20, Forks: []int{2}})
	if err != nil {
		t.Fatalf("%v (result %+v)", err, r)
	}
	if r.Kind != "process" || r.Idle.N != 1 || r.Resume.N != 1 || r.DirtyMS <= 0 || r.DirtyStored <= 0 ||
		len(r.Forks) != 1 || r.Forks[0].Failed != 0 || r.FirstStored <= 0 || r.SecondStored <= 0 || r.ChangedBytes <= 0 {
		t.Fatalf("result %+v", r)
	}
	t.Logf("result %+v", r)
	var b bytes.Buffer
	if err := WriteComparison(&b, &Comparison{Drivers: []DriverResult{{Driver: gvisor.Name, MemSnap: r}}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "second snapshot after 5 % changed") || !strings.Contains(b.String(), "2: ") {
		t.Errorf("table:\n%s", b.String())
	}
	t.Logf("\n%s", b.String())
}
