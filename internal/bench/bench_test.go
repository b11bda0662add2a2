package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The `space` binary the sandboxes run as PID 1, built once on first use by
// a root test or benchmark.
var agentBin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if agentBin.dir != "" {
		os.RemoveAll(agentBin.dir)
	}
	os.Exit(code)
}

func buildAgent() {
	agentBin.dir, agentBin.err = os.MkdirTemp("", "space-bench-bin-")
	if agentBin.err != nil {
		return
	}
	if agentBin.err = os.Chmod(agentBin.dir, 0o755); agentBin.err != nil {
		return
	}
	agentBin.path = filepath.Join(agentBin.dir, "space")
	cmd := exec.Command("go", "build", "-o", agentBin.path, "github.com/space-sandbox/space/cmd/space")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		agentBin.err = fmt.Errorf("go build ./cmd/space: %w\n%s", err, out)
	}
}

// startEnv starts an in-process server for tb and closes it (deleting
// everything) when tb ends. It skips without root.
func startEnv(tb testing.TB, warmPool int) *Env {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("the namespace driver needs root")
	}
	agentBin.once.Do(buildAgent)
	if agentBin.err != nil {
		tb.Fatal(agentBin.err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := Start(ctx, EnvOptions{AgentPath: agentBin.path, WarmPool: warmPool})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		dir, scope := e.Dir(), e.scope
		if err := e.Close(ctx); err != nil {
			tb.Errorf("close: %v", err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			tb.Errorf("temp dir %s still there (%v)", dir, err)
		}
		for _, p := range scope.dirs {
			if _, err := os.Stat(p.dir); !os.IsNotExist(err) {
				tb.Errorf("cgroup scope %s still there (%v)", p.dir, err)
			}
		}
	})
	return e
}

func testCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

// TestSmoke runs every measured path once at a small size.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and sandboxes")
	}
	e := startEnv(t, 1)
	ctx := testCtx(t)
	sb, err := e.Client.Create(ctx, ColdTemplate)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := e.Timing(sb.ID)
	if err != nil || tm.Total <= 0 || tm.AgentReady <= 0 {
		t.Errorf("timing %+v, %v", tm, err)
	}
	if r, err := e.Client.Exec(ctx, sb, trueArgv, nil); err != nil || r.ExitCode != 0 {
		t.Fatalf("exec true: %+v, %v", r, err)
	}
	if r, err := e.Client.Exec(ctx, sb, []string{"/bin/false"}, nil); err != nil || r.ExitCode != 1 {
		t.Fatalf("exec false: %+v, %v", r, err)
	}
	const n = 3<<20 + 17
	zeros := true
	r, err := e.Client.Exec(ctx, sb, []string{"head", "-c", fmt.Sprint(n), "/dev/zero"}, func(p []byte) {
		for _, c := range p {
			if c != 0 {
				zeros = false
			}
		}
	})
	if err != nil || r.Stdout != n || !zeros {
		t.Fatalf("stdout: %d bytes (want %d), zeros %v, %v", r.Stdout, n, zeros, err)
	}
	if err := e.Client.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitPool(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	warm, err := e.Client.Create(ctx, WarmTemplate)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec1(ctx, e, warm, trueArgv); err != nil {
		t.Fatal(err)
	}
	// Left running on purpose: Close must delete it.
	ids, err := e.Client.List(ctx, "running")
	if err != nil || len(ids) != 1 || ids[0] != warm.ID {
		t.Fatalf("running sandboxes %v (%v), want [%s]", ids, err, warm.ID)
	}
}

