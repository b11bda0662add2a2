package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/agent/client"
)

func TestHealth(t *testing.T) {
	a := startAgent(t, agent.Options{Version: "v-test"})
	if err := a.Health(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

func TestArgvAndShell(t *testing.T) {
	a := startAgent(t, agent.Options{})
	res := run(t, a, agent.ProcessSpec{Argv: []string{"echo", "hello", "world"}})
	if res.stdout.String() != "hello world\n" || res.exit.Code != 0 || res.exit.Signal != "" {
		t.Errorf("echo: stdout %q exit %+v", res.stdout.String(), res.exit)
	}
	res = run(t, a, agent.ProcessSpec{Shell: "echo out; echo err >&2; exit 3"})
	if res.stdout.String() != "out\n" || res.stderr.String() != "err\n" || res.exit.Code != 3 {
		t.Errorf("shell: stdout %q stderr %q exit %+v", res.stdout.String(), res.stderr.String(), res.exit)
	}
	// The exit event is last and seqs count up from 1.
	for i, ev := range res.events {
		if ev.Seq != uint64(i+1) {
			t.Errorf("event %d has seq %d", i, ev.Seq)
		}
	}
	if last := res.events[len(res.events)-1]; last.Type != agent.EventExit {
		t.Errorf("last event type %d", last.Type)
	}
}

func TestEnvCwdConfig(t *testing.T) {
	a := startAgent(t, agent.Options{})
	ctx := testCtx(t)
	dir := t.TempDir()
	if err := a.SetConfig(ctx, agent.Config{Env: map[string]string{"A": "config", "B": "config"}, Cwd: dir}); err != nil {
		t.Fatal(err)
	}
	res := run(t, a, agent.ProcessSpec{Shell: `echo "$A $B $PATH $HOME"; pwd`, Env: map[string]string{"B": "spec"}})
	want := "config spec /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
	if !strings.HasPrefix(res.stdout.String(), want) || !strings.HasSuffix(res.stdout.String(), dir+"\n") {
		t.Errorf("stdout %q", res.stdout.String())
	}
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	if res := run(t, a, agent.ProcessSpec{Argv: []string{"pwd"}, Cwd: sub}); res.stdout.String() != sub+"\n" {
		t.Errorf("pwd %q", res.stdout.String())
	}
	// A bad config is refused and the old one kept.
	if err := a.SetConfig(ctx, agent.Config{Cwd: "relative"}); !client.IsBadRequest(err) {
		t.Errorf("relative cwd config: %v", err)
	}
}

func TestExecFailures(t *testing.T) {
	a := startAgent(t, agent.Options{})
	ctx := testCtx(t)
	for _, spec := range []agent.ProcessSpec{
		{Argv: []string{"/nonexistent/binary"}},
		{Argv: []string{"no-such-command-anywhere"}},
		{Argv: []string{"/etc/passwd"}}, // not executable
	} {
		if _, err := a.Start(ctx, spec); !client.HasCode(err, agent.CodeExecFailed) || !client.IsBadRequest(err) {
			t.Errorf("Start(%v) = %v, want exec_failed", spec.Argv, err)
		}
	}
	if _, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"true"}, Cwd: "/nonexistent"}); !client.HasCode(err, agent.CodeInvalidCwd) {
		t.Errorf("bad cwd: %v", err)
	}
	if _, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"true"}, User: "no-such-user-xyz"}); !client.HasCode(err, agent.CodeUnknownUser) {
		t.Errorf("bad user: %v", err)
	}
	// Shell commands that do not exist are the shell's business: exit 127.
	if res := run(t, a, agent.ProcessSpec{Shell: "no-such-command-anywhere 2>/dev/null"}); res.exit.Code != 127 {
		t.Errorf("shell exit %+v", res.exit)
	}
}

