package operator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/operator"
)

// TestClaimLatency measures claims per second and claim→Ready latency for
// a burst of SPACE_OPERATOR_BENCH claims (e.g. 100) served by a warm pool
// of that size, then for a burst against an empty pool (every claim a cold
// SPACE create). Latency is from just before the claim's POST to the
// moment a watch of the claims sees its Ready condition True; claims per
// second is the burst size over first POST to last Ready. Skipped unless
// SPACE_OPERATOR_BENCH is set (docs/PERFORMANCE.md).
func TestClaimLatency(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SPACE_OPERATOR_BENCH"))
	if n <= 0 {
		t.Skip("set SPACE_OPERATOR_BENCH=N (e.g. 100) to run the claim latency benchmark")
	}
	c := startCluster(t)
	srv, key := spaceServer(t)
	startOperator(t, c, srv, key, "operator")
	c.create(t, "", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}})
	c.create(t, ns, templateObj("busy"))
	c.create(t, ns, poolObj("warm", "busy", n))
	c.create(t, ns, poolObj("empty", "busy", 0))
	start := time.Now()
	waitFor(t, 10*time.Minute, "warm pool full", func() error {
		var p operator.SandboxWarmPool
		if err := c.getObj(operator.ResWarmPool, ns, "warm", &p); err != nil {
			return err
		}
		if int(p.Status.ReadyReplicas) != n {
			return fmt.Errorf("status %+v", p.Status)
		}
		return nil
	})
	t.Logf("warm pool of %d ready in %v", n, time.Since(start).Round(time.Millisecond))
	// The pool refills while the burst claims from it, as it would in
	// production: those creates compete with the claims measured.
	burst(t, c, "warm", "w", n)
	burst(t, c, "empty", "e", n)
}

// burst creates n claims on pool at once (16 clients) and reports.
func burst(t *testing.T, c *cluster, pool, prefix string, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	readyAt := map[string]time.Time{}
	allReady := make(chan struct{})
	_, rv, err := c.admin.List(ctx, operator.ResClaim, ns)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for ctx.Err() == nil {
			c.admin.Watch(ctx, operator.ResClaim, ns, rv, func(ev operator.WatchEvent) {
				var cl operator.SandboxClaim
				if json.Unmarshal(ev.Object, &cl) != nil {
					return
				}
				rv = cl.Metadata.ResourceVersion
				if ok, _ := ready(cl.Status.Conditions, operator.CondReady); ok {
					mu.Lock()
					if _, seen := readyAt[cl.Metadata.Name]; !seen {
						readyAt[cl.Metadata.Name] = time.Now()
						if countPrefix(readyAt, prefix) == n {
							close(allReady)
						}
					}
					mu.Unlock()
				}
			})
		}
	}()
	sent := make([]time.Time, n)
	names := make(chan int, n)
	for i := range n {
		names <- i
	}
	close(names)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range names {
				sent[i] = time.Now()
				if err := c.tryCreate(ns, claimObj(fmt.Sprintf("%s-%d", prefix, i), pool, nil)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	select {
	case <-allReady:
	case <-time.After(10 * time.Minute):
		mu.Lock()
		t.Fatalf("%s: only %d of %d claims Ready", pool, countPrefix(readyAt, prefix), n)
	}
	mu.Lock()
	defer mu.Unlock()
	lat := make([]time.Duration, n)
	first, last := sent[0], time.Time{}
	for i := range n {
		at := readyAt[fmt.Sprintf("%s-%d", prefix, i)]
		lat[i] = at.Sub(sent[i])
		if sent[i].Before(first) {
			first = sent[i]
		}
		if at.After(last) {
			last = at
		}
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[min(n-1, int(float64(n)*p))] }
	t.Logf("%s pool: %d claims in %v = %.1f claims/s; claim→Ready p50 %v p90 %v p99 %v max %v", pool, n,
		last.Sub(first).Round(time.Millisecond), float64(n)/last.Sub(first).Seconds(),
		pct(0.5).Round(time.Millisecond), pct(0.9).Round(time.Millisecond), pct(0.99).Round(time.Millisecond), lat[n-1].Round(time.Millisecond))
}

func countPrefix(m map[string]time.Time, prefix string) int {
	k := 0
	for name := range m {
		if len(name) > len(prefix) && name[:len(prefix)+1] == prefix+"-" {
			k++
		}
	}
	return k
}
