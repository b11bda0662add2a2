package cluster

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// The placement view. A node's heartbeat says what it had committed (the
// limits of its sandboxes) when it was sent, and which generation of its
// committed set that was: a counter the node bumps on every sandbox it
// takes or lets go, starting at its start time in nanoseconds so that a
// restarted node's counter is ahead of everything its previous process
// said. Between heartbeats a replica adds what it placed and subtracts
// what it stopped; the node's start and stop answers carry the generation
// at which the change took effect, so the replica drops each change
// exactly when a heartbeat shows it. Nothing depends on clocks agreeing.

// Headers of node RPC answers.
const (
	// HeaderGeneration: the node's generation after the call.
	HeaderGeneration = "Space-Node-Generation"
	// HeaderAdded: for a stop, the generation at which the node had taken
	// the sandbox (absent if it did not run it).
	HeaderAdded = "Space-Node-Added"
)

// Generations is implemented by node backends that count the changes to
// their committed set (the heartbeat's NodeRecord.Generation).
type Generations interface {
	Generation() uint64
	// AddedAt returns the generation at which id was committed (0: not).
	AddedAt(id string) uint64
}

// pendingMaxAge bounds how long a change waits for a heartbeat: a start
// in flight that long, or a node that stopped heartbeating, no longer
// counts (a node not heartbeating is not scheduled on anyway).
const pendingMaxAge = 10 * time.Minute

// pending is a change this replica made to a node's committed set that
// the node's last heartbeat may not show yet.
type pending struct {
	id          string
	at          time.Time
	memory, cpu int64
	stopped     bool   // a stop (subtracts) rather than a placement (adds)
	gen         uint64 // the node's generation once it took effect (0: start in flight)
	added       uint64 // a stop: the generation at which the node had taken it
}

// apply returns n's committed use with this replica's pending changes and
// drops the changes n's heartbeat already shows. r.mu is held.
func (r *Remote) apply(n core.NodeRecord, now time.Time) (mem, cpu int64, count int) {
	mem, cpu, count = n.UsedMemoryBytes, n.UsedCPUMillis, n.Sandboxes
	kept := r.reserved[n.Name][:0]
	for _, p := range r.reserved[n.Name] {
		if now.Sub(p.at) > pendingMaxAge {
			continue
		}
		if n.Generation == 0 {
			// A node that counts no generations: a heartbeat sent a while
			// after the change shows it.
			if n.HeartbeatAt.After(p.at.Add(2*time.Second)) && (p.gen != 0 || p.stopped) {
				continue
			}
			kept = append(kept, p)
			if !p.stopped {
				mem, cpu, count = mem+p.memory, cpu+p.cpu, count+1
			}
			continue
		}
		if p.gen != 0 && n.Generation >= p.gen {
			continue // the heartbeat shows it
		}
		kept = append(kept, p)
		switch {
		case !p.stopped:
			mem, cpu, count = mem+p.memory, cpu+p.cpu, count+1
		case n.Generation >= p.added:
			// The heartbeat still counts a sandbox that is gone.
			mem, cpu, count = mem-p.memory, cpu-p.cpu, count-1
		}
	}
	r.reserved[n.Name] = kept
	return max(mem, 0), max(cpu, 0), max(count, 0)
}

// reserve records a placement of sb on node (its start not answered yet).
func (r *Remote) reserve(node string, sb core.Sandbox, now time.Time) {
	r.reserved[node] = append(r.reserved[node], pending{id: sb.ID, at: now, memory: sb.Limits.MemoryBytes, cpu: sb.Limits.CPUMillis})
}

// started records that node took the sandbox at generation gen.
func (r *Remote) started(node, id string, gen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, p := range r.reserved[node] {
		if p.id == id && !p.stopped {
			r.reserved[node][i].gen = gen
			if gen == 0 {
				// A node that counts no generations: wait for heartbeats.
				r.reserved[node][i].at = r.o.Now()
			}
			return
		}
	}
}

