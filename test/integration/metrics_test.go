package integration

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/diskquota"
)

// metricSample is one element of GET /v1/sandboxes/{id}/metrics.
type metricSample struct {
	Timestamp  time.Time `json:"timestamp"`
	CPUCount   int       `json:"cpu_count"`
	CPUUsedPct float64   `json:"cpu_used_pct"`
	MemUsed    int64     `json:"mem_used"`
	MemTotal   int64     `json:"mem_total"`
	MemCache   int64     `json:"mem_cache"`
	DiskUsed   int64     `json:"disk_used"`
	DiskTotal  int64     `json:"disk_total"`
}

func (sb *sandbox) metrics(t *testing.T, query string) []metricSample {
	t.Helper()
	st, m, err := sb.e.call("GET", "/v1/sandboxes/"+sb.ID+"/metrics"+query, sb.e.key, nil)
	if err != nil || st != 200 {
		t.Fatalf("metrics: %d %v %v", st, m, err)
	}
	raw, _ := json.Marshal(m["metrics"])
	var out []metricSample
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("metrics %s: %v", raw, err)
	}
	return out
}

// latest is the newest sample (the one taken at the request).
func (sb *sandbox) latest(t *testing.T) metricSample {
	t.Helper()
	list := sb.metrics(t, "")
	if len(list) == 0 {
		t.Fatal("metrics: no sample")
	}
	return list[len(list)-1]
}

// checkMetrics asserts real figures: a CPU burner shows at once, memory
// a command holds and a file written show in the next sample.
//
// disk: under gVisor the Sentry caches file data in the sandbox's memory
// and writes it back to the host filesystem (what statfs of "/" reports)
// when it likes, so a write shows in disk_used only eventually: checkDisk
// is false there.
//
// memory: a gVisor sandbox's host cgroup is charged only part of what the
// Sentry's application holds (the test sees about a quarter of 64 MiB
// there), so minMem is lower for it.
func checkMetrics(t *testing.T, e *env, checkDisk bool, minMem int64) {
	sb := e.create(t, nil)
	defer sb.delete(t)
	base := sb.latest(t)
	t.Logf("idle: %+v", base)
	if base.CPUCount < 1 || base.MemTotal <= 0 || base.MemUsed <= 0 || base.DiskTotal <= 0 || base.DiskUsed <= 0 || base.MemUsed > base.MemTotal {
		t.Fatalf("idle sample lacks figures: %+v", base)
	}
	if time.Since(base.Timestamp) > 10*time.Second {
		t.Errorf("newest sample is from %v", base.Timestamp)
	}
	time.Sleep(1100 * time.Millisecond)
	idle := sb.latest(t)
	sb.start(t, map[string]any{"argv": []string{"sh", "-c", "timeout 3 sh -c 'while :; do :; done'"}})
	time.Sleep(2 * time.Second)
	busy := sb.latest(t)
	t.Logf("idle cpu %.1f%%, burning %.1f%% of %d cpus", idle.CPUUsedPct, busy.CPUUsedPct, busy.CPUCount)
	// 2 s of one busy CPU, with room for a loaded host.
	if want := 20.0 / float64(busy.CPUCount); busy.CPUUsedPct < want || busy.CPUUsedPct <= idle.CPUUsedPct {
		t.Errorf("cpu while burning = %.1f%%, idle %.1f%%: want at least %.1f%%", busy.CPUUsedPct, idle.CPUUsedPct, want)
	}
	// 64 MiB held in a shell variable for a few seconds.
	sb.start(t, map[string]any{"argv": []string{"sh", "-c", "x=$(head -c 67108864 /dev/zero | tr '\\0' a); sleep 12; echo ${#x}"}})
	var mem metricSample
	for i := 0; i < 30; i++ {
		time.Sleep(500 * time.Millisecond)
		if mem = sb.latest(t); mem.MemUsed-idle.MemUsed > minMem {
			break
		}
	}
	t.Logf("memory idle %d MiB, holding 64 MiB %d MiB (cache %d MiB)", idle.MemUsed>>20, mem.MemUsed>>20, mem.MemCache>>20)
	if mem.MemUsed-idle.MemUsed < minMem {
		t.Errorf("mem_used rose by %d bytes while a command held 64 MiB", mem.MemUsed-idle.MemUsed)
	}
	before := sb.latest(t)
	if out, ex := sb.sh(t, "head -c 33554432 /dev/urandom > $HOME/big && sync"); ex.Code != 0 {
		t.Fatalf("write: %+v %s", ex, out)
	}
	time.Sleep(1100 * time.Millisecond)
	after := sb.latest(t)
	t.Logf("disk used %d MiB -> %d MiB of %d MiB", before.DiskUsed>>20, after.DiskUsed>>20, after.DiskTotal>>20)
	if checkDisk && after.DiskUsed-before.DiskUsed < 24<<20 {
		t.Errorf("disk_used rose by %d bytes after writing 32 MiB", after.DiskUsed-before.DiskUsed)
	}
	// The range selects samples; a range in the past has no fresh one.
	all := sb.metrics(t, "")
	if len(all) < 4 {
		t.Errorf("%d samples after 5 requests", len(all))
	}
	old := sb.metrics(t, fmt.Sprintf("?start=%d&end=%d", base.Timestamp.Unix(), base.Timestamp.Unix()))
	if len(old) == 0 || len(old) >= len(all) {
		t.Errorf("range of the first second: %d samples of %d", len(old), len(all))
	}
	if st, _, _ := e.call("GET", "/v1/sandboxes/"+sb.ID+"/metrics?start=yesterday", e.key, nil); st != 400 {
		t.Errorf("bad start: %d", st)
	}
	// Paused: the samples from before, none new.
	if st, m, err := e.call("POST", "/v1/sandboxes/"+sb.ID+"/pause", e.key, nil); err != nil || st != 202 {
		t.Fatalf("pause: %d %v %v", st, m, err)
	} else {
		e.waitOp(t, m["operation"].(map[string]any)["id"].(string))
	}
	p1 := sb.metrics(t, "")
	time.Sleep(1100 * time.Millisecond)
	p2 := sb.metrics(t, "")
	if len(p1) == 0 || len(p2) != len(p1) {
		t.Errorf("paused: %d then %d samples", len(p1), len(p2))
	}
	if st, m, err := e.call("POST", "/v1/sandboxes/"+sb.ID+"/resume", e.key, nil); err != nil || st != 202 {
		t.Fatalf("resume: %d %v %v", st, m, err)
	} else {
		e.waitOp(t, m["operation"].(map[string]any)["id"].(string))
	}
}

// TestMetricsNamespace runs on a server with disk limits where the host
// can loop-mount images: the sandbox's disk is then its own filesystem, so
// disk_used moves with its writes only (the host filesystem's figure moves
// with whatever else the host writes).
func TestMetricsNamespace(t *testing.T) {
	e := need(t)
	if err := diskquota.Available(); err == nil {
		e = extraServer(t, "space-itmetrics-", "namespace", "--default-disk-bytes", "128M", "--max-disk-bytes", "256M")
	} else {
		t.Logf("disk limits unavailable (%v): disk figures are the host filesystem's", err)
	}
	checkMetrics(t, e, true, 48<<20)
}

func TestMetricsGvisor(t *testing.T) { checkMetrics(t, gvisorEnv(t), false, 8<<20) }