func TestSignals(t *testing.T) {
	a := startAgent(t, agent.Options{})
	ctx := testCtx(t)
	res := run(t, a, agent.ProcessSpec{Shell: "kill -TERM $$"})
	if res.exit.Code != -1 || res.exit.Signal != "SIGTERM" || res.exit.TimedOut {
		t.Errorf("self-kill exit %+v", res.exit)
	}
	for _, sig := range []string{"SIGTERM", "INT", "9"} {
		info, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"sleep", "100"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Signal(ctx, info.ID, sig); err != nil {
			t.Fatalf("Signal %s: %v", sig, err)
		}
		res := collect(t, ctx, a, info.ID, 0)
		want := map[string]string{"SIGTERM": "SIGTERM", "INT": "SIGINT", "9": "SIGKILL"}[sig]
		if res.exit.Code != -1 || res.exit.Signal != want {
			t.Errorf("after %s: exit %+v", sig, res.exit)
		}
		if err := a.Signal(ctx, info.ID, "SIGTERM"); !client.HasCode(err, agent.CodeNotRunning) {
			t.Errorf("signal after exit: %v", err)
		}
	}
	// Signals reach the whole process group, not only the shell.
	info, err := a.Start(ctx, agent.ProcessSpec{Shell: "sleep 100; echo survived"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	a.Signal(ctx, info.ID, "SIGKILL")
	if res := collect(t, ctx, a, info.ID, 0); res.stdout.Len() != 0 || res.exit.Signal != "SIGKILL" {
		t.Errorf("group kill: %q %+v", res.stdout.String(), res.exit)
	}
	// Numeric JSON signal and bad signals over raw HTTP.
	info, _ = a.Start(ctx, agent.ProcessSpec{Argv: []string{"sleep", "100"}})
	if st, code := a.raw(t, "POST", "/v1/processes/"+info.ID+"/signal", strings.NewReader(`{"signal":"SIGBOGUS"}`)); st != 400 {
		t.Errorf("bogus signal: %d %s", st, code)
	}
	if st, _ := a.raw(t, "POST", "/v1/processes/"+info.ID+"/signal", strings.NewReader(`{"signal":15}`)); st != 204 {
		t.Errorf("numeric signal: %d", st)
	}
	if res := collect(t, ctx, a, info.ID, 0); res.exit.Signal != "SIGTERM" {
		t.Errorf("numeric SIGTERM: %+v", res.exit)
	}
}

func TestTimeout(t *testing.T) {
	a := startAgent(t, agent.Options{})
	start := time.Now()
	res := run(t, a, agent.ProcessSpec{Shell: "echo before; sleep 30; echo after", TimeoutMs: 200})
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("timeout took %v", el)
	}
	if !res.exit.TimedOut || res.exit.Code != -1 || res.exit.Signal != "SIGKILL" || res.stdout.String() != "before\n" {
		t.Errorf("exit %+v stdout %q", res.exit, res.stdout.String())
	}
	if res := run(t, a, agent.ProcessSpec{Argv: []string{"true"}, TimeoutMs: 10000}); res.exit.TimedOut || res.exit.Code != 0 {
		t.Errorf("fast command exit %+v", res.exit)
	}
}

func TestStdin(t *testing.T) {
	a := startAgent(t, agent.Options{})
	ctx := testCtx(t)
	info, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 200<<10) // 3.2 MiB: several chunks, more than a pipe holds
	var wg sync.WaitGroup
	wg.Add(1)
	var writeErr error
	go func() {
		defer wg.Done()
		if writeErr = a.WriteStdin(ctx, info.ID, []byte("hello\n")); writeErr != nil {
			return
		}
		if writeErr = a.WriteStdin(ctx, info.ID, big); writeErr != nil {
			return
		}
		writeErr = a.CloseStdin(ctx, info.ID)
	}()
	res := collect(t, ctx, a, info.ID, 0)
	wg.Wait()
	if writeErr != nil {
		t.Fatal(writeErr)
	}
	if res.exit.Code != 0 || !bytes.Equal(res.stdout.Bytes(), append([]byte("hello\n"), big...)) {
		t.Errorf("cat: exit %+v, %d bytes", res.exit, res.stdout.Len())
	}
	if err := a.WriteStdin(ctx, info.ID, []byte("x")); !client.IsConflict(err) {
		t.Errorf("write after exit: %v", err)
	}

	// Closing twice, writing after close, and a process without stdin.
	info, _ = a.Start(ctx, agent.ProcessSpec{Argv: []string{"sleep", "100"}, Stdin: true})
	if err := a.CloseStdin(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if err := a.CloseStdin(ctx, info.ID); !client.HasCode(err, agent.CodeStdinClosed) {
		t.Errorf("second close: %v", err)
	}
	if err := a.WriteStdin(ctx, info.ID, []byte("x")); !client.HasCode(err, agent.CodeStdinClosed) {
		t.Errorf("write after close: %v", err)
	}
	a.Signal(ctx, info.ID, "SIGKILL")
	info, _ = a.Start(ctx, agent.ProcessSpec{Argv: []string{"cat"}})
	if err := a.WriteStdin(ctx, info.ID, []byte("x")); !client.HasCode(err, agent.CodeNoStdin) {
		t.Errorf("write without stdin: %v", err)
	}
	if res := collect(t, ctx, a, info.ID, 0); res.exit.Code != 0 || res.stdout.Len() != 0 {
		t.Errorf("cat </dev/null: %+v %q", res.exit, res.stdout.String())
	}
	// A stdin chunk over the limit is refused with 413.
	info, _ = a.Start(ctx, agent.ProcessSpec{Argv: []string{"sleep", "100"}, Stdin: true})
	if st, code := a.raw(t, "POST", "/v1/processes/"+info.ID+"/stdin", bytes.NewReader(make([]byte, agent.MaxStdinChunk+1))); st != 413 || code != agent.CodeTooLarge {
		t.Errorf("oversized stdin: %d %s", st, code)
	}
	a.Signal(ctx, info.ID, "SIGKILL")
}

func TestStdinWriteCancelled(t *testing.T) {
	a := startAgent(t, agent.Options{})
	ctx := testCtx(t)
	// sleep never reads: the pipe fills and the write blocks until the
	// request's context ends.
	info, _ := a.Start(ctx, agent.ProcessSpec{Argv: []string{"sleep", "100"}, Stdin: true})
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := a.WriteStdin(wctx, info.ID, make([]byte, agent.MaxStdinChunk))
	cancel()
	if err == nil {
		t.Fatal("write into a full pipe succeeded")
	}
	// The stdin is still usable after a cancelled write.
	if err := a.CloseStdin(ctx, info.ID); err != nil {
		t.Errorf("close after cancelled write: %v", err)
	}
	a.Signal(ctx, info.ID, "SIGKILL")
	collect(t, ctx, a, info.ID, 0)
}

func TestPTY(t *testing.T) {
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		t.Skip("no /dev/ptmx:", err)
	}
	a := startAgent(t, agent.Options{})
	ctx := testCtx(t)
	info, err := a.Start(ctx, agent.ProcessSpec{
		Shell: `test -t 0 && echo tty; echo "term=$TERM"; stty size; read x; stty size`,
		PTY:   &agent.PTY{Cols: 80, Rows: 24},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !info.PTY {
		t.Error("info.PTY false")
	}
	er, err := a.Events(ctx, info.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer er.Close()
	var out strings.Builder
	readUntil := func(s string) {
		for !strings.Contains(out.String(), s) {
			ev, err := er.Next()
			if err != nil {
				t.Fatalf("waiting for %q in %q: %v", s, out.String(), err)
			}
			if ev.Type == agent.EventStderr {
				t.Errorf("stderr event on a PTY")
			}
			out.Write(ev.Data)
		}
	}
	readUntil("24 80")
	if err := a.Resize(ctx, info.ID, 120, 50); err != nil {
		t.Fatal(err)
	}
	if err := a.WriteStdin(ctx, info.ID, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	readUntil("50 120")
	if !strings.Contains(out.String(), "tty") || !strings.Contains(out.String(), "term=xterm-256color") {
		t.Errorf("output %q", out.String())
	}
	for {
		ev, err := er.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == agent.EventExit {
			if e, _ := client.ExitStatus(ev); e.Code != 0 {
				t.Errorf("exit %+v", e)
			}
		}
	}
	// Resize of a non-PTY process is a conflict.
	info, _ = a.Start(ctx, agent.ProcessSpec{Argv: []string{"sleep", "100"}})
	if err := a.Resize(ctx, info.ID, 10, 10); !client.HasCode(err, agent.CodeNotPTY) {
		t.Errorf("resize without pty: %v", err)
	}
	a.Signal(ctx, info.ID, "SIGKILL")
}

func TestPTYStdinEOF(t *testing.T) {
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		t.Skip("no /dev/ptmx:", err)
	}
	a := startAgent(t, agent.Options{})
	ctx := testCtx(t)
	info, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"cat"}, PTY: &agent.PTY{Cols: 80, Rows: 24}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.CloseStdin(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if res := collect(t, ctx, a, info.ID, 0); res.exit.Code != 0 {
		t.Errorf("cat on pty after EOF: %+v", res.exit)
	}
}

func TestConcurrentProcesses(t *testing.T) {
	a := startAgent(t, agent.Options{})
	const n = 32
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := run(t, a, agent.ProcessSpec{Shell: fmt.Sprintf("echo %d; echo e%d >&2; exit %d", i, i, i%7)})
			if res.stdout.String() != fmt.Sprintf("%d\n", i) || res.stderr.String() != fmt.Sprintf("e%d\n", i) || res.exit.Code != i%7 {
				errs <- fmt.Sprintf("process %d: %q %q %+v", i, res.stdout.String(), res.stderr.String(), res.exit)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestProcessListAndGet(t *testing.T) {
	a := startAgent(t, agent.Options{MaxExited: 3})
	ctx := testCtx(t)
	var last agent.ProcessInfo
	for i := 0; i < 5; i++ {
		info, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"true"}, Tag: fmt.Sprint("t", i)})
		if err != nil {
			t.Fatal(err)
		}
		collect(t, ctx, a, info.ID, 0)
		last = info
	}
	running, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	list, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Only the 3 most recent exited ones are kept, plus the running one.
	if len(list) != 4 || list[0].ID != "3" || list[3].ID != running.ID || !list[3].Running || list[0].Running || list[0].Exit == nil {
		t.Errorf("list %+v", list)
	}
	got, err := a.Get(ctx, last.ID)
	if err != nil || got.Tag != "t4" || got.Running || got.Exit == nil || got.Exit.Code != 0 || got.PID != last.PID {
		t.Errorf("Get = %+v, %v", got, err)
	}
	if _, err := a.Get(ctx, "1"); !client.IsNotFound(err) {
		t.Errorf("evicted process: %v", err)
	}
	if _, err := a.Get(ctx, "999"); !client.IsNotFound(err) {
		t.Errorf("unknown process: %v", err)
	}
	if _, err := a.Events(ctx, "999", 0); !client.IsNotFound(err) {
		t.Errorf("events of unknown process: %v", err)
	}
	a.Signal(ctx, running.ID, "KILL")
}

func TestRetainExitedBytes(t *testing.T) {
	a := startAgent(t, agent.Options{RetainExitedBytes: 100 << 10})
	ctx := testCtx(t)
	var ids []string
	for i := 0; i < 3; i++ {
		res := run(t, a, agent.ProcessSpec{Argv: []string{"head", "-c", "40000", "/dev/zero"}})
		if res.stdout.Len() != 40000 {
			t.Fatalf("%d bytes", res.stdout.Len())
		}
		list, _ := a.List(ctx)
		ids = append(ids, list[len(list)-1].ID)
	}
	// 3 x 40 kB exceed 100 KiB: the oldest is forgotten.
	if _, err := a.Get(ctx, ids[0]); !client.IsNotFound(err) {
		t.Errorf("oldest still there: %v", err)
	}
	if res := collect(t, ctx, a, ids[2], 0); res.stdout.Len() != 40000 {
		t.Errorf("newest re-read: %d bytes", res.stdout.Len())
	}
}

func TestTooManyProcesses(t *testing.T) {
	a := startAgent(t, agent.Options{MaxProcesses: 2})
	ctx := testCtx(t)
	var ids []string
	for i := 0; i < 2; i++ {
		info, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"sleep", "100"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	if _, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"true"}}); !client.IsTooManyProcesses(err) {
		t.Errorf("third process: %v", err)
	}
	a.Signal(ctx, ids[0], "KILL")
	collect(t, ctx, a, ids[0], 0)
	if _, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"true"}}); err != nil {
		t.Errorf("after one exited: %v", err)
	}
	a.Signal(ctx, ids[1], "KILL")
}

