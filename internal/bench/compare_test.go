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

// TestRunDrivers measures namespace and gvisor side by side at the
// smallest size: every phase yields a number, gvisor's snapshots carry
// the process image, the table names both, and nothing is left behind.
func TestRunDrivers(t *testing.T) {
	needGvisor(t, "starts two servers and sandboxes")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := Config{N: 2, ExecRuns: 3, WarmPool: 1, SnapshotRuns: 1, AgentPath: agentBin.path, Runsc: os.Getenv("SPACE_RUNSC")}
	res, err := RunDrivers(ctx, cfg, []string{"namespace", gvisor.Name})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Drivers) != 2 {
		t.Fatalf("%d driver results, want 2", len(res.Drivers))
	}
	for _, d := range res.Drivers {
		if d.Cold == nil || d.Cold.Create.N != 2 || d.Warm == nil || d.Warm.Create.N != 2 || d.Exec == nil || d.Exec.N != 3 || len(d.Errors) > 0 {
			t.Errorf("%s: %+v", d.Driver, d)
		}
	}
	if g := res.Drivers[1]; g.Snapshot == nil || g.Fork == nil || g.SnapshotKind != "process" || g.ImageBytes <= 0 {
		t.Errorf("gvisor snapshot: %+v", g)
	}
	if n := res.Drivers[0]; n.Snapshot != nil {
		t.Errorf("namespace measured snapshots: %+v", n.Snapshot)
	}
	var b bytes.Buffer
	if err := WriteComparison(&b, res); err != nil {
		t.Fatal(err)
	}
	if s := b.String(); !strings.Contains(s, "namespace") || !strings.Contains(s, "gvisor") || !strings.Contains(s, "process image") {
		t.Errorf("table:\n%s", s)
	}
	t.Logf("\n%s", b.String())
}
