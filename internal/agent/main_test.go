package agent

import (
	"context"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// reaperModeEnv selects the reaper mode of a test run: unset runs the tests
// the way production runs (reap every child, the test process made a child
// subreaper so orphans come to it as they come to PID 1); "pid" waits only
// on spawned children, as a non-PID-1 agent does. TestReaperPidMode re-runs
// a subset of the tests in that mode.
const reaperModeEnv = "SPACE_AGENT_TEST_REAPER"

func TestMain(m *testing.M) {
	ctx, cancel := context.WithCancel(context.Background())
	if os.Getenv(reaperModeEnv) != "pid" {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, "set child subreaper:", err)
			os.Exit(1)
		}
		sharedReaper().reapAllUntil(ctx)
	}
	code := m.Run()
	cancel()
	if code == 0 {
		// net/http lingers up to 500ms on a connection whose request
		// body was refused (413) before closing it; that is not ours.
		if err := goleak.Find(goleak.IgnoreAnyFunction("net/http.(*conn).closeWriteAndWait")); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