func TestEventResume(t *testing.T) {
	a := startAgent(t, agent.Options{})
	ctx := testCtx(t)
	info, err := a.Start(ctx, agent.ProcessSpec{Shell: "for i in 1 2 3 4 5 6; do echo $i; sleep 0.01; done"})
	if err != nil {
		t.Fatal(err)
	}
	all := collect(t, ctx, a, info.ID, 0)
	if len(all.events) < 4 {
		t.Fatalf("only %d events", len(all.events))
	}
	for _, after := range []uint64{1, 2, uint64(len(all.events) - 1)} {
		rest := collect(t, ctx, a, info.ID, after)
		want := all.events[after:]
		if len(rest.events) != len(want) {
			t.Fatalf("after=%d: %d events, want %d", after, len(rest.events), len(want))
		}
		for i := range want {
			if rest.events[i].Seq != want[i].Seq || rest.events[i].Type != want[i].Type || !bytes.Equal(rest.events[i].Data, want[i].Data) {
				t.Errorf("after=%d: event %d differs", after, i)
			}
		}
	}
	// Past the end: an empty, well-formed stream.
	er, err := a.Events(ctx, info.ID, uint64(len(all.events)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := er.Next(); err == nil || err == io.EOF {
		t.Errorf("read past the end: %v", err)
	}
	er.Close()
}

func TestEventsGone(t *testing.T) {
	a := startAgent(t, agent.Options{RetainBytes: 64 << 10, ReaderGrace: 50 * time.Millisecond})
	ctx := testCtx(t)
	// Nobody reads while 1 MiB is produced: once the reader grace is over,
	// the oldest events are dropped rather than blocking the command.
	info, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"head", "-c", "1048576", "/dev/zero"}})
	if err != nil {
		t.Fatal(err)
	}
	var got agent.ProcessInfo
	waitFor(t, "exit", 10*time.Second, func() bool {
		got, err = a.Get(ctx, info.ID)
		return err == nil && !got.Running
	})
	if _, err := a.Events(ctx, info.ID, 0); !client.IsGone(err) || !client.HasCode(err, agent.CodeEventsGone) {
		t.Fatalf("Events(0) = %v, want events_gone", err)
	}
	// The tail is still there, ending with the exit event.
	var after uint64
	for after = 1; ; after++ {
		er, err := a.Events(ctx, info.ID, after)
		if client.IsGone(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		er.Close()
		break
	}
	if after < 2 {
		t.Fatalf("nothing was dropped")
	}
	rest := collect(t, ctx, a, info.ID, after)
	// Whole events are kept: the tail is the retained bytes plus at most
	// one output event (reads grow to MaxOutputChunk on a busy host).
	if n := len(rest.events); n == 0 || rest.events[n-1].Type != agent.EventExit || rest.stdout.Len() > 64<<10+agent.MaxOutputChunk || rest.exit.Code != 0 {
		t.Errorf("tail: %d events, %d bytes, exit %+v", len(rest.events), rest.stdout.Len(), rest.exit)
	}
}

