package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// RemoteOptions configure the remote runtime.
type RemoteOptions struct {
	Store  core.Store // must implement core.NodeStore
	Signer *Signer
	// Timeout: a node whose last heartbeat is older is not scheduled on
	// (and the monitor marks it lost).
	Timeout time.Duration
	// ProjectQuota bounds a project's live sandboxes (0 = no bound).
	ProjectQuota int
	// Credentials opens the secrets of credentials a policy attaches, sent
	// to the sandbox's node in the signed start and network calls (nil:
	// policies with credentials are refused).
	Credentials CredentialResolver
	// Link says how nodes are reached (TLS, or plaintext on loopback);
	// its zero value refuses every node URL.
	Link LinkOptions
	// HTTP, if set, replaces Link's clients (tests).
	HTTP *http.Client
	Logf func(string, ...any)
	Now  func() time.Time
	// NodeCacheTTL: how old the registry used to place and route may be
	// (0: 250 ms; negative: read it every time).
	NodeCacheTTL time.Duration
	// RoomWait: how long a create that finds every node full waits for
	// heartbeats to show room before it is refused (0: 2 s; negative: no
	// wait). Another replica's deletes reach this one only through the
	// nodes' heartbeats, so a refusal on the first look can be false.
	RoomWait time.Duration
}

// Remote is core.Runtime over `space node` processes: a scheduler places
// each sandbox (Place) on the ready node with the most free capacity that
// has its template, and lifecycle calls go to the node the sandbox record
// names, from whichever server replica receives them.
type Remote struct {
	o  RemoteOptions
	ns core.NodeStore

	mu       sync.Mutex
	clients  map[string]*Client
	reserved map[string][]pending // node → changes not yet in its heartbeat (placement.go)

	cacheMu sync.Mutex
	cache   []core.NodeRecord // the registry as last read (listNodes)
	cacheAt time.Time

	sus suspects // nodes whose link failed since their last heartbeat
}

var (
	_ core.Runtime      = (*Remote)(nil)
	_ core.PauseRuntime = (*Remote)(nil)
	_ core.Placer       = (*Remote)(nil)
)

// NewRemote returns the remote runtime.
func NewRemote(o RemoteOptions) (*Remote, error) {
	ns, ok := o.Store.(core.NodeStore)
	if !ok {
		return nil, fmt.Errorf("remote nodes: the store keeps no node registry: %w", core.ErrInvalid)
	}
	if o.Timeout <= 0 {
		o.Timeout = 15 * time.Second
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.NodeCacheTTL == 0 {
		o.NodeCacheTTL = nodeCacheTTL
	}
	if o.RoomWait == 0 {
		o.RoomWait = roomWait
	}
	return &Remote{o: o, ns: ns, clients: map[string]*Client{}, reserved: map[string][]pending{}}, nil
}

// fresh reports whether a node can be scheduled on now.
func (r *Remote) fresh(n core.NodeRecord, now time.Time) bool {
	return n.Kind == core.NodeKindNode && n.State == core.NodeReady && n.RPCURL != "" &&
		now.Sub(n.HeartbeatAt) <= r.o.Timeout
}

// Nodes returns the registry.
func (r *Remote) Nodes(ctx context.Context) ([]core.NodeRecord, error) { return r.ns.ListNodes(ctx) }

// Place implements core.Placer.
func (r *Remote) Place(ctx context.Context, sb core.Sandbox) (string, error) {
	if r.o.ProjectQuota > 0 {
		live, err := r.o.Store.ListSandboxes(ctx, core.SandboxFilter{ProjectID: sb.ProjectID, Limit: r.o.ProjectQuota + 1,
			States: []core.SandboxState{core.SandboxCreating, core.SandboxRunning, core.SandboxPaused, core.SandboxDeleting}})
		if err != nil {
			return "", err
		}
		if len(live) >= r.o.ProjectQuota {
			return "", fmt.Errorf("project %s has %d live sandboxes, its quota: %w", sb.ProjectID, len(live), core.ErrExhausted)
		}
	}
	var pc placeConstraint
	if sb.Snapshot != "" {
		// A fork restores on the node that keeps its snapshot's data, or,
		// where that node shares its snapshot store, on any node sharing
		// it (preferring the one with the data on its disk).
		n, err := r.snapshotNode(ctx, sb.Snapshot)
		if err != nil {
			return "", err
		}
		if pc, err = r.snapshotConstraint(ctx, n); err != nil {
			return "", err
		}
	}
	return r.place(ctx, sb, pc)
}

// place chooses a node for sb under pc and reserves its capacity there;
// a refusal made on a cached registry is checked against a fresh one, and
// one for want of room waits for newer heartbeats (waitRoom).
func (r *Remote) place(ctx context.Context, sb core.Sandbox, pc placeConstraint) (string, error) {
	node, err := r.placeIn(ctx, sb, pc)
	if err != nil && r.dropNodeCache() {
		node, err = r.placeIn(ctx, sb, pc)
	}
	if errors.Is(err, core.ErrExhausted) {
		node, err = r.waitRoom(ctx, sb, pc, err)
	}
	return node, err
}

// roomWait is RemoteOptions.RoomWait's default: two heartbeats of a node
// that beats every second, which also beats again right after it lets a
// sandbox go.
const roomWait = 2 * time.Second

// roomPoll is how often a create waiting for room reads the registry; the
// waiters share each read (listNodes with this as the cache's age).
const roomPoll = 100 * time.Millisecond

// waitRoom retries a placement refused for want of room until a heartbeat
// shows room, RoomWait passes or ctx ends; it returns the last refusal.
func (r *Remote) waitRoom(ctx context.Context, sb core.Sandbox, pc placeConstraint, refusal error) (string, error) {
	if r.o.RoomWait < 0 {
		return "", refusal
	}
	t := time.NewTimer(r.o.RoomWait)
	defer t.Stop()
	tick := time.NewTicker(roomPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return "", refusal
		case <-t.C:
			return "", refusal
		case <-tick.C:
		}
		r.expireNodeCache(roomPoll)
		node, err := r.placeIn(ctx, sb, pc)
		if !errors.Is(err, core.ErrExhausted) {
			return node, err
		}
		refusal = err
	}
}

