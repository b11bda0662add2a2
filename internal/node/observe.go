package node

import (
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/core"
)

// Observer is told what a node does, for metrics (internal/metrics
// implements it). Its methods are called on the node's hot paths: they must
// be cheap and safe for concurrent use. err is the outcome (nil: it worked).
type Observer interface {
	// SandboxStarted: an instance was started for a sandbox; source is
	// "warm" (claimed from the warm pool), "cold" (created) or "restore"
	// (created from a snapshot).
	SandboxStarted(driver, source string, d time.Duration, err error)
	// SandboxStopped: a sandbox's instance was destroyed.
	SandboxStopped(driver string, d time.Duration, err error)
	// WarmPoolClaim: a create of a template that has a warm pool found a
	// warm instance (hit) or none (miss).
	WarmPoolClaim(template string, hit bool)
	// CommandStarted: a command was started through the agent.
	CommandStarted(driver string, d time.Duration, err error)
	// CommandExited: a recorded command ended; reason is ExitReason's.
	CommandExited(reason string)
	// SnapshotCaptured: a snapshot capture ended (stats are zero on error).
	SnapshotCaptured(driver string, stats core.SnapshotStats, d time.Duration, err error)
}

type nopObserver struct{}

func (nopObserver) SandboxStarted(string, string, time.Duration, error)               {}
func (nopObserver) SandboxStopped(string, time.Duration, error)                       {}
func (nopObserver) WarmPoolClaim(string, bool)                                        {}
func (nopObserver) CommandStarted(string, time.Duration, error)                       {}
func (nopObserver) CommandExited(string)                                              {}
func (nopObserver) SnapshotCaptured(string, core.SnapshotStats, time.Duration, error) {}

func (n *Node) observer() Observer {
	if n.o.Observer == nil {
		return nopObserver{}
	}
	return n.o.Observer
}

// ExitReason classifies how a command ended, with a small fixed set of
// values (a metric label): "exit_zero", "exit_nonzero", "signal",
// "oom_killed", "timed_out" or "error" (the agent could not start or wait
// for it). The node reports "lost" itself when it loses the agent.
func ExitReason(ex *agent.Exit) string {
	switch {
	case ex == nil:
		return "lost"
	case ex.OOMKilled:
		return "oom_killed"
	case ex.TimedOut:
		return "timed_out"
	case ex.Signal != "":
		return "signal"
	case ex.Error != "":
		return "error"
	case ex.Code == 0:
		return "exit_zero"
	default:
		return "exit_nonzero"
	}
}

// Counts is what a node runs now, for gauges.
type Counts struct {
	Running, Paused int
	// Warm is the number of warm instances per warm template.
	Warm map[string]int
}

// Counts returns the sandboxes this node runs (by paused or not) and the
// size of each warm template's pool.
func (n *Node) Counts() Counts {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := Counts{Warm: map[string]int{}}
	for _, h := range n.sandboxes {
		if h.paused.Load() {
			c.Paused++
		} else {
			c.Running++
		}
	}
	if n.o.WarmPool > 0 {
		for _, t := range n.o.WarmTemplates {
			c.Warm[t] = len(n.pool[t])
		}
	}
	return c
}

// isWarmTemplate reports whether creates of template may claim a warm
// instance.
func (n *Node) isWarmTemplate(template string) bool {
	if n.o.WarmPool <= 0 {
		return false
	}
	for _, t := range n.o.WarmTemplates {
		if t == template {
			return true
		}
	}
	return false
}