// TestLargeOutput streams ~50 MB through a retention buffer far smaller than
// the output, so it only works if backpressure, not dropping, applies while
// a reader follows.
func TestLargeOutput(t *testing.T) {
	a := startAgent(t, agent.Options{RetainBytes: 1 << 20})
	ctx := testCtx(t)
	info, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"seq", "1", "7000000"}})
	if err != nil {
		t.Fatal(err)
	}
	er, err := a.Events(ctx, info.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer er.Close()
	pr, pw := io.Pipe()
	checked := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		n := 0
		for sc.Scan() {
			n++
			if sc.Text() != strconv.Itoa(n) {
				checked <- fmt.Errorf("line %d is %q", n, sc.Text())
				io.Copy(io.Discard, pr)
				return
			}
		}
		if n != 7000000 {
			checked <- fmt.Errorf("%d lines", n)
			return
		}
		checked <- sc.Err()
	}()
	total := 0
	start := time.Now()
	for {
		ev, err := er.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case agent.EventStdout:
			total += len(ev.Data)
			pw.Write(ev.Data)
		case agent.EventExit:
			if e, _ := client.ExitStatus(ev); e.Code != 0 {
				t.Errorf("exit %+v", e)
			}
		default:
			t.Errorf("unexpected event type %d", ev.Type)
		}
	}
	pw.Close()
	if err := <-checked; err != nil {
		t.Error(err)
	}
	el := time.Since(start)
	t.Logf("%d bytes in %v (%.0f MB/s, including seq itself)", total, el, float64(total)/el.Seconds()/1e6)
}

