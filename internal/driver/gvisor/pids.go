package gvisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/driver/gvisor/agentpids"
)

// The sandbox's pids limit is enforced twice:
//
//   - inside, on the sandbox's own tasks, by the Sentry's cgroup v2 pids
//     controller: the agent starts every command in its cgroup
//     (agentpids.GroupName) and the driver sets its pids.max to the limit
//     through the agent (setSandboxPids). A fork or clone past it fails with
//     EAGAIN, as on Linux; the Sentry, the agent and the sandbox go on.
//   - on the host, on runsc's tasks, by the sandbox's host pids cgroup, with
//     hostPids(limit): a backstop against the Sentry itself (or root in the
//     sandbox that left the commands' cgroup) running away. Hitting it
//     kills the whole sandbox, so it must leave room for what the inside
//     limit allows.
//
// What runsc's host tasks are (systrap, pkg/sentry/platform/systrap): the
// Sentry's Go threads, the gofer's, and per sandbox address space a stub
// process with one syscall thread plus one sysmsg thread per sandbox thread
// running at once (at most GOMAXPROCS). A sandbox task is one thread in
// the Sentry's count, so N tasks in any mix of processes and threads need
// at most 2N stub tasks (N single-threaded processes: 2 each; a process of
// T threads: at most 1+T). On top: the agent's own address space (not in
// the commands' cgroup; 1 + up to GOMAXPROCS stub threads) and the Sentry's
// threads, which grow with GOMAXPROCS and blocked work. Measured on 2 CPUs
// (TestIsolationGvisor/fork-bomb, three runs): an idle sandbox has 24-26
// host tasks; a fork bomb under pids=64 peaks at 165-186 = 2*64 + 37..58.
// Under the server's default pids=1024 the host count is not 2N: systrap
// pools stubs, and a bomb that keeps forking and dying holds about three
// stub processes per sandbox task plus 400-660 Sentry threads. Measured
// (TestIsolationGvisor/fork-bomb-defaults, 2 CPUs): the host count hit
// 2*1024+512 and 3*1024+512, killing the Sentry, and levelled off at
// 3602-4038 with room; later runs reached 4*1024+512 (a refused fork in
// CI) and peaked at 3546-4756 in nine runs, so pidsMultiplier is 5: every
// observed peak with 800+ spare. pidsHeadroom covers the fixed part for hosts with many
// CPUs (more Sentry and stub threads).
// A deliberately odd workload can still exceed it: that kills its own
// sandbox only.
const (
	pidsMultiplier = 5
	pidsHeadroom   = 512
)

// The host memory cgroup of a sandbox holds more than the sandbox's own
// memory: the Sentry's heap, the gofer, and per sandbox task systrap stub
// processes whose page tables and kernel stacks the host charges to the
// cgroup (kernel memory: 149 MB of a 494 MB peak under a fork bomb at the
// default 512 MiB and 1024 tasks). With the host limit equal to the
// sandbox's that overhead eats into the sandbox's memory and the host's
// OOM killer meets it early. So the sandbox's allowance on the host is the
// sandbox's memory plus memoryHeadroom plus memoryPerTask for each task
// its pids limit allows; the Sentry still reports the sandbox's own limit
// as its total memory (the spec's limit). gVisor does not itself stop the
// sandbox's processes at that limit, so the memory guard (memguard.go)
// kills the sandbox's commands when the host cgroup passes the allowance,
// and the host limit adds guardReserve above it: room for what runsc
// allocates while the guard acts, so the host's OOM killer, which would
// pick the Sentry, is not reached.
const (
	memoryHeadroom = 64 << 20
	memoryPerTask  = 160 << 10
)

// hostMemory is the host memory cgroup limit for a sandbox memory limit of
// m bytes and a pids limit of n tasks: the guard's allowance
// (guardThreshold) plus guardReserve.
func hostMemory(m, n int64) int64 {
	if m <= 0 {
		return 0
	}
	base := m + memoryHeadroom + max(n, 0)*memoryPerTask
	return base + min(guardReserveMax, base/3)
}

// agentCallTimeout bounds one call to the agent.
const agentCallTimeout = 10 * time.Second

// hostPids is the host pids cgroup limit for a sandbox limit of n tasks.
func hostPids(n int64) int64 {
	if n <= 0 {
		return 0
	}
	return pidsMultiplier*n + pidsHeadroom
}

// errNoPidsRoute: the agent does not serve agentpids.Path (it predates
// it, e.g. one restored from an older checkpoint).
var errNoPidsRoute = fmt.Errorf("the agent has no %s route", agentpids.Path)

// setSandboxPids sets the pids.max of the sandbox's commands' cgroup in the
// Sentry through the agent.
func (i *Instance) setSandboxPids(ctx context.Context, n int64) error {
	body := "max"
	if n > 0 {
		body = strconv.FormatInt(n, 10)
	}
	ctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
	defer cancel()
	code, msg, err := i.agentRequest(ctx, http.MethodPut, agentpids.Path, body)
	if err != nil {
		return fmt.Errorf("set in-sandbox pids limit: the agent did not answer within %v (host overloaded?): %w", agentCallTimeout, err)
	}
	switch code {
	case http.StatusNoContent, http.StatusOK:
		return nil
	case http.StatusNotFound:
		return errNoPidsRoute
	}
	return fmt.Errorf("set in-sandbox pids limit: agent answered %d: %s", code, strings.TrimSpace(msg))
}

// errNotSent marks an agentRequest that failed before any of the request
// reached the agent, so the agent cannot have acted on it.
var errNotSent = errors.New("request not sent")

// agentRequest makes one HTTP request on a new connection to the agent.
func (i *Instance) agentRequest(ctx context.Context, method, path, body string) (int, string, error) {
	c, err := i.Dial(ctx)
	if err != nil {
		return 0, "", fmt.Errorf("%w: %w", errNotSent, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: agent\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", method, path, len(body), body)
	if n, err := io.WriteString(c, req); err != nil {
		if n == 0 {
			err = fmt.Errorf("%w: %w", errNotSent, err)
		}
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b), nil
}
