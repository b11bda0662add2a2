package operator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
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
	// SPACE_OPERATOR_BENCH_POOLS=warm or =empty runs one burst: with both,
	// up to 3N sandboxes live at once (the warm pool, its claims, its
	// refill), and each sandbox's agent has about a dozen threads, so
	// N = 1,000 would pass a 32,768 pid_max; alone, the warm burst peaks
	// near N plus what refilled during it, the empty one at N.
	pools := os.Getenv("SPACE_OPERATOR_BENCH_POOLS")
	warm, empty := pools == "" || strings.Contains(pools, "warm"), pools == "" || strings.Contains(pools, "empty")
	c := startCluster(t)
	srv, key := spaceServer(t)
	// SPACE_OPERATOR_BENCH_ARGS: more operator flags, for comparing
	// settings with one build (e.g. --claim-workers=32).
	op := startOperator(t, c, srv, key, "operator", strings.Fields(os.Getenv("SPACE_OPERATOR_BENCH_ARGS"))...)
	c.create(t, "", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}})
	c.create(t, ns, templateObj("busy"))
	c.create(t, ns, poolObj("empty", "busy", 0))
	apiFloor(t, c, n)
	if !warm {
		burst(t, c, op, "empty", "e", n)
		return
	}
	c.create(t, ns, poolObj("warm", "busy", n))
	refilled := func() {
		waitFor(t, 20*time.Minute, "warm pool full", func() error {
			var p operator.SandboxWarmPool
			if err := c.getObj(operator.ResWarmPool, ns, "warm", &p); err != nil {
				return err
			}
			if int(p.Status.ReadyReplicas) != n {
				return fmt.Errorf("status %+v", p.Status)
			}
			return nil
		})
	}
	start := time.Now()
	refilled()
	t.Logf("warm pool of %d ready in %v", n, time.Since(start).Round(time.Millisecond))
	sequential(t, c, "warm", min(n, 20))
	refilled()
	// The pool refills while the burst claims from it, as it would in
	// production: those creates compete with the claims measured.
	burst(t, c, op, "warm", "w", n)
	if !empty {
		return
	}
	// The empty pool's burst starts once that refill is done: its n cold
	// creates are what it measures, not the warm pool's n more.
	start = time.Now()
	refilled()
	t.Logf("warm pool refilled in %v", time.Since(start).Round(time.Millisecond))
	burst(t, c, op, "empty", "e", n)
}

// burst creates n claims on pool at once (16 clients) and reports.
func burst(t *testing.T, c *cluster, op *operatorProc, pool, prefix string, n int) {
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
	before := apiWrites(t, c)
	sent := make([]time.Time, n)
	posted := make([]time.Duration, n)
	fanOut(n, func(i int) {
		sent[i] = time.Now()
		if err := c.tryCreate(ns, claimObj(fmt.Sprintf("%s-%d", prefix, i), pool, nil)); err != nil {
			t.Error(err)
		}
		posted[i] = time.Since(sent[i])
	})
	select {
	case <-allReady:
	case <-time.After(10 * time.Minute):
		mu.Lock()
		t.Fatalf("%s: only %d of %d claims Ready", pool, countPrefix(readyAt, prefix), n)
	}
	// Writes counted once every claim is Ready: the pool's refill goes on
	// after, so its share is what it managed meanwhile.
	after := apiWrites(t, c)
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
	slices.Sort(posted)
	t.Logf("%s pool: claim POST p50 %v p99 %v; API writes during the burst (all clients): %s", pool,
		posted[n/2].Round(time.Millisecond), posted[min(n-1, n*99/100)].Round(time.Millisecond), diffWrites(before, after, n))
	t.Logf("%s pool: in the operator (its debug log): %s", pool, claimSplit(op.logPath, prefix))
}

// claimSplit reads the operator's "claim ready" debug records of the
// claims named prefix-N: p50 and p99 of the time each waited for a worker
// (seen by the watch → first reconcile) and of the work until Ready.
func claimSplit(logPath, prefix string) string {
	raw, err := os.ReadFile(logPath)
	if err != nil {
		return err.Error()
	}
	var queued, work, adopt, status []int
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.Contains(line, "claim ready") || !strings.Contains(line, "claim="+ns+"/"+prefix+"-") {
			continue
		}
		f := map[string]int{}
		for _, field := range strings.Fields(line) {
			if k, v, ok := strings.Cut(field, "="); ok {
				f[k], _ = strconv.Atoi(v)
			}
		}
		queued, work = append(queued, f["queued_ms"]), append(work, f["work_ms"])
		adopt, status = append(adopt, f["adopt_ms"]), append(status, f["status_ms"])
	}
	if len(queued) == 0 {
		return "no records"
	}
	for _, s := range [][]int{queued, work, adopt, status} {
		slices.Sort(s)
	}
	p := func(s []int, q float64) int { return s[min(len(s)-1, int(float64(len(s))*q))] }
	return fmt.Sprintf("%d claims: queued p50 %d ms p99 %d ms, work p50 %d ms p99 %d ms (of which the adoption's write p50 %d ms p99 %d ms, the status write p50 %d ms p99 %d ms)",
		len(queued), p(queued, .5), p(queued, .99), p(work, .5), p(work, .99), p(adopt, .5), p(adopt, .99), p(status, .5), p(status, .99))
}