func TestBackgroundChildHoldsPipe(t *testing.T) {
	a := startAgent(t, agent.Options{ExitGrace: 100 * time.Millisecond})
	start := time.Now()
	// The background sleep inherits stdout; the exit must not wait for it.
	res := run(t, a, agent.ProcessSpec{Shell: "sleep 3 & echo done"})
	if el := time.Since(start); el > 2500*time.Millisecond {
		t.Errorf("exit event with a silent background child took %v", el)
	}
	if res.stdout.String() != "done\n" || res.exit.Code != 0 {
		t.Errorf("stdout %q exit %+v", res.stdout.String(), res.exit)
	}
	// Continuous background output cannot hold the exit event back either.
	start = time.Now()
	res = run(t, a, agent.ProcessSpec{Shell: "(yes & sleep 3; kill $!) & echo done"})
	if el := time.Since(start); el > 2500*time.Millisecond {
		t.Errorf("exit event with chatty background took %v", el)
	}
	if !strings.HasPrefix(res.stdout.String(), "done\n") && !strings.Contains(res.stdout.String(), "done\n") {
		t.Errorf("stdout lacks done: %d bytes", res.stdout.Len())
	}
}

func TestServeKillsBackgroundChildren(t *testing.T) {
	a := startAgent(t, agent.Options{ExitGrace: 50 * time.Millisecond})
	res := run(t, a, agent.ProcessSpec{Shell: "sleep 100 & echo $!"})
	pid, err := strconv.Atoi(strings.TrimSpace(res.stdout.String()))
	if err != nil {
		t.Fatal(err)
	}
	if !alive(pid) {
		t.Fatal("background child already gone")
	}
	a.stop()
	waitFor(t, "background child killed", 5*time.Second, func() bool { return !alive(pid) })
}

func TestOrphansReaped(t *testing.T) {
	if !agent.ReapsAll() {
		t.Skip("reaper waits only on spawned children in this run")
	}
	a := startAgent(t, agent.Options{})
	res := run(t, a, agent.ProcessSpec{Shell: "sleep 0.2 >/dev/null 2>&1 & echo $!"})
	pid, err := strconv.Atoi(strings.TrimSpace(res.stdout.String()))
	if err != nil {
		t.Fatal(err)
	}
	// The orphan was reparented to this process (a subreaper, like PID 1)
	// and must be reaped, not left a zombie.
	waitFor(t, "orphan reaped", 5*time.Second, func() bool { return !exists(pid) })
}

