package agent_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/agent/client"
)

// testAgent is a server on a unix socket and a client for it.
type testAgent struct {
	*client.Client
	sock string
	hc   *http.Client // raw HTTP, for malformed requests
	stop func()
}

func startAgent(t testing.TB, opts agent.Options) *testAgent {
	t.Helper()
	// Unix socket paths are limited to 108 bytes; t.TempDir can be longer.
	dir, err := os.MkdirTemp("", "agent")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := agent.NewServer(opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) }}}
	a := &testAgent{Client: client.New(dial), sock: sock, hc: hc}
	stopped := false
	a.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Serve did not return")
		}
		a.Client.Close()
		hc.CloseIdleConnections()
		os.RemoveAll(dir)
	}
	t.Cleanup(a.stop)
	return a
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// result is everything a process produced.
type result struct {
	stdout, stderr bytes.Buffer
	events         []agent.Event
	exit           agent.Exit
}

// collect reads a process's events to the end.
func collect(t testing.TB, ctx context.Context, a *testAgent, id string, after uint64) *result {
	t.Helper()
	er, err := a.Events(ctx, id, after)
	if err != nil {
		t.Fatalf("Events(%s, %d): %v", id, after, err)
	}
	defer er.Close()
	res := &result{}
	for {
		ev, err := er.Next()
		if errors.Is(err, io.EOF) {
			return res
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		res.events = append(res.events, ev)
		switch ev.Type {
		case agent.EventStdout:
			res.stdout.Write(ev.Data)
		case agent.EventStderr:
			res.stderr.Write(ev.Data)
		case agent.EventExit:
			if res.exit, err = client.ExitStatus(ev); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// run starts spec and waits for its end.
func run(t testing.TB, a *testAgent, spec agent.ProcessSpec) *result {
	t.Helper()
	ctx := testCtx(t)
	info, err := a.Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start(%+v): %v", spec, err)
	}
	return collect(t, ctx, a, info.ID, 0)
}

// raw sends a raw HTTP request and returns status and error code.
func (a *testAgent) raw(t testing.TB, method, path string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://agent"+path, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	code := ""
	if resp.StatusCode >= 400 {
		if !strings.Contains(string(data), `"error"`) {
			t.Errorf("%s %s: %d without JSON error body: %q", method, path, resp.StatusCode, data)
		}
		if i := strings.Index(string(data), `"code":"`); i >= 0 {
			code = string(data[i+8:])
			code = code[:strings.IndexByte(code, '"')]
		}
	}
	return resp.StatusCode, code
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// exists reports whether pid exists at all (zombie included).
func exists(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}