// stoppedOn records that node let sb go at generation gen, having taken
// it at generation added: until a heartbeat shows it, its limits are
// free. A placement of it not yet shown is dropped with it.
func (r *Remote) stoppedOn(node string, sb core.Sandbox, gen, added uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	list := r.reserved[node][:0]
	for _, p := range r.reserved[node] {
		if p.id != sb.ID {
			list = append(list, p)
		}
	}
	if gen != 0 && added != 0 {
		list = append(list, pending{id: sb.ID, at: r.o.Now(), memory: sb.Limits.MemoryBytes, cpu: sb.Limits.CPUMillis,
			stopped: true, gen: gen, added: added})
	}
	r.reserved[node] = list
}

// ReleasePlacement implements core.PlacementReleaser: a placement whose
// sandbox was never stored (or was a replay) frees its reservation.
func (r *Remote) ReleasePlacement(node, id string) { r.unreserve(node, id) }

// genSink collects the generation headers of one node call.
type genSink struct{ gen, added uint64 }

type genSinkKey struct{}

// withGenSink returns ctx whose node calls record their generations in s.
func withGenSink(ctx context.Context) (context.Context, *genSink) {
	s := &genSink{}
	return context.WithValue(ctx, genSinkKey{}, s), s
}

// readGenerations fills ctx's sink (if any) from an answer's headers.
func readGenerations(ctx context.Context, h http.Header) {
	s, _ := ctx.Value(genSinkKey{}).(*genSink)
	if s == nil {
		return
	}
	s.gen, _ = strconv.ParseUint(h.Get(HeaderGeneration), 10, 64)
	s.added, _ = strconv.ParseUint(h.Get(HeaderAdded), 10, 64)
}

// rpcMeta carries what a route learns for the answer's headers.
type rpcMeta struct{ added uint64 }

type rpcMetaKey struct{}

// stopRoute serves PathStop, noting when the node had taken the sandbox.
func (h *Handler) stopRoute(ctx context.Context, id string) error {
	if g, ok := h.b.(Generations); ok {
		if m, _ := ctx.Value(rpcMetaKey{}).(*rpcMeta); m != nil {
			m.added = g.AddedAt(id)
		}
	}
	return h.b.StopSandbox(ctx, id)
}

// writeGenerations sets the generation headers of an answer.
func (h *Handler) writeGenerations(w http.ResponseWriter, m *rpcMeta) {
	g, ok := h.b.(Generations)
	if !ok {
		return
	}
	w.Header().Set(HeaderGeneration, strconv.FormatUint(g.Generation(), 10))
	if m.added != 0 {
		w.Header().Set(HeaderAdded, strconv.FormatUint(m.added, 10))
	}
}

// noRoom explains a 429: what each candidate node has free.
func noRoom(sb core.Sandbox, full []string) error {
	return fmt.Errorf("no ready node with template %q has room for a sandbox of %s memory (%s): %w",
		sb.Template, gib(sb.Limits.MemoryBytes), strings.Join(full, "; "), core.ErrExhausted)
}

func gib(b int64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }

// nodeCacheTTL bounds how old the registry a replica places and routes
// with may be. A heartbeat comes every second or so and the placement view
// adds this replica's own changes, so a quarter second costs nothing in
// accuracy and saves a query on every create, start, stop and session.
const nodeCacheTTL = 250 * time.Millisecond

// listNodes returns the registry, read at most nodeCacheTTL ago.
func (r *Remote) listNodes(ctx context.Context) ([]core.NodeRecord, error) {
	r.cacheMu.Lock()
	defer r.cacheMu.Unlock()
	if r.cache != nil && time.Since(r.cacheAt) < r.o.NodeCacheTTL {
		return r.cache, nil
	}
	nodes, err := r.ns.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	r.cache, r.cacheAt = nodes, time.Now()
	return nodes, nil
}

// expireNodeCache forgets the cached registry if it is older than age.
func (r *Remote) expireNodeCache(age time.Duration) {
	r.cacheMu.Lock()
	defer r.cacheMu.Unlock()
	if time.Since(r.cacheAt) >= age {
		r.cache = nil
	}
}

// dropNodeCache forgets the cached registry and reports whether there was
// one (so a refusal made on it is worth checking again).
func (r *Remote) dropNodeCache() bool {
	r.cacheMu.Lock()
	defer r.cacheMu.Unlock()
	had := r.cache != nil
	r.cache = nil
	return had
}