func TestServeKillsProcesses(t *testing.T) {
	a := startAgent(t, agent.Options{})
	ctx := testCtx(t)
	info, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	er, err := a.Events(ctx, info.ID, 0) // a stream left open must not block shutdown
	if err != nil {
		t.Fatal(err)
	}
	defer er.Close()
	a.stop()
	waitFor(t, "process killed", 5*time.Second, func() bool { return !alive(info.PID) })
}

func TestFiles(t *testing.T) {
	a := startAgent(t, agent.Options{})
	ctx := testCtx(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "a", "b", "file.txt")
	content := bytes.Repeat([]byte("space "), 100000)
	if err := a.Upload(ctx, p, 0o640, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("uploaded file: %v %v", fi, err)
	}
	rc, size, err := a.Download(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || size != int64(len(content)) || !bytes.Equal(got, content) {
		t.Fatalf("download: size %d, %d bytes, %v", size, len(got), err)
	}
	// Overwrite atomically; empty file.
	if err := a.Upload(ctx, p, 0o600, strings.NewReader("")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); len(b) != 0 {
		t.Errorf("overwrite left %d bytes", len(b))
	}

	st, err := a.Stat(ctx, p)
	if err != nil || st.Type != "file" || st.Size != 0 || st.Mode != 0o600 || st.Name != "file.txt" || st.Path != p {
		t.Errorf("Stat = %+v, %v", st, err)
	}
	os.Symlink("/etc/passwd", filepath.Join(dir, "link"))
	st, err = a.Stat(ctx, filepath.Join(dir, "link"))
	if err != nil || st.Type != "symlink" || st.Target != "/etc/passwd" {
		t.Errorf("Stat(link) = %+v, %v", st, err)
	}
	if err := a.Mkdir(ctx, filepath.Join(dir, "m", "n", "o")); err != nil {
		t.Fatal(err)
	}
	if err := a.Mkdir(ctx, filepath.Join(dir, "m")); err != nil {
		t.Errorf("mkdir of existing dir: %v", err)
	}
	if err := a.Mkdir(ctx, p); !client.IsConflict(err) {
		t.Errorf("mkdir over a file: %v", err)
	}
	ents, err := a.ListDir(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name+":"+e.Type)
	}
	if strings.Join(names, ",") != "a:dir,link:symlink,m:dir" {
		t.Errorf("ListDir = %v", names)
	}
	if _, err := a.ListDir(ctx, p); !client.HasCode(err, agent.CodeNotADirectory) {
		t.Errorf("ListDir(file): %v", err)
	}
	moved := filepath.Join(dir, "moved.txt")
	if err := a.Move(ctx, p, moved); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Stat(ctx, p); !client.IsNotFound(err) {
		t.Errorf("Stat(moved away): %v", err)
	}
	if err := a.Move(ctx, p, moved); !client.IsNotFound(err) {
		t.Errorf("Move(missing): %v", err)
	}
	if err := a.Remove(ctx, filepath.Join(dir, "m"), false); !client.HasCode(err, agent.CodeNotEmpty) {
		t.Errorf("Remove(non-empty, non-recursive): %v", err)
	}
	if err := a.Remove(ctx, filepath.Join(dir, "m"), true); err != nil {
		t.Fatal(err)
	}
	if err := a.Remove(ctx, moved, false); err != nil {
		t.Fatal(err)
	}
	if err := a.Remove(ctx, moved, false); !client.IsNotFound(err) {
		t.Errorf("Remove(missing): %v", err)
	}
	// Removing a symlink removes the link, never its target.
	if err := a.Remove(ctx, filepath.Join(dir, "link"), true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatal("symlink target removed!")
	}
	if _, _, err := a.Download(ctx, dir); !client.HasCode(err, agent.CodeIsADirectory) {
		t.Errorf("Download(dir): %v", err)
	}
	if _, _, err := a.Download(ctx, filepath.Join(dir, "nope")); !client.IsNotFound(err) {
		t.Errorf("Download(missing): %v", err)
	}
	if _, _, err := a.Download(ctx, "/dev/zero"); !client.HasCode(err, agent.CodeNotAFile) {
		t.Errorf("Download(/dev/zero): %v", err)
	}
	if err := a.Upload(ctx, dir, 0o644, strings.NewReader("x")); !client.HasCode(err, agent.CodeIsADirectory) {
		t.Errorf("Upload over a dir: %v", err)
	}
	// Uploading over a symlink replaces the link and leaves its target alone.
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("keep"), 0o644)
	os.Symlink(target, filepath.Join(dir, "l2"))
	if err := a.Upload(ctx, filepath.Join(dir, "l2"), 0o644, strings.NewReader("new")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Errorf("upload followed a symlink: target now %q", b)
	}
	// No temporary files are left behind.
	ents, _ = a.ListDir(ctx, dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name, ".space-upload") {
			t.Errorf("left %s", e.Name)
		}
	}
	// Sizeless procfs files stream without a Content-Length.
	rc, size, err = a.Download(ctx, "/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if (size != -1 && size != int64(len(b))) || !bytes.Contains(b, []byte("Pid:")) {
		t.Errorf("procfs download: size %d, %q", size, b)
	}
}