func (r *Remote) placeIn(ctx context.Context, sb core.Sandbox, pc placeConstraint) (string, error) {
	pinned := pc.pinned
	nodes, err := r.listNodes(ctx)
	if err != nil {
		return "", err
	}
	now := r.o.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	best, bestScore, ready, withTemplate, noEgress, drained := "", -1e18, 0, 0, 0, 0
	var ties, full []string
	for _, n := range nodes {
		if !r.fresh(n, now) || pinned != "" && n.Name != pinned || !pc.allows(n) || r.sus.skip(n) {
			continue
		}
		if n.Drained {
			drained++
			continue
		}
		if needsEgress(sb.Network) && !n.Egress {
			noEgress++
			continue
		}
		ready++
		if !slices.Contains(n.Templates, sb.TemplateKey()) {
			continue
		}
		withTemplate++
		mem, cpu, count := r.apply(n, now)
		if n.MaxSandboxes > 0 && count >= n.MaxSandboxes {
			full = append(full, fmt.Sprintf("%s runs %d sandboxes, its maximum", n.Name, count))
			continue
		}
		if n.MemoryBytes > 0 && n.MemoryBytes-mem < sb.Limits.MemoryBytes {
			full = append(full, fmt.Sprintf("%s has %s of %s free", n.Name, gib(n.MemoryBytes-mem), gib(n.MemoryBytes)))
			continue
		}
		// Spread by free memory and free CPU alike (CPU is overcommitted
		// by design, so its share may go below zero).
		score := 1.0
		if n.MemoryBytes > 0 {
			score = float64(n.MemoryBytes-mem-sb.Limits.MemoryBytes) / float64(n.MemoryBytes)
		}
		if n.CPUMillis > 0 {
			score += float64(n.CPUMillis-cpu-sb.Limits.CPUMillis) / float64(n.CPUMillis)
		} else {
			score++
		}
		switch {
		case score > bestScore+1e-9:
			best, bestScore, ties = n.Name, score, []string{n.Name}
		case score > bestScore-1e-9:
			ties = append(ties, n.Name)
		}
	}
	switch {
	case ready == 0 && noEgress > 0:
		return "", fmt.Errorf("network mode %s needs a node with the egress gateway; none of the %d ready nodes has one (space node --egress): %w", sb.Network.Mode, noEgress, core.ErrUnavailable)
	case ready == 0 && pinned != "" && drained > 0:
		return "", fmt.Errorf("snapshot %s is kept on node %s, which is drained (space node undrain %s): %w", sb.Snapshot, pinned, pinned, core.ErrUnavailable)
	case ready == 0 && pinned != "":
		return "", fmt.Errorf("snapshot %s is kept on node %s, which is not ready: %w", sb.Snapshot, pinned, core.ErrUnavailable)
	case ready == 0 && drained > 0:
		return "", fmt.Errorf("every ready node that could take it is drained (%d): %w", drained, core.ErrUnavailable)
	case ready == 0 && pc.store != "":
		return "", fmt.Errorf("no ready node shares snapshot store %s: %w", pc.store, core.ErrUnavailable)
	case ready == 0:
		return "", fmt.Errorf("no ready node (none has sent a heartbeat in the last %v): %w", r.o.Timeout, core.ErrUnavailable)
	case withTemplate == 0:
		return "", fmt.Errorf("template %q is on none of the %d ready nodes: %w", sb.Template, ready, core.ErrNotFound)
	case best == "":
		return "", noRoom(sb, full)
	}
	switch {
	case pc.prefer != "" && slices.Contains(ties, pc.prefer):
		// Forks spread by free capacity like creates; of equals, the
		// node with the snapshot's data on its disk.
		best = pc.prefer
	case len(ties) > 1:
		best = ties[rand.IntN(len(ties))]
	}
	r.reserve(best, sb, now)
	return best, nil
}

