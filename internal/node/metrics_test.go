package node

import (
	"testing"
	"time"
)

func TestCPUPct(t *testing.T) {
	t0 := time.Unix(1000, 0)
	prev := rawSample{at: t0, ok: true, cgr: true, cpu: 1e9}
	// One CPU busy for 2 s of 2 s on a 2-CPU sandbox: 50%.
	if got := cpuPct(prev, rawSample{at: t0.Add(2 * time.Second), ok: true, cgr: true, cpu: 3e9}, 2); got != 50 {
		t.Errorf("cgroup: %v", got)
	}
	// /proc/stat: busy delta over total delta.
	p2 := rawSample{at: t0, ok: true, cpu: 100, tot: 1000}
	if got := cpuPct(p2, rawSample{at: t0.Add(time.Second), ok: true, cpu: 175, tot: 1100}, 4); got != 75 {
		t.Errorf("proc: %v", got)
	}
	for name, c := range map[string][2]rawSample{
		"no previous":     {{}, {at: t0, ok: true, cgr: true, cpu: 5}},
		"source switched": {prev, {at: t0.Add(time.Second), ok: true, cpu: 5e9, tot: 1}},
		"counter reset":   {prev, {at: t0.Add(time.Second), ok: true, cgr: true, cpu: 1}},
	} {
		if got := cpuPct(c[0], c[1], 1); got != 0 {
			t.Errorf("%s: %v", name, got)
		}
	}
	// Clamped: a lying counter cannot exceed 100%.
	if got := cpuPct(prev, rawSample{at: t0.Add(time.Second), ok: true, cgr: true, cpu: 100e9}, 1); got != 100 {
		t.Errorf("clamp: %v", got)
	}
}
