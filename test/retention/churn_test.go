// Package retention churns a real `space server` (namespace driver,
// template minimal, --retention of a few seconds): thousands of sandboxes
// created and deleted in batches. The store's row counts (sandboxes,
// operations, events, read from its SQLite file) and the server's RSS are
// sampled after every batch; with pruning they stay flat, and once the
// churn stops and the retention window passes, the ended records are
// gone. It needs root (namespace driver). docs/PERFORMANCE.md has the
// numbers; SPACE_CHURN_SANDBOXES (default 2000) and SPACE_CHURN_BATCH
// (default 100) size the run.
package retention

import (
	"bytes"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/test/testenv"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// serverPID finds the `space server` process that runs with dataDir.
func serverPID(t *testing.T, dataDir string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(raw, "\x00")), "\x00")
		if len(args) > 1 && filepath.Base(args[0]) == "space" && args[1] == "server" && strings.Contains(string(raw), "\x00"+dataDir+"\x00") {
			return pid
		}
	}
	t.Fatalf("no space server process with data dir %s", dataDir)
	return 0
}

// rssKiB reads VmRSS of a process.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

type sample struct {
	created                     int
	sandboxes, operations, evts int
	stale                       int // ended sandboxes older than the window allows
	rssKiB                      int
	dbKiB                       int64
}

func (s sample) String() string {
	return fmt.Sprintf("%5d created: rows sandboxes %4d (stale %d) operations %4d events %5d; db+wal %6d KiB; server RSS %6d KiB",
		s.created, s.sandboxes, s.stale, s.operations, s.evts, s.dbKiB, s.rssKiB)
}

// cpuSeconds is a process's user and system CPU time so far.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name (which may hold spaces): state is 3rd,
	// utime 14th, stime 15th, in clock ticks (100 per second here).
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	u, _ := strconv.Atoi(f[11])
	s, _ := strconv.Atoi(f[12])
	return float64(u+s) / 100
}

func counts(t *testing.T, db *sql.DB) (sb, ops, evs int) {
	t.Helper()
	for _, q := range []struct {
		table string
		n     *int
	}{{"sandboxes", &sb}, {"operations", &ops}, {"events", &evs}} {
		if err := db.QueryRow(`SELECT COUNT(*) FROM ` + q.table).Scan(q.n); err != nil {
			t.Fatalf("count %s: %v", q.table, err)
		}
	}
	return
}

