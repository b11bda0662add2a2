package gvisor

import (
	"bufio"
	"context"
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
// pidsHeadroom covers that surplus about ten times over, for hosts with
// many CPUs (more Sentry and stub threads). pidsMultiplier is the 2N. A deliberately odd workload can
// still exceed it (stubs systrap pools for reuse keep the sysmsg threads of
// a multi-threaded process they served): that kills its own sandbox only.
const (
	pidsMultiplier = 2
	pidsHeadroom   = 512
)

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
		return fmt.Errorf("set in-sandbox pids limit: %w", err)
	}
	switch code {
	case http.StatusNoContent, http.StatusOK:
		return nil
	case http.StatusNotFound:
		return errNoPidsRoute
	}
	return fmt.Errorf("set in-sandbox pids limit: agent answered %d: %s", code, strings.TrimSpace(msg))
}

// agentRequest makes one HTTP request on a new connection to the agent.
func (i *Instance) agentRequest(ctx context.Context, method, path, body string) (int, string, error) {
	c, err := i.Dial(ctx)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: agent\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", method, path, len(body), body)
	if _, err := io.WriteString(c, req); err != nil {
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