func TestListTruncated(t *testing.T) {
	a := startAgent(t, agent.WithMaxListEntries(agent.Options{}, 10))
	dir := t.TempDir()
	for i := 0; i < 10; i++ {
		os.WriteFile(filepath.Join(dir, strconv.Itoa(i)), nil, 0o644)
	}
	l, err := a.ListDirTruncated(testCtx(t), dir)
	if err != nil || len(l.Entries) != 10 || l.Truncated {
		t.Errorf("exactly the cap: %d entries, truncated %v, %v", len(l.Entries), l.Truncated, err)
	}
	os.WriteFile(filepath.Join(dir, "one-more"), nil, 0o644)
	l, err = a.ListDirTruncated(testCtx(t), dir)
	if err != nil || len(l.Entries) != 10 || !l.Truncated {
		t.Errorf("over the cap: %d entries, truncated %v, %v", len(l.Entries), l.Truncated, err)
	}
}

func TestBadRequests(t *testing.T) {
	a := startAgent(t, agent.Options{})
	cases := []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"GET", "/v1/files?path=/tmp/../etc/passwd", "", 400, agent.CodeInvalidPath},
		{"GET", "/v1/files?path=tmp/x", "", 400, agent.CodeInvalidPath},
		{"GET", "/v1/files?path=", "", 400, agent.CodeInvalidPath},
		{"GET", "/v1/files?path=/tmp/a%00b", "", 400, agent.CodeInvalidPath},
		{"GET", "/v1/files?path=/" + strings.Repeat("a", agent.MaxPathBytes), "", 400, agent.CodeInvalidPath},
		{"GET", "/v1/files/stat?path=..", "", 400, agent.CodeInvalidPath},
		{"GET", "/v1/files/list?path=/a/..", "", 400, agent.CodeInvalidPath},
		{"DELETE", "/v1/files?path=/", "", 400, agent.CodeInvalidPath},
		{"DELETE", "/v1/files?path=/tmp&recursive=maybe", "", 400, agent.CodeBadRequest},
		{"PUT", "/v1/files?path=/tmp/x&mode=999", "", 400, agent.CodeBadRequest},
		{"POST", "/v1/files/mkdir", `{"path":"/a/../b"}`, 400, agent.CodeInvalidPath},
		{"POST", "/v1/files/mkdir", `{"path":"/tmp/x","mode":1}`, 400, agent.CodeBadRequest},
		{"POST", "/v1/files/move", `{"from":"/tmp/a","to":"rel"}`, 400, agent.CodeInvalidPath},
		{"POST", "/v1/processes", `{"argv":["true"],"bogus":1}`, 400, agent.CodeBadRequest},
		{"POST", "/v1/processes", `{"argv":["true"],"shell":"true"}`, 400, agent.CodeBadRequest},
		{"POST", "/v1/processes", `{}`, 400, agent.CodeBadRequest},
		{"POST", "/v1/processes", `{"argv":["true"]} {"argv":["x"]}`, 400, agent.CodeBadRequest},
		{"POST", "/v1/processes", `{"argv":["true"],"cwd":"tmp"}`, 400, agent.CodeBadRequest},
		{"POST", "/v1/processes", `{"argv":["true"],"env":{"A=B":"x"}}`, 400, agent.CodeBadRequest},
		{"POST", "/v1/processes", `{"argv":["true"],"pty":{"cols":0,"rows":0}}`, 400, agent.CodeBadRequest},
		{"POST", "/v1/processes", `not json`, 400, agent.CodeBadRequest},
		{"PUT", "/v1/config", `{"cwd":"/","unknown":true}`, 400, agent.CodeBadRequest},
		{"GET", "/v1/processes/1/events?after=-1", "", 404, agent.CodeNotFound},
		{"GET", "/v1/nope", "", 404, agent.CodeNotFound},
		{"DELETE", "/v1/processes", "", 405, agent.CodeMethodNotAllowed},
		{"GET", "/v1/config", "", 405, agent.CodeMethodNotAllowed},
	}
	for _, c := range cases {
		var body io.Reader
		if c.body != "" {
			body = strings.NewReader(c.body)
		}
		st, code := a.raw(t, c.method, c.path, body)
		if st != c.status || code != c.code {
			t.Errorf("%s %s %s: %d %s, want %d %s", c.method, truncateStr(c.path, 60), c.body, st, code, c.status, c.code)
		}
	}
	// Huge bodies: 413.
	huge := `{"argv":["` + strings.Repeat("a", agent.MaxJSONBody) + `"]}`
	if st, code := a.raw(t, "POST", "/v1/processes", strings.NewReader(huge)); st != 413 || code != agent.CodeTooLarge {
		t.Errorf("huge spec: %d %s", st, code)
	}
	if st, code := a.raw(t, "PUT", "/v1/config", strings.NewReader(huge)); st != 413 || code != agent.CodeTooLarge {
		t.Errorf("huge config: %d %s", st, code)
	}
	// Bad after parameter on an existing process.
	info, err := a.Start(testCtx(t), agent.ProcessSpec{Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := a.raw(t, "GET", "/v1/processes/"+info.ID+"/events?after=x", nil); st != 400 {
		t.Errorf("after=x: %d", st)
	}
	collect(t, testCtx(t), a, info.ID, 0)
}

func TestUploadLimit(t *testing.T) {
	a := startAgent(t, agent.Options{MaxUploadBytes: 1000})
	dir := t.TempDir()
	err := a.Upload(testCtx(t), filepath.Join(dir, "f"), 0o644, io.LimitReader(neverEnding{}, 5000))
	if !client.IsTooLarge(err) {
		t.Errorf("oversized upload: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left %d files", len(ents))
	}
}

type neverEnding struct{}

func (neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

func TestRunAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch users")
	}
	etc := t.TempDir()
	os.WriteFile(filepath.Join(etc, "passwd"), []byte("root:x:0:0::/root:/bin/sh\nalice:x:4242:4343::/nonexistent:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(etc, "group"), []byte("alice:x:4343:\nextra:x:4444:alice\n"), 0o644)
	a := startAgent(t, agent.WithEtcDir(agent.Options{}, etc))
	res := run(t, a, agent.ProcessSpec{Shell: `id -u; id -g; id -G; echo "$HOME $USER"; pwd`, User: "alice"})
	if res.stdout.String() != "4242\n4343\n4343 4444\n/nonexistent alice\n/\n" {
		t.Errorf("as alice: %q %q", res.stdout.String(), res.stderr.String())
	}
	res = run(t, a, agent.ProcessSpec{Shell: "id -u; id -g", User: "31337"})
	if res.stdout.String() != "31337\n0\n" {
		t.Errorf("as 31337: %q", res.stdout.String())
	}
	// Config's default user applies to commands and uploads.
	ctx := testCtx(t)
	if err := a.SetConfig(ctx, agent.Config{User: "alice"}); err != nil {
		t.Fatal(err)
	}
	if res := run(t, a, agent.ProcessSpec{Argv: []string{"id", "-u"}}); res.stdout.String() != "4242\n" {
		t.Errorf("default user: %q", res.stdout.String())
	}
	// Uploads act as alice: the directory must be hers to write.
	dir := userDir(t, 4242, 4343)
	p := filepath.Join(dir, "new", "f")
	if err := a.Upload(ctx, p, 0o644, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{p, filepath.Dir(p)} {
		if fi, err := os.Stat(q); err != nil || statUID(fi) != 4242 {
			t.Errorf("%s not owned by alice", q)
		}
	}
}

func truncateStr(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

var _ = errors.New

// TestStartEvents: a start that follows its own events holds a reader from
// before the fork, so a slow follower sees every event from seq 1 (output
// waits for it rather than being dropped), and the started frame says
// what Start would.
func TestStartEvents(t *testing.T) {
	a := startAgent(t, agent.Options{RetainBytes: 64 << 10, ReaderGrace: time.Millisecond})
	ctx := testCtx(t)
	info, er, err := a.StartEvents(ctx, ctx, agent.ProcessSpec{Argv: []string{"head", "-c", "1048576", "/dev/zero"}, Tag: "t1"})
	if err != nil || er == nil {
		t.Fatalf("StartEvents: %v (reader %v)", err, er)
	}
	defer er.Close()
	if info.ID == "" || info.PID <= 0 || info.Tag != "t1" || len(info.Argv) != 4 {
		t.Fatalf("info %+v", info)
	}
	time.Sleep(300 * time.Millisecond) // far past the reader grace
	var n int
	var first uint64
	for {
		ev, err := er.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if first == 0 {
			first = ev.Seq
		}
		if ev.Type == agent.EventStdout {
			n += len(ev.Data)
		}
		if ev.Type == agent.EventExit {
			if ex, err := client.ExitStatus(ev); err != nil || ex.Code != 0 {
				t.Errorf("exit %+v %v", ex, err)
			}
		}
	}
	if first != 1 || n != 1<<20 {
		t.Errorf("first seq %d, %d bytes of stdout; want 1 and %d", first, n, 1<<20)
	}
	// Refused starts answer as Start does.
	if _, _, err := a.StartEvents(ctx, ctx, agent.ProcessSpec{Argv: []string{"true"}, Cwd: "/nonexistent"}); !client.IsBadRequest(err) {
		t.Errorf("bad cwd: %v", err)
	}
}