// staleSandboxes counts sandboxes that ended before cutoff: rows the
// pruner should have deleted by now.
func staleSandboxes(t *testing.T, db *sql.DB, cutoff time.Time) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM sandboxes WHERE ended_at IS NOT NULL AND ended_at < ?`, cutoff.UnixNano()).Scan(&n); err != nil {
		t.Fatalf("count stale sandboxes: %v", err)
	}
	return n
}

func fileKiB(paths ...string) int64 {
	var n int64
	for _, p := range paths {
		if st, err := os.Stat(p); err == nil {
			n += st.Size()
		}
	}
	return n >> 10
}

func TestChurnStoreStaysSmall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespace driver)")
	}
	if testing.Short() {
		t.Skip("-short: a churn of thousands of sandboxes takes minutes")
	}
	total, batch := envInt("SPACE_CHURN_SANDBOXES", 2000), envInt("SPACE_CHURN_BATCH", 100)
	const retention = 3 * time.Second
	s, err := testenv.New("spacechurn")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Remove()
	s.Args = []string{"--builtins", "minimal", "--log-format", "json", "--retention", retention.String()}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { s.Stop(); s.RemoveCgroupBase() }()
	// One project per worker: a long-poll of an operation wakes at every
	// event of its project, and the churn should measure the store, not
	// 16 clients re-reading each other's operations.
	const workers = 16
	hdrs := make([]map[string]string, workers)
	for w := range hdrs {
		key, err := s.CreateKey(fmt.Sprintf("churn%d", w))
		if err != nil {
			t.Fatal(err)
		}
		hdrs[w] = map[string]string{"X-API-Key": key}
	}
	if err := s.WaitTemplate(hdrs[0]["X-API-Key"], "minimal", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	dbPath := filepath.Join(s.DataDir, "space.db")
	db, err := sql.Open("sqlite", "file:"+dbPath+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	pid := serverPID(t, s.DataDir)

	// run does fn for every i in [0, n), workers at a time, and returns
	// the first error.
	run := func(n int, fn func(i int) error) error {
		errs := make(chan error, n)
		slots := make(chan struct{}, workers)
		for i := 0; i < n; i++ {
			slots <- struct{}{}
			go func() { errs <- fn(i); <-slots }()
		}
		for range workers { // every slot back: all done
			slots <- struct{}{}
		}
		close(errs)
		for err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
	waitOp := func(hdr map[string]string, id string) error {
		for i := 0; i < 10; i++ {
			st, m, err := testenv.DoJSON("GET", s.Ctrl+"/v1/operations/"+id+"?wait=30s", hdr, nil)
			if err != nil || st != 200 {
				return fmt.Errorf("operation %s: %d %v %v", id, st, m, err)
			}
			switch m["state"] {
			case "succeeded":
				return nil
			case "failed", "cancelled":
				return fmt.Errorf("operation %s: %v", id, m)
			}
		}
		return fmt.Errorf("operation %s not done", id)
	}
	var samples []sample
	// A row may live for the window, until the next prune after it
	// (one interval, 1 s here) and the prune's own run; anything older
	// was missed. The slack covers a prune delayed behind the churn's
	// writers on a loaded machine.
	staleAfter := retention + 2*core.PruneInterval(retention) + 3*time.Second
	take := func(created int) sample {
		sb, ops, evs := counts(t, db)
		sm := sample{created: created, sandboxes: sb, operations: ops, evts: evs, rssKiB: rssKiB(t, pid),
			stale: staleSandboxes(t, db, time.Now().Add(-staleAfter)),
			dbKiB: fileKiB(dbPath, dbPath+"-wal")}
		samples = append(samples, sm)
		t.Log(sm)
		return sm
	}
	t0 := time.Now()
	take(0)
	for done := 0; done < total; done += batch {
		ids := make([]string, batch)
		if err := run(batch, func(i int) error {
			hdr := hdrs[i%workers]
			st, m, err := testenv.DoJSON("POST", s.Ctrl+"/v1/sandboxes", hdr, map[string]any{"template": "minimal"})
			if err != nil || st != 202 {
				return fmt.Errorf("create: %d %v %v", st, m, err)
			}
			ids[i] = m["sandbox"].(map[string]any)["id"].(string)
			return waitOp(hdr, m["operation"].(map[string]any)["id"].(string))
		}); err != nil {
			t.Fatalf("batch at %d: %v\n%s", done, err, s.LogTail(4000))
		}
		if err := run(batch, func(i int) error {
			hdr := hdrs[i%workers]
			st, m, err := testenv.DoJSON("DELETE", s.Ctrl+"/v1/sandboxes/"+ids[i], hdr, nil)
			if err != nil || st != 202 {
				return fmt.Errorf("delete: %d %v %v", st, m, err)
			}
			return waitOp(hdr, m["operation"].(map[string]any)["id"].(string))
		}); err != nil {
			t.Fatalf("batch at %d: %v\n%s", done, err, s.LogTail(4000))
		}
		take(done + batch)
	}
	churn, cpu := time.Since(t0), cpuSeconds(t, pid)
	// The window passes with no churn: every ended record goes.
	time.Sleep(retention + 2*time.Second)
	final := take(total)
	t.Logf("%d sandboxes created and deleted in %v (%.1f/s); server CPU %.1f s (%.1f ms per sandbox)", total, churn.Round(time.Second),
		float64(total)/churn.Seconds(), cpu, cpu*1000/float64(total))

	// Pruned as it went: no sample holds a sandbox that ended longer ago
	// than the window allows. How many rows that is depends on the
	// churn's speed (rate × window), so the count itself is checked only
	// for growth: the second half of the churn holds no more rows than the
	// first did (with slack for the rate's noise), however many went through. After the
	// window nothing ended is left.
	maxFirst, maxSecond := 0, 0
	for i, sm := range samples {
		if sm.stale > 0 {
			t.Errorf("sample %v: %d sandboxes ended more than %v ago are still stored: not pruned as it went", sm, sm.stale, staleAfter)
		}
		if i <= len(samples)/2 {
			maxFirst = max(maxFirst, sm.sandboxes)
		} else {
			maxSecond = max(maxSecond, sm.sandboxes)
		}
	}
	if maxSecond > maxFirst*3/2+batch {
		t.Errorf("sandbox rows grew with the churn: up to %d in its first half, %d in its second", maxFirst, maxSecond)
	}
	if final.sandboxes != 0 || final.operations != 0 || final.evts != 0 {
		t.Errorf("after the retention window: %v, want no rows", final)
	}
	// RSS: the second half of the churn holds no more than the first did
	// (plus slack for the Go heap's own growth).
	half := samples[len(samples)/2]
	if final.rssKiB > half.rssKiB*5/4+16<<10 {
		t.Errorf("server RSS grew from %d KiB (half way) to %d KiB (end)", half.rssKiB, final.rssKiB)
	}
	raw, _ := os.ReadFile(s.LogPath)
	if !bytes.Contains(raw, []byte(`"msg":"store pruned"`)) {
		t.Errorf("no store pruned record in the server log")
	}
}