// client returns the client of a node; ErrNotFound when it has no record,
// errNodeLost when it is marked lost (both checked on a fresh registry).
func (r *Remote) client(ctx context.Context, name string) (*Client, error) {
	c, err := r.clientIn(ctx, name)
	if err != nil && r.dropNodeCache() {
		c, err = r.clientIn(ctx, name)
	}
	return c, err
}

func (r *Remote) clientIn(ctx context.Context, name string) (*Client, error) {
	nodes, err := r.listNodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if n.Name != name || n.Kind != core.NodeKindNode {
			continue
		}
		if n.State == core.NodeLost {
			return nil, fmt.Errorf("node %s is lost (%s): %w", name, n.StateReason, errNodeLost)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		c := r.clients[name]
		if c == nil || c.URL != n.RPCURL {
			hc := r.o.HTTP
			if hc == nil {
				if hc, err = r.o.Link.HTTPClient(name, n.RPCURL); err != nil {
					return nil, err
				}
			}
			c = NewClient(name, n.RPCURL, r.o.Signer, hc)
			r.clients[name] = c
		}
		return c, nil
	}
	return nil, fmt.Errorf("node %q is not registered: %w", name, core.ErrNotFound)
}

var errNodeLost = errors.New("node lost")

// nodeOf returns the node a sandbox record names.
func (r *Remote) nodeOf(ctx context.Context, id string) (string, error) {
	sb, err := r.o.Store.GetSandbox(ctx, "", id)
	if err != nil {
		return "", err
	}
	if sb.Node == "" {
		return "", fmt.Errorf("sandbox %s has no node: %w", id, core.ErrNotFound)
	}
	return sb.Node, nil
}

func (r *Remote) unreserve(node, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	list := r.reserved[node]
	for i, p := range list {
		if p.id == id && !p.stopped {
			r.reserved[node] = append(list[:i], list[i+1:]...)
			return
		}
	}
}

// StartSandbox implements core.Runtime on the node Place chose. When the
// call fails the node is told to stop the sandbox (it may have started it
// before the answer was lost), so nothing is left behind.
func (r *Remote) StartSandbox(ctx context.Context, sb core.Sandbox, progress core.Progress) (core.Placement, error) {
	if sb.Node == "" {
		return core.Placement{}, fmt.Errorf("sandbox %s was not placed on a node: %w", sb.ID, core.ErrUnavailable)
	}
	pl, err := r.startOn(ctx, sb, progress)
	if err != nil {
		if pl, tried, err2 := r.startElsewhere(ctx, sb, err, progress); tried {
			return pl, err2
		}
	}
	return pl, err
}