func BenchmarkCreateDelete(b *testing.B) {
	e := startEnv(b, 0)
	ctx := testCtx(b)
	var create []time.Duration
	for b.Loop() {
		t0 := time.Now()
		sb, err := e.Client.Create(ctx, ColdTemplate)
		if err != nil {
			b.Fatal(err)
		}
		create = append(create, time.Since(t0))
		if err := e.Client.Delete(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(P50(create), "create-p50-ms")
}

func BenchmarkCreateWarm(b *testing.B) {
	const pool = 4
	e := startEnv(b, pool)
	ctx := testCtx(b)
	for b.Loop() {
		b.StopTimer()
		if err := e.WaitPool(ctx, time.Minute); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		sb, err := e.Client.Create(ctx, WarmTemplate)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := e.Client.Delete(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func BenchmarkExecTrue(b *testing.B) {
	e := startEnv(b, 0)
	ctx := testCtx(b)
	sb, err := e.Client.Create(ctx, ColdTemplate)
	if err != nil {
		b.Fatal(err)
	}
	// What a client does: one POST that streams the command's events.
	b.Run("one-request", func(b *testing.B) {
		for b.Loop() {
			if r, err := e.Client.Exec(ctx, sb, trueArgv, nil); err != nil || r.ExitCode != 0 {
				b.Fatalf("exec: %+v %v", r, err)
			}
		}
	})
	// The POST, then a GET of the events: the two halves reported apart.
	b.Run("post-then-get", func(b *testing.B) {
		var startT, followT time.Duration
		for b.Loop() {
			t0 := time.Now()
			cid, err := e.Client.StartCommand(ctx, sb, trueArgv)
			if err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			r, err := e.Client.Follow(ctx, sb, cid, nil)
			if err != nil || r.ExitCode != 0 {
				b.Fatalf("follow: %+v %v", r, err)
			}
			startT += t1.Sub(t0)
			followT += time.Since(t1)
		}
		b.ReportMetric(float64(startT.Microseconds())/float64(b.N), "start-µs/op")
		b.ReportMetric(float64(followT.Microseconds())/float64(b.N), "follow-µs/op")
	})
}

func BenchmarkStdout(b *testing.B) {
	const n = 32 << 20
	e := startEnv(b, 0)
	ctx := testCtx(b)
	sb, err := e.Client.Create(ctx, ColdTemplate)
	if err != nil {
		b.Fatal(err)
	}
	argv := []string{"head", "-c", fmt.Sprint(n), "/dev/zero"}
	b.SetBytes(n)
	for b.Loop() {
		r, err := exec1(ctx, e, sb, argv)
		if err != nil {
			b.Fatal(err)
		}
		if r.Stdout != n {
			b.Fatalf("got %d bytes", r.Stdout)
		}
	}
}

// BenchmarkPort: one GET at a time through a forwarded port (data
// listener, host form) and to the same server on the host's loopback.
func BenchmarkPort(b *testing.B) {
	e := startEnv(b, 0)
	ctx := testCtx(b)
	pt, err := startPortTargets(ctx, e, agentBin.path, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := pt.close(); err != nil {
			b.Error(err)
		}
	})
	for _, path := range []struct {
		name string
		c    *http.Client
		base string
	}{{"direct", pt.Direct, pt.DirectURL}, {"forwarded", pt.Forwarded, pt.ForwardURL}} {
		for _, size := range []struct {
			name string
			n    int64
		}{{"small", int64(len(SmallBody))}, {"1mib", LargeBytes}} {
			b.Run(path.name+"/"+size.name, func(b *testing.B) {
				b.SetBytes(size.n)
				for b.Loop() {
					if err := getBody(ctx, path.c, path.base+"/"+size.name, size.n); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestSmokeEveryPart runs every part of `space bench` (Run) once at a
// small size, so a part that breaks fails here: cold, warm, exec, stdout
// with more output than the server's default 64 MiB bound (the replay
// must read it all; it read 64 MiB of 80 before the bench's server kept
// room for it), concurrent full cycles, idle memory, forwarded ports and
// the crun baseline (skipped by Run itself, with a reason, without crun).
// No timing is asserted; the report and a comparison of the run with
// itself must print.
func TestSmokeEveryPart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server, sandboxes and streams 80 MiB")
	}
	if os.Geteuid() != 0 {
		t.Skip("the namespace driver needs root")
	}
	agentBin.once.Do(buildAgent)
	if agentBin.err != nil {
		t.Fatal(agentBin.err)
	}
	cfg := Config{N: 2, Idle: 3, IdleConcurrency: 2, ExecRuns: 2, StdoutRuns: 1, StdoutBytes: 80 << 20, WarmPool: 1,
		CrunRuns: 2, PortRequests: 50, PortClients: 2, PortServer: agentBin.path, Clients: []int{1, 2}, ClientCycles: 1,
		AgentPath: agentBin.path}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Cold == nil || res.Cold.Create.N != 2 || res.Cold.Breakdown.Total <= 0 {
		t.Errorf("cold: %+v", res.Cold)
	}
	if res.Warm == nil || res.Warm.Create.N != 2 {
		t.Errorf("warm: %+v", res.Warm)
	}
	if res.Exec == nil || res.Exec.N != 2 {
		t.Errorf("exec: %+v", res.Exec)
	}
	if res.ExecHost == nil || res.ExecHost.N != 2 || res.ExecHost.P50 <= 0 {
		t.Errorf("exec floor (true on the host): %+v", res.ExecHost)
	}
	if s := res.Stdout; s == nil || len(s.MBps) != 1 || s.ReplayMBps <= 0 || s.LargeWritesMBps <= 0 || len(s.FramesLargeWritesMBps) != 1 {
		t.Errorf("stdout part incomplete: %+v", s)
	}
	if len(res.Concurrency) != 2 {
		t.Errorf("concurrency: %+v", res.Concurrency)
	}
	for _, l := range res.Concurrency {
		if l.Cycles != minLevelCycles || l.Errors != 0 || l.Running.N != l.Cycles || l.FirstCommand.P50 < l.Running.P50 {
			t.Errorf("%d clients: %+v", l.Clients, l)
		}
	}
	if i := res.Idle; i == nil || i.Created != 3 || i.Alive != 3 {
		t.Errorf("idle: %+v", i)
	}
	if p := res.Ports; p == nil || p.Forwarded.Small.Sequential.N == 0 || p.Direct.Small.Sequential.N == 0 {
		t.Errorf("ports: %+v", p)
	}
	switch c := res.Crun; {
	case c == nil:
		t.Error("no crun result")
	case c.Skipped != "":
		t.Logf("crun baseline skipped: %s", c.Skipped)
	case c.Run.N != 2:
		t.Errorf("crun: %+v", c)
	}
	var b bytes.Buffer
	if err := WriteText(&b, res); err != nil {
		t.Fatal(err)
	}
	if err := WriteCompare(&b, res, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Machine.DataFS, " on /") {
		t.Errorf("machine: no data dir filesystem: %+v", res.Machine)
	}
	for _, want := range []string{"cold create→ready", "concurrent full cycles", "forwarded port", "change against", "+0.0 %", "the same /bin/true run on the host", "`true` on the host p50", "data dir: "} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	if res.Crun != nil && res.Crun.Skipped == "" && !strings.Contains(b.String(), "×") {
		t.Errorf("no ratio to crun in the report:\n%s", b.String())
	}
}
