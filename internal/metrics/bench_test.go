package metrics

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/space-sandbox/space/internal/core"
)

// BenchmarkScrapeSandboxes is the cost of one scrape with 1,000 live
// sandboxes in a SQLite store (space_sandboxes lists them every time).
func BenchmarkScrapeSandboxes(b *testing.B) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	st := openStore(b)
	ctx := context.Background()
	now := time.Now().UTC()
	for i := 0; i < 1000; i++ {
		sb := core.Sandbox{ID: fmt.Sprintf("sbx-%016d", i), ProjectID: "p", Template: "minimal", State: core.SandboxRunning,
			Driver: "namespace", Node: "local", CreatedAt: now, UpdatedAt: now}
		op := core.Operation{ID: core.NewID("op-"), ProjectID: "p", Kind: "sandbox.create", Target: sb.ID, State: core.OpSucceeded, CreatedAt: now, UpdatedAt: now}
		if _, _, err := st.CreateSandboxOp(ctx, sb, op, ""); err != nil {
			b.Fatal(err)
		}
	}
	m.WatchSandboxes(st, "local", "namespace")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		mfs, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "space_sandboxes" {
				for _, s := range mf.Metric {
					for _, l := range s.Label {
						if l.GetName() == "state" && l.GetValue() == "running" && s.Gauge.GetValue() != 1000 {
							b.Fatalf("running: %v", s.Gauge.GetValue())
						}
					}
				}
			}
		}
	}
}
