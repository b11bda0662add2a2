package gvisor

import (
	"bufio"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/driver/gvisor/agentpids"
)

// fakeAgent listens on a unix socket where the driver dials the agent and
// answers each request with answer (nil: reads the request and never
// answers, as an agent in a Sentry busy with a thousand dying tasks). It
// stands in for the agent inside runsc, which the test cannot slow down
// on demand.
func fakeAgent(t *testing.T, answer func(w *bufio.Writer)) (sock string, paths <-chan string) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 8)
	done := make(chan struct{})
	t.Cleanup(func() { close(done); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				got <- req.Method + " " + req.URL.Path
				if answer == nil {
					<-done
					return
				}
				w := bufio.NewWriter(c)
				answer(w)
				w.Flush()
			}()
		}
	}()
	return sock, got
}

func guardInstance(t *testing.T, sock string) (*Instance, *strings.Builder) {
	var log strings.Builder
	d := &Driver{opts: Options{Logf: func(f string, a ...any) {
		t.Logf(f, a...)
		log.WriteString(f)
	}}}
	return &Instance{d: d, id: "sbx-guardtest", sock: sock}, &log
}

func answerJSON(body string) func(w *bufio.Writer) {
	return func(w *bufio.Writer) {
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
			strconv.Itoa(len(body)) + "\r\nConnection: close\r\n\r\n" + body)
	}
}

// TestGuardKillCounts: which of the guard's kill requests count as OOM
// kills of the commands. The CI failure this reproduces: the agent took
// longer than the request's timeout to answer a kill it carried out, the
// guard counted nothing, and the fork bomb's SIGKILL exit was reported as
// a plain kill instead of oom_killed.
func TestGuardKillCounts(t *testing.T) {
	st := cgroups.Stats{MemUsedBytes: 900, MemLimitBytes: 1000}
	t.Run("unanswered", func(t *testing.T) {
		sock, paths := fakeAgent(t, nil)
		i, _ := guardInstance(t, sock)
		i.guardKill(300*time.Millisecond, st)
		if p := <-paths; p != "POST "+agentpids.KillPath {
			t.Errorf("the guard sent %q, want POST %s", p, agentpids.KillPath)
		}
		if n := i.guardKills.Load(); n != 1 {
			t.Errorf("a kill the agent received but did not answer counted %d times, want 1", n)
		}
		if i.guardKilling.Load() {
			t.Error("guardKilling still set after the request ended")
		}
	})
	t.Run("not-sent", func(t *testing.T) {
		i, log := guardInstance(t, filepath.Join(t.TempDir(), "no-agent.sock"))
		i.guardKill(300*time.Millisecond, st)
		if n := i.guardKills.Load(); n != 0 {
			t.Errorf("a kill that never reached the agent counted %d times, want 0", n)
		}
		if !strings.Contains(log.String(), "did not reach the agent") {
			t.Errorf("log %q does not say the request did not reach the agent", log.String())
		}
	})
	for _, c := range []struct {
		name, answer string
		want         uint64
	}{
		{"killed", `{"killed":1022}`, 1},       // an answered kill of the commands
		{"nothing-to-kill", `{"killed":0}`, 0}, // the commands' group was empty
	} {
		t.Run(c.name, func(t *testing.T) {
			sock, _ := fakeAgent(t, answerJSON(c.answer))
			i, _ := guardInstance(t, sock)
			i.guardKill(5*time.Second, st)
			if n := i.guardKills.Load(); n != c.want {
				t.Errorf("the agent answered %s: counted %d kills, want %d", c.answer, n, c.want)
			}
		})
	}
}