// startOn starts sb on the node its record names.
func (r *Remote) startOn(ctx context.Context, sb core.Sandbox, progress core.Progress) (core.Placement, error) {
	c, err := r.client(ctx, sb.Node)
	if err != nil {
		r.unreserve(sb.Node, sb.ID)
		return core.Placement{}, fmt.Errorf("start on node %s: %w", sb.Node, err)
	}
	creds, err := r.credentials(ctx, sb.ProjectID, sb.Network)
	if err == nil {
		err = r.secretsTo(c, creds)
	}
	if err != nil {
		r.unreserve(sb.Node, sb.ID)
		return core.Placement{}, err
	}
	// No progress save of its own: the record names the node, and each
	// save is a write and an event in the shared store.
	gctx, gens := withGenSink(ctx)
	pl, err := c.StartSandbox(gctx, sb, creds...)
	if err != nil {
		r.unreserve(sb.Node, sb.ID)
		if errors.As(err, new(unreachableError)) {
			r.sus.mark(sb.Node, r.o.Now())
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if stopErr := c.StopSandbox(sctx, sb.ID); stopErr != nil && !errors.Is(stopErr, core.ErrUnavailable) {
			r.o.Logf("sandbox %s: stop on node %s after failed start: %v", sb.ID, sb.Node, stopErr)
		}
		return core.Placement{}, err
	}
	r.started(sb.Node, sb.ID, gens.gen)
	return pl, nil
}

// StopSandbox implements core.Runtime. A sandbox whose node is lost or
// gone has nothing left to stop from here: a node that comes back sweeps
// every sandbox the store no longer gives it.
func (r *Remote) StopSandbox(ctx context.Context, id string) error {
	sb, err := r.o.Store.GetSandbox(ctx, "", id)
	if errors.Is(err, core.ErrNotFound) || err == nil && sb.Node == "" {
		return nil
	}
	if err != nil {
		return err
	}
	c, err := r.client(ctx, sb.Node)
	if errors.Is(err, errNodeLost) || errors.Is(err, core.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	gctx, gens := withGenSink(ctx)
	if err := c.StopSandbox(gctx, id); err != nil {
		return err
	}
	// Its room is free from now on, not only from the node's next heartbeat.
	r.stoppedOn(sb.Node, sb, gens.gen, gens.added)
	return nil
}

// AdoptSandbox implements core.Runtime: nodes adopt their own sandboxes
// when they start; a server has nothing to re-attach.
func (r *Remote) AdoptSandbox(ctx context.Context, sb core.Sandbox) error { return nil }

// Sweep implements core.Runtime: nodes sweep their own hosts.
func (r *Remote) Sweep(ctx context.Context, keep map[string]bool) error { return nil }

// HasTemplate implements core.Runtime: some ready node has the template
// (a refusal is checked on a fresh registry).
func (r *Remote) HasTemplate(ctx context.Context, name string) error {
	err := r.hasTemplateIn(ctx, name)
	if err != nil && r.dropNodeCache() {
		err = r.hasTemplateIn(ctx, name)
	}
	return err
}

func (r *Remote) hasTemplateIn(ctx context.Context, name string) error {
	nodes, err := r.listNodes(ctx)
	if err != nil {
		return err
	}
	now, ready := r.o.Now(), 0
	for _, n := range nodes {
		if !r.fresh(n, now) {
			continue
		}
		ready++
		if slices.Contains(n.Templates, name) {
			return nil
		}
	}
	if ready == 0 {
		return fmt.Errorf("no ready node: %w", core.ErrUnavailable)
	}
	return fmt.Errorf("template %q is on none of the %d ready nodes: %w", name, ready, core.ErrNotFound)
}

func (r *Remote) onNode(ctx context.Context, id string, fn func(*Client) error) error {
	node, err := r.nodeOf(ctx, id)
	if err != nil {
		return err
	}
	c, err := r.client(ctx, node)
	if errors.Is(err, errNodeLost) {
		return fmt.Errorf("%v: %w", err, core.ErrUnavailable)
	}
	if err != nil {
		return err
	}
	return fn(c)
}

// PauseSandbox implements core.PauseRuntime.
func (r *Remote) PauseSandbox(ctx context.Context, id string) error {
	return r.onNode(ctx, id, func(c *Client) error { return c.PauseSandbox(ctx, id) })
}

// ResumeSandbox implements core.PauseRuntime.
func (r *Remote) ResumeSandbox(ctx context.Context, id string) error {
	return r.onNode(ctx, id, func(c *Client) error { return c.ResumeSandbox(ctx, id) })
}

// DataURL returns the data-plane URL of the node a sandbox runs on ("" if
// unknown).
func (r *Remote) DataURL(sb core.Sandbox) string {
	if sb.Node == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nodes, err := r.listNodes(ctx)
	if err != nil {
		return ""
	}
	for _, n := range nodes {
		if n.Name == sb.Node {
			return n.DataURL
		}
	}
	return ""
}
