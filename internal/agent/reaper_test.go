package agent_test

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/space-sandbox/space/internal/agent"
)

// TestReaperKeepsExitStatuses is the classic PID 1 bug: reaping orphans with
// wait4(-1) while commands are being waited on must never swallow a
// command's exit status. Every command leaves an orphan behind and exits
// with its own code.
func TestReaperKeepsExitStatuses(t *testing.T) {
	a := startAgent(t, agent.Options{})
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code := 1 + i%100
			res := run(t, a, agent.ProcessSpec{Shell: fmt.Sprintf("true >/dev/null 2>&1 & exit %d", code)})
			if res.exit.Code != code || res.exit.Signal != "" {
				errs <- fmt.Sprintf("command %d: exit %+v, want code %d", i, res.exit, code)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestReaperPidMode re-runs the process tests with the reaper in the mode a
// non-PID-1 agent uses (waiting only on its own children), by running this
// test binary through the agent itself.
func TestReaperPidMode(t *testing.T) {
	if os.Getenv(agent.ReaperModeEnv) != "" {
		t.Skip("already the pid-mode run")
	}
	if testing.Short() {
		t.Skip("re-runs part of the suite")
	}
	a := startAgent(t, agent.Options{})
	res := run(t, a, agent.ProcessSpec{
		Argv: []string{os.Args[0], "-test.count=1", "-test.v",
			"-test.run=^(TestArgvAndShell|TestSignals|TestTimeout|TestStdin|TestPTY|TestConcurrentProcesses|TestReaperKeepsExitStatuses|TestServeKillsProcesses|TestOrphansReaped)$"},
		Env:       map[string]string{agent.ReaperModeEnv: "pid"},
		TimeoutMs: 120000,
	})
	out := res.stdout.String() + res.stderr.String()
	if res.exit.Code != 0 || !strings.Contains(out, "--- PASS: TestReaperKeepsExitStatuses") || !strings.Contains(out, "--- SKIP: TestOrphansReaped") {
		t.Errorf("pid-mode run: exit %+v\n%s", res.exit, out)
	}
}
