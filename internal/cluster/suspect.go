package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// unreachableError is a node call whose connection failed (refused, reset,
// timed out): the node may be dead though its last heartbeat is still
// within the timeout.
type unreachableError struct{ msg string }

func (e unreachableError) Error() string { return e.msg }
func (e unreachableError) Unwrap() error { return core.ErrUnavailable }

// suspects are nodes whose link failed, by when: placement skips such a
// node until it heartbeats after the failure, so the creates that follow a
// node's death go elsewhere before the node is marked lost.
type suspects struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (s *suspects) mark(node string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.at == nil {
		s.at = map[string]time.Time{}
	}
	s.at[node] = at
}

// skip reports whether placement should pass n by.
func (s *suspects) skip(n core.NodeRecord) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.at[n.Name]
	if ok && n.HeartbeatAt.After(at) {
		delete(s.at, n.Name)
		return false
	}
	return ok
}

// startElsewhere handles a create whose node could not be reached (startOn
// made the node a suspect): the sandbox, still creating and still on
// that node, is moved to another node (a conditional update of its
// record) and started there. It reports false when it did not try.
func (r *Remote) startElsewhere(ctx context.Context, sb core.Sandbox, err error, progress core.Progress) (core.Placement, bool, error) {
	var ue unreachableError
	if !errors.As(err, &ue) {
		return core.Placement{}, false, nil
	}
	from := sb.Node
	if sb.Snapshot != "" {
		return core.Placement{}, false, nil // pinned to its snapshot's store: not worth a second placement here
	}
	r.dropNodeCache()
	to, perr := r.place(ctx, sb, placeConstraint{exclude: from})
	if perr != nil {
		return core.Placement{}, false, nil
	}
	moved, uerr := r.o.Store.UpdateSandbox(ctx, sb.ID, func(cur *core.Sandbox) error {
		if cur.State != core.SandboxCreating || cur.Node != from {
			return fmt.Errorf("sandbox %s became %s on node %s: %w", sb.ID, cur.State, cur.Node, core.ErrConflict)
		}
		cur.Node = to
		return nil
	})
	if uerr != nil {
		r.unreserve(to, sb.ID)
		return core.Placement{}, false, nil
	}
	r.o.Logf("sandbox %s: node %s unreachable (%v); starting it on node %s", sb.ID, from, err, to)
	progress(10, fmt.Sprintf("node %s unreachable: starting on node %s", from, to))
	pl, err := r.startOn(ctx, moved, progress)
	return pl, true, err
}
