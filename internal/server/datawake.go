package server

// Waking a hibernated sandbox on a data-plane call with remote nodes.
// Whichever node's listener receives an authenticated call for a
// hibernated sandbox created with auto_resume wakes it through the
// scheduler (a cluster.Remote on the node, calling nodes over the node
// link as a replica does), so the sandbox may come back on another node
// (its own is drained or lost). When it does, the answer the local data
// plane would give ("not running here") is held back and the request is
// sent on to the node that now runs it. Authentication stays where it
// was: the wake runs only inside the data plane's own check of the token.

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
)

// nodeWaker is the runtime of a node's automatic resume: its own paused
// sandboxes thaw here (nodePauser); a hibernated one restores wherever
// the scheduler places it.
type nodeWaker struct {
	nodePauser
	remote *cluster.Remote
	local  interface{ Has(id string) bool }
}

var (
	_ core.SnapshotRuntime = nodeWaker{}
	_ core.PauseRuntime    = nodeWaker{}
)

func (n nodeWaker) CaptureSnapshot(ctx context.Context, id string, chain []string) (string, core.SnapshotStats, error) {
	return n.remote.CaptureSnapshot(ctx, id, chain)
}

// hibernateSettle bounds how long a wake waits for the instance a
// hibernation is destroying on this node.
const hibernateSettle = 30 * time.Second

func (n nodeWaker) StartSandboxFromSnapshot(ctx context.Context, sb core.Sandbox, chain []string, progress core.Progress) (core.Placement, error) {
	// A replica commits a hibernation before it destroys the instance
	// (under its own lock, which a node does not share): a call in
	// between finds the record hibernated and the instance still here.
	for deadline := time.Now().Add(hibernateSettle); n.local.Has(sb.ID); {
		if time.Now().After(deadline) {
			return core.Placement{}, fmt.Errorf("sandbox %s is hibernated but its instance is still on this node after %v: %w", sb.ID, hibernateSettle, core.ErrConflict)
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return core.Placement{}, ctx.Err()
		}
	}
	return n.remote.StartSandboxFromSnapshot(ctx, sb, chain, progress)
}

// CollectSnapshots: nodes collect only at their own start.
func (n nodeWaker) CollectSnapshots(ctx context.Context, keep []string) (any, error) { return nil, nil }

// StopSandbox stops a sandbox here, or on the node the record names (a
// failed wake placed elsewhere).
func (n nodeWaker) StopSandbox(ctx context.Context, id string) error {
	if n.local.Has(id) {
		return n.nodePauser.StopSandbox(ctx, id)
	}
	return n.remote.StopSandbox(ctx, id)
}

// reroute carries, through a request's context, the node a wake moved its
// sandbox to.
type reroute struct {
	mu   sync.Mutex
	node string
}

type rerouteKey struct{}

func (r *reroute) get() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.node
}

// wake wraps an automatic resume: a sandbox it brought back on another
// node reports false here (the local data plane cannot serve it) and
// marks the request to be sent on.
func (d *dataRouter) wake(inner func(ctx context.Context, projectID, id string) (bool, error)) func(ctx context.Context, projectID, id string) (bool, error) {
	return func(ctx context.Context, projectID, id string) (bool, error) {
		woke, err := inner(ctx, projectID, id)
		if err != nil || !woke || d.local.Has(id) {
			return woke, err
		}
		rr, _ := ctx.Value(rerouteKey{}).(*reroute)
		if rr == nil {
			return false, nil
		}
		sb, err := d.store.GetSandbox(ctx, projectID, id)
		if err != nil {
			return false, err
		}
		if sb.Node != "" && sb.Node != d.self {
			rr.mu.Lock()
			rr.node = sb.Node
			rr.mu.Unlock()
		}
		return false, nil
	}
}

func (d *dataRouter) wakePublic(inner func(ctx context.Context, id string) (bool, error)) func(ctx context.Context, id string) (bool, error) {
	w := d.wake(func(ctx context.Context, _, id string) (bool, error) { return inner(ctx, id) })
	return func(ctx context.Context, id string) (bool, error) { return w(ctx, "", id) }
}

// holdWriter passes a response through unless, by the time it starts, a
// wake has moved the sandbox: that answer is dropped.
type holdWriter struct {
	http.ResponseWriter
	rr      *reroute
	started bool // the response began to pass through
	dropped bool
}

func (h *holdWriter) hold() bool {
	if !h.started && !h.dropped && h.rr.get() != "" {
		h.dropped = true
		clear(h.ResponseWriter.Header())
	}
	if !h.dropped {
		h.started = true
	}
	return h.dropped
}

func (h *holdWriter) WriteHeader(code int) {
	if !h.hold() {
		h.ResponseWriter.WriteHeader(code)
	}
}

func (h *holdWriter) Write(b []byte) (int, error) {
	if h.hold() {
		return len(b), nil
	}
	return h.ResponseWriter.Write(b)
}

func (h *holdWriter) Flush() {
	if !h.hold() {
		http.NewResponseController(h.ResponseWriter).Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection (hijacks of
// forwarded WebSockets, deadlines).
func (h *holdWriter) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// serveLocal serves a request here; if a wake moved its sandbox to
// another node meanwhile, the request goes on to that node.
func (d *dataRouter) serveLocal(next http.Handler, w http.ResponseWriter, r *http.Request, id string) {
	rr := &reroute{}
	hw := &holdWriter{ResponseWriter: w, rr: rr}
	next.ServeHTTP(hw, r.WithContext(context.WithValue(r.Context(), rerouteKey{}, rr)))
	if !hw.dropped {
		return
	}
	if p := d.peerFor(r.Context(), id); p != nil {
		d.logf("data plane: sandbox %s woke on node %s; forwarding the request there", id, rr.get())
		p.serve(w, r)
		return
	}
	httpx.WriteError(w, httpx.Errorf(http.StatusBadGateway, "unavailable", "the sandbox woke on another node, which cannot be reached"))
}
