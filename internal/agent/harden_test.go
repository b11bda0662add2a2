package agent_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/threadstatus"
	"golang.org/x/sys/unix"
)

const hardenEnv = "SPACE_AGENT_TEST_HARDEN"

// TestHardenSelf runs HardenSelf in a child copy of this test binary (it
// changes process-wide state) and checks the agent's own state and what its
// commands inherit.
func TestHardenSelf(t *testing.T) {
	if os.Getenv(hardenEnv) == "1" {
		hardenedChild(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("dropping from the capability bounding set needs CAP_SETPCAP (root)")
	}
	// The child is what the agent is in a sandbox: PID 1 of a PID
	// namespace, which the kernel sends no signal it has no handler for.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHardenSelf$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), hardenEnv+"=1", agent.ReaperModeEnv+"=pid")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestHardenSelf") {
		t.Errorf("hardened child: %v\n%s", err, out)
	}
}

func hardenedChild(t *testing.T) {
	// Its own /proc, so pids it reads and writes there are its namespace's.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Fatal(err)
	}
	// The host makes the agent OOM-proof; commands must not inherit it.
	// Lowering the score needs CAP_SYS_RESOURCE, which a container's root
	// may lack; then the check below is vacuous but still runs.
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-500"), 0); err != nil {
		t.Logf("cannot lower oom_score_adj (%v); inheritance not tested", err)
	}
	// A cgo build of this test refuses (AllThreadsSyscall is unavailable
	// there) rather than leave the bounding set alone.
	_, _, errno := syscall.AllThreadsSyscall(syscall.SYS_GETPID, 0, 0, 0)
	if errno == syscall.ENOTSUP {
		if err := agent.HardenSelf(); !errors.Is(err, agent.ErrCgoBuild) {
			t.Fatalf("cgo build: HardenSelf = %v, want ErrCgoBuild", err)
		}
		return
	}
	if err := agent.HardenSelf(); err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE} {
		syscall.Kill(os.Getpid(), sig)
	}
	time.Sleep(50 * time.Millisecond) // still here
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		t.Errorf("dumpable = %d, %v", d, err)
	}
	dropped := uint64(1<<unix.CAP_SYS_PTRACE | 1<<unix.CAP_NET_RAW | 1<<unix.CAP_NET_ADMIN)
	tasks, _ := filepath.Glob("/proc/self/task/*/status")
	for _, task := range tasks {
		if b := capBnd(t, readFile(t, task)) & dropped; b != 0 {
			t.Errorf("%s still has capabilities %#x in its bounding set", task, b)
		}
	}

	a := startAgent(t, agent.Options{})
	// The agent sets a command's score right after starting it: read it a
	// moment later, not in a race with that write.
	res := run(t, a, agent.ProcessSpec{Shell: "cat /proc/self/status; sleep 0.2; echo oom=$(cat /proc/self/oom_score_adj)"})
	status := res.stdout.String()
	ign := statusHex(t, status, "SigIgn")
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2} {
		if ign&(1<<(sig-1)) != 0 {
			t.Errorf("command inherits %v ignored", sig)
		}
	}
	if b := capBnd(t, status) & dropped; b != 0 {
		t.Errorf("command has capabilities %#x in its bounding set", b)
	}
	if e := statusHex(t, status, "CapEff") & dropped; e != 0 {
		t.Errorf("command (root) has capabilities %#x in its effective set", e)
	}
	// A protected agent (-1000 set by the host) gives commands 0; an
	// unprotected one gives them a higher score than its own, so the OOM
	// killer takes a memory hog before the agent.
	own, _ := strconv.Atoi(strings.TrimSpace(readFile(t, "/proc/self/oom_score_adj")))
	got, _ := strconv.Atoi(strings.TrimSpace(status[strings.LastIndex(status, "oom=")+4:]))
	switch {
	case own <= -500 && got != 0:
		t.Errorf("protected agent (%d): command's oom_score_adj %d, want 0", own, got)
	case own > -500 && got <= own && got != 1000:
		t.Errorf("unprotected agent (%d): command's oom_score_adj %d, want higher", own, got)
	}
	// yes | head ends by SIGPIPE, as in any shell.
	if res := run(t, a, agent.ProcessSpec{Shell: "yes | head -n 1; echo ${PIPESTATUS:-}"}); res.stdout.String() != "y\n\n" || res.stderr.Len() != 0 {
		t.Errorf("yes | head: %q %q", res.stdout.String(), res.stderr.String())
	}
}

func readFile(t *testing.T, name string) string {
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func capBnd(t *testing.T, status string) uint64 { return statusHex(t, status, "CapBnd") }

func statusHex(t *testing.T, status, key string) uint64 {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in status", key)
	return 0
}

// TestReserveThreads: the runtime holds at least n OS threads afterwards,
// kept idle (the agent's reserve, and in gVisor what its signal fence
// must cover).
func TestReserveThreads(t *testing.T) {
	const n = 24
	before, err := threadstatus.TIDs()
	if err != nil {
		t.Fatal(err)
	}
	agent.ReserveThreads(n)
	after, err := threadstatus.TIDs()
	if err != nil {
		t.Fatal(err)
	}
	if len(after) < n+1 {
		t.Fatalf("%d threads after reserving %d (%d before), want at least %d", len(after), n, len(before), n+1)
	}
	t.Logf("threads: %d before, %d after", len(before), len(after))
}