// apiWrites reads kube-apiserver's apiserver_request_total counters of
// writes (POST, PUT, PATCH, DELETE), keyed "VERB resource[/subresource]".
func apiWrites(t *testing.T, c *cluster) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	if c.kubectl == "" {
		return out
	}
	raw, err := c.kubectlRun(t, "get", "--raw", "/metrics")
	if err != nil {
		t.Logf("metrics: %v", err)
		return out
	}
	for _, line := range strings.Split(raw, "\n") {
		metric, rest, ok := strings.Cut(line, "{")
		switch metric {
		case "apiserver_request_total", "apiserver_request_duration_seconds_sum", "apiserver_request_duration_seconds_count":
		default:
			ok = false
		}
		if !ok {
			continue
		}
		labels, val, _ := strings.Cut(rest, "} ")
		l := map[string]string{}
		for _, kv := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(kv, "=")
			l[k] = strings.Trim(v, `"`)
		}
		switch l["verb"] {
		case "POST", "PUT", "PATCH", "DELETE":
		default:
			continue
		}
		f, _ := strconv.ParseFloat(val, 64)
		if metric != "apiserver_request_total" {
			out[metric] += f
			continue
		}
		k := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			k += "/" + l["subresource"]
		}
		out[k] += f
	}
	return out
}

// diffWrites formats the writes between two readings, per claim.
func diffWrites(before, after map[string]float64, n int) string {
	var parts []string
	total := 0.0
	for k, v := range after {
		if strings.HasPrefix(k, "apiserver_") {
			continue
		}
		if d := v - before[k]; d > 0 && !strings.Contains(k, "tokenreviews") && !strings.Contains(k, "subjectaccessreviews") {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, d))
			total += d
		}
	}
	slices.Sort(parts)
	const sum, count = "apiserver_request_duration_seconds_sum", "apiserver_request_duration_seconds_count"
	mean := (after[sum] - before[sum]) / max(1, after[count]-before[count])
	return fmt.Sprintf("%.0f (%.1f per claim; mean write in the API server %.0f ms): %s", total, total/float64(n), mean*1000, strings.Join(parts, ", "))
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

// apiFloor creates n small ConfigMaps from 16 clients, as burst creates
// claims, with nothing watching them: the API server's own write latency
// and throughput on this machine, the floor under a claim burst (every
// claim is at least its POST and one operator write).
func apiFloor(t *testing.T, c *cluster, n int) {
	t.Helper()
	lat := make([]time.Duration, n)
	start := time.Now()
	fanOut(n, func(i int) {
		t0 := time.Now()
		if err := c.tryCreate(ns, map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": fmt.Sprintf("floor-%d", i), "namespace": ns},
			"data":     map[string]string{"k": "v"}}); err != nil {
			t.Error(err)
		}
		lat[i] = time.Since(t0)
	})
	total := time.Since(start)
	slices.Sort(lat)
	t.Logf("API server alone: %d ConfigMap creates (16 clients) in %v = %.0f/s; each p50 %v p99 %v", n,
		total.Round(time.Millisecond), float64(n)/total.Seconds(), lat[n/2].Round(time.Millisecond), lat[min(n-1, n*99/100)].Round(time.Millisecond))
}

// sequential claims k sandboxes of pool one after another, each from its
// POST to a watch seeing it Ready: a claim's latency without a burst
// queueing behind it.
func sequential(t *testing.T, c *cluster, pool string, k int) {
	t.Helper()
	lat := make([]time.Duration, k)
	for i := range k {
		name := fmt.Sprintf("seq-%d", i)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, rv, err := c.admin.List(ctx, operator.ResClaim, ns)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := c.tryCreate(ns, claimObj(name, pool, nil)); err != nil {
			t.Fatal(err)
		}
		for ctx.Err() == nil && lat[i] == 0 {
			err := c.admin.Watch(ctx, operator.ResClaim, ns, rv, func(ev operator.WatchEvent) {
				var cl operator.SandboxClaim
				if json.Unmarshal(ev.Object, &cl) != nil {
					return
				}
				rv = cl.Metadata.ResourceVersion
				if ok, _ := ready(cl.Status.Conditions, operator.CondReady); ok && cl.Metadata.Name == name && lat[i] == 0 {
					lat[i] = time.Since(start)
					cancel()
				}
			})
			if err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
				t.Logf("watch: %v", err)
			}
		}
		cancel()
		if lat[i] == 0 {
			t.Fatalf("claim %s not Ready in a minute", name)
		}
	}
	slices.Sort(lat)
	t.Logf("%s pool: %d claims one at a time: claim→Ready p50 %v p99 %v max %v", pool, k,
		lat[k/2].Round(time.Millisecond), lat[min(k-1, k*99/100)].Round(time.Millisecond), lat[k-1].Round(time.Millisecond))
}

// fanOut runs fn(0) … fn(n-1) on 16 goroutines, as 16 clients would.
func fanOut(n int, fn func(i int)) {
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	wg.Wait()
}
