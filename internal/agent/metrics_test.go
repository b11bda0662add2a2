package agent

import "testing"

func TestParseProcStat(t *testing.T) {
	busy, total := parseProcStat([]byte("cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 1 2 3 4\n"))
	if busy != (100+5+50+3+2)*1e7 || total != 1000*1e7 {
		t.Errorf("busy %d total %d", busy, total)
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu x y z w v", "cpu 1 2"} {
		if b, tot := parseProcStat([]byte(bad)); b != 0 || tot != 0 {
			t.Errorf("%q: %d %d", bad, b, tot)
		}
	}
}

func TestParseMeminfo(t *testing.T) {
	total, used, cache := parseMeminfo([]byte("MemTotal:       1000 kB\nMemFree: 100 kB\nMemAvailable:    600 kB\nCached: 300 kB\nbogus\n"))
	if total != 1000<<10 || used != 400<<10 || cache != 300<<10 {
		t.Errorf("total %d used %d cache %d", total, used, cache)
	}
	// MemAvailable larger than MemTotal (a lying sandbox): no used figure.
	if _, used, _ := parseMeminfo([]byte("MemTotal: 10 kB\nMemAvailable: 20 kB\n")); used != 0 {
		t.Errorf("used %d", used)
	}
}
