package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/driver/gvisor/agentpids"
)

// The memory guard keeps the host's OOM killer away from the Sentry.
//
// gVisor does not stop a sandbox's processes at its memory limit, and the
// Sentry's own memory grows with what the sandbox does: under a fork bomb
// at the pids limit, every refused fork still copies the forking task's
// address space in the Sentry before the pids controller refuses it, and
// the Sentry's heap grew by 2-3 MB/s at pids=64 and 7-10 MB/s at 256 and
// 1024 (TestIsolationGvisor/fork-bomb-defaults, 2 CPUs), without bound while
// the bomb runs. When the host cgroup reaches its limit the kernel kills
// the biggest process in it, the Sentry, and the sandbox is lost.
//
// So the driver watches the host cgroup's memory and, when it passes the
// sandbox's allowance (the host limit less guardReserve, hostMemory), kills
// every task of the commands' cgroup in the Sentry (agentpids.KillPath,
// cgroup.kill) as Linux's OOM killer would kill processes and not the
// kernel: the commands end, reported as OOM kills (Instance.OOMKills), the
// agent and the sandbox stay. The Sentry then frees the memory (2 s after
// the kill at pids=64 it was back at its idle size). guardReserve is the
// room for what runsc allocates while the guard acts: a bomb at the
// defaults grew the host cgroup by up to 60 MB/s, and the request to the
// agent goes through a Sentry busy with 1024 tasks on a loaded host; with
// 64 MiB the host's OOM killer took the Sentry first in one run of two.
// Root in the sandbox can leave the commands' cgroup and escape the guard;
// that only loses its own sandbox.
const (
	guardInterval   = 200 * time.Millisecond
	guardReserveMax = 256 << 20
	// guardPause: after a kill, the Sentry needs time to free what the
	// killed tasks held before usage is worth reading again.
	guardPause = 2 * time.Second
)

// guardReserve is the part of host memory limit limit kept for the
// guard's reaction: hostMemory adds min(guardReserveMax, base/3) to the
// allowance base, which is min(guardReserveMax, limit/4) of the limit. It
// is smaller for small sandboxes, so that their memory limit stays tight
// (a 64 MiB sandbox must not get a 256 MiB block even for an instant: the
// guard polls, the host limit is immediate).
func guardReserve(limit int64) int64 { return min(guardReserveMax, limit/4) }

// guardMemory runs until done is closed.
func (i *Instance) guardMemory(done <-chan struct{}) {
	t := time.NewTicker(guardInterval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		st, err := i.group.Stats()
		if err != nil || st.MemLimitBytes <= 0 || st.MemUsedBytes+guardReserve(st.MemLimitBytes) < st.MemLimitBytes {
			continue
		}
		i.guardKill(guardKillTimeout, st)
		select {
		case <-done:
			return
		case <-time.After(guardPause):
		}
	}
}

// guardKillTimeout bounds the guard's kill request. The agent answers
// through a Sentry busy with the dying commands: 7.7 s for 1022 tasks
// beside two busy loops on 2 CPUs.
const guardKillTimeout = 30 * time.Second

// guardKill asks the agent to kill the commands and counts the kill. A
// request the agent got but did not answer (timed out, connection lost)
// counts too: the agent may have killed the commands before its answer
// was lost, and their SIGKILL exits, which can reach the node after the
// failure, must still read as OOM kills (CI: a kill that outlived the
// request's 10 s left the fork bomb's exit reported as a plain SIGKILL).
// A request that never reached the agent does not count.
func (i *Instance) guardKill(timeout time.Duration, st cgroups.Stats) {
	i.guardKilling.Store(true)
	defer i.guardKilling.Store(false)
	start := time.Now()
	n, err := i.killCommands(timeout)
	took := time.Since(start).Round(time.Millisecond)
	switch {
	case err != nil && errors.Is(err, errNotSent):
		i.d.opts.Logf("gvisor: %s: memory guard: host memory %d of %d bytes, the kill request did not reach the agent: %v", i.id, st.MemUsedBytes, st.MemLimitBytes, err)
	case err != nil:
		i.guardKills.Add(1)
		i.d.opts.Logf("gvisor: %s: memory guard: host memory %d of %d bytes, the agent did not answer the kill after %v (counted as a kill): %v", i.id, st.MemUsedBytes, st.MemLimitBytes, took, err)
	case n > 0:
		i.guardKills.Add(1)
		i.d.opts.Logf("gvisor: %s: memory guard: host memory %d of %d bytes: killed the sandbox's commands (%d tasks) in %v", i.id, st.MemUsedBytes, st.MemLimitBytes, n, took)
	default:
		// The memory is not the commands' (root left their cgroup, or
		// runsc itself): nothing to kill; the host limit decides.
	}
}

// killCommands kills every task in the commands' cgroup of the Sentry and
// returns how many there were.
func (i *Instance) killCommands(timeout time.Duration) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	code, msg, err := i.agentRequest(ctx, http.MethodPost, agentpids.KillPath, "")
	if err != nil {
		return 0, err
	}
	if code != http.StatusOK {
		return 0, fmt.Errorf("agent answered %d: %s", code, strings.TrimSpace(msg))
	}
	var k agentpids.Killed
	if err := json.Unmarshal([]byte(msg), &k); err != nil {
		return 0, fmt.Errorf("agent's answer %q: %w", msg, err)
	}
	return k.Killed, nil
}
