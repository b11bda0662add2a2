package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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
	for b.Loop() {
		if _, err := exec1(ctx, e, sb, trueArgv); err != nil {
			b.Fatal(err)
		}
	}
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

// TestSmokeStdoutPastTheOutputBound runs the stdout part of Run (streamed
// runs, the produce-then-replay halves, large writes, frames) with more
// output than the server's default 64 MiB bound: the replay must read it
// all (it read 64 MiB of 256 before the bench's server kept room for it).
func TestSmokeStdoutPastTheOutputBound(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and streams 80 MiB")
	}
	if os.Geteuid() != 0 {
		t.Skip("the namespace driver needs root")
	}
	agentBin.once.Do(buildAgent)
	if agentBin.err != nil {
		t.Fatal(agentBin.err)
	}
	cfg := Config{ExecRuns: 1, StdoutRuns: 1, StdoutBytes: 80 << 20, AgentPath: agentBin.path}
	res, err := Run(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout == nil || res.Stdout.ReplayMBps <= 0 || res.Stdout.LargeWritesMBps <= 0 {
		t.Fatalf("stdout part incomplete: %+v", res.Stdout)
	}
}
