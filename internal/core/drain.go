package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Draining a node for an upgrade: placement stops at once (the drain is
// stored, so every replica honours it), then each of its sandboxes is
// hibernated there and woken on another node sharing its snapshot store,
// with the same id, so session tokens, data URLs by id and E2B ids keep
// working. What cannot move stays, with the reason in the operation's
// result.

// DrainRuntime is implemented by runtimes whose sandboxes can move between
// nodes (the scheduler of a server with remote nodes).
type DrainRuntime interface {
	// DrainTarget returns the node a sandbox of a drained node would move
	// to, or why none can take it (nothing is reserved).
	DrainTarget(ctx context.Context, sb Sandbox) (string, error)
	// NodesChanged drops what the runtime cached of the registry: a drain
	// or undrain counts at once on this replica (others see it within
	// their cache's age).
	NodesChanged()
}

// NodeDrains returns the store's drain records (through wrappers such as
// the metrics decorator).
func NodeDrains(st Store) (NodeDrainStore, bool) {
	for {
		if ds, ok := st.(NodeDrainStore); ok {
			return ds, true
		}
		u, ok := st.(interface{ Unwrap() Store })
		if !ok {
			return nil, false
		}
		st = u.Unwrap()
	}
}

// DrainResult is the result of a node.drain operation.
type DrainResult struct {
	Node   string        `json:"node"`
	Moved  []DrainMoved  `json:"moved"`
	Stayed []DrainStayed `json:"stayed"`
	// Hibernated counts the node's hibernated sandboxes: they are not
	// moved now; a wake places them on another node (shared store).
	Hibernated int `json:"hibernated"`
}

// DrainMoved is a sandbox a drain moved.
type DrainMoved struct {
	Sandbox string `json:"sandbox"`
	From    string `json:"from"`
	To      string `json:"to"`
	// Processes says what came back: as for a resume from hibernation.
	Processes string `json:"processes,omitempty"`
}

// DrainStayed is a sandbox a drain left on the node, and why.
type DrainStayed struct {
	Sandbox string `json:"sandbox"`
	State   string `json:"state"`
	Reason  string `json:"reason"`
}

// drainParallel bounds the sandboxes one drain moves at once.
const drainParallel = 4

// drainSettle bounds how long a drain waits for sandboxes of the node
// still being created when it started.
const drainSettle = 30 * time.Second

// drainStepWait bounds each step (hibernate, wake, pause) of one move.
const drainStepWait = 5 * time.Minute

func (s *Service) nodeRegistry() (NodeStore, NodeDrainStore, DrainRuntime, error) {
	ns, ok := s.store.(NodeStore)
	ds, ok2 := NodeDrains(s.store)
	dr, ok3 := s.runtime.(DrainRuntime)
	if !ok || !ok2 || !ok3 {
		return nil, nil, nil, fmt.Errorf("nodes are drained on servers with remote nodes (space server --remote-nodes): %w", ErrUnavailable)
	}
	return ns, ds, dr, nil
}

// node returns the registered node name (kind node).
func (s *Service) node(ctx context.Context, ns NodeStore, name string) (NodeRecord, error) {
	if name == "" || len(name) > 128 {
		return NodeRecord{}, invalid("node name must be 1 to 128 bytes")
	}
	nodes, err := ns.ListNodes(ctx)
	if err != nil {
		return NodeRecord{}, err
	}
	for _, n := range nodes {
		if n.Name == name && n.Kind == NodeKindNode {
			return n, nil
		}
	}
	return NodeRecord{}, fmt.Errorf("node %.128q: %w", name, ErrNotFound)
}

// ListNodes returns the registry (nodes and server replicas).
func (s *Service) ListNodes(ctx context.Context) ([]NodeRecord, error) {
	ns, _, _, err := s.nodeRegistry()
	if err != nil {
		return nil, err
	}
	return ns.ListNodes(ctx)
}

// UndrainNode lets the scheduler place on a drained node again. Sandboxes
// a drain moved away stay where they are.
func (s *Service) UndrainNode(ctx context.Context, name string) (NodeRecord, error) {
	ns, ds, _, err := s.nodeRegistry()
	if err != nil {
		return NodeRecord{}, err
	}
	if _, err := s.node(ctx, ns, name); err != nil {
		return NodeRecord{}, err
	}
	if err := ds.SetNodeDrained(ctx, name, false, s.opts.Now().UTC()); err != nil {
		return NodeRecord{}, err
	}
	s.runtime.(DrainRuntime).NodesChanged()
	s.opts.Logf("node %s undrained: placement resumes", name)
	return s.node(ctx, ns, name)
}

// DrainNode marks a node drained (placement stops before this returns)
// and starts the node.drain operation, in projectID (the caller's), that
// moves its running and paused sandboxes away. Draining a drained node
// again moves what is still there.
func (s *Service) DrainNode(ctx context.Context, projectID, name, idemKey string) (Operation, error) {
	ns, ds, dr, err := s.nodeRegistry()
	if err != nil {
		return Operation{}, err
	}
	if len(idemKey) > 128 {
		return Operation{}, invalid("Idempotency-Key longer than 128 bytes")
	}
	if _, err := s.node(ctx, ns, name); err != nil {
		return Operation{}, err
	}
	if err := ds.SetNodeDrained(ctx, name, true, s.opts.Now().UTC()); err != nil {
		return Operation{}, err
	}
	dr.NodesChanged()
	s.opts.Logf("node %s drained: no more placements there; moving its sandboxes away", name)
	op := s.engine.NewOperation(projectID, "node.drain", name)
	return s.engine.Submit(ctx, op, idemKey, func(ctx context.Context, progress Progress) (any, error) {
		return s.runDrain(ctx, dr, op, progress)
	})
}

func (s *Service) runDrain(ctx context.Context, dr DrainRuntime, op Operation, progress Progress) (any, error) {
	name := op.Target
	res := DrainResult{Node: name, Moved: []DrainMoved{}, Stayed: []DrainStayed{}}
	var mu sync.Mutex
	done := map[string]bool{}
	// A placement made just before the drain was stored may still be
	// creating: later passes take what appeared meanwhile, for up to
	// drainSettle; what is still creating then is reported as stayed.
	settle := time.Now().Add(drainSettle)
	for {
		todo, hibernated, creating, err := s.nodeSandboxes(ctx, name, done)
		if err != nil {
			return nil, err
		}
		res.Hibernated = hibernated
		if len(todo) == 0 && len(creating) == 0 {
			break
		}
		if len(todo) == 0 && time.Now().After(settle) {
			for _, sb := range creating {
				res.Stayed = append(res.Stayed, DrainStayed{Sandbox: sb.ID, State: string(sb.State),
					Reason: fmt.Sprintf("still creating after %v; drain the node again to move it", drainSettle)})
			}
			break
		}
		if len(todo) == 0 {
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			continue
		}
		sem := make(chan struct{}, drainParallel)
		var wg sync.WaitGroup
		for _, sb := range todo {
			done[sb.ID] = true
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				moved, stayed := s.drainOne(ctx, dr, op, sb)
				mu.Lock()
				defer mu.Unlock()
				if stayed != nil {
					res.Stayed = append(res.Stayed, *stayed)
				} else {
					res.Moved = append(res.Moved, *moved)
				}
				progress(min(95, 5+90*(len(res.Moved)+len(res.Stayed))/max(len(done), 1)),
					fmt.Sprintf("%d moved, %d stayed", len(res.Moved), len(res.Stayed)))
			}()
		}
		wg.Wait()
	}
	s.opts.Logf("node %s drained: %d sandboxes moved, %d stayed, %d hibernated", name, len(res.Moved), len(res.Stayed), res.Hibernated)
	return res, nil
}

// nodeSandboxes lists the running and paused sandboxes of node not in
// done and its creating ones, and counts its hibernated ones.
func (s *Service) nodeSandboxes(ctx context.Context, node string, done map[string]bool) (todo []Sandbox, hibernated int, creating []Sandbox, err error) {
	after := ""
	for {
		page, err := s.store.ListSandboxes(ctx, SandboxFilter{After: after, Limit: 500,
			States: []SandboxState{SandboxCreating, SandboxRunning, SandboxPaused, SandboxHibernated}})
		if err != nil {
			return nil, 0, nil, fmt.Errorf("list sandboxes of node %s: %w", node, err)
		}
		for _, sb := range page {
			switch {
			case sb.Node != node:
			case sb.State == SandboxHibernated:
				hibernated++
			case sb.State == SandboxCreating:
				creating = append(creating, sb)
			case !done[sb.ID]:
				todo = append(todo, sb)
			}
		}
		if len(page) < 500 {
			return todo, hibernated, creating, nil
		}
		after = page[len(page)-1].ID
	}
}

// drainOne moves one sandbox: hibernate on its node, wake (the scheduler
// places it off the drained node), and pause it again if it was paused.
func (s *Service) drainOne(ctx context.Context, dr DrainRuntime, op Operation, sb Sandbox) (*DrainMoved, *DrainStayed) {
	stay := func(state SandboxState, format string, args ...any) (*DrainMoved, *DrainStayed) {
		st := &DrainStayed{Sandbox: sb.ID, State: string(state), Reason: fmt.Sprintf(format, args...)}
		s.publishDrain(ctx, op, sb, map[string]any{"id": sb.ID, "node": sb.Node, "stayed": st.Reason, "state": st.State})
		return nil, st
	}
	if _, err := dr.DrainTarget(ctx, sb); err != nil {
		return stay(sb.State, "%v", err)
	}
	wasPaused := sb.State == SandboxPaused
	hop, err := s.hibernate(ctx, sb.ProjectID, sb.ID, "", true)
	if err == nil {
		_, err = s.waitDone(ctx, sb.ProjectID, hop)
	}
	if err != nil {
		return stay(sb.State, "hibernate: %v", err)
	}
	processes := hibernateProcesses
	if h, err := s.store.GetSandbox(ctx, sb.ProjectID, sb.ID); err == nil {
		processes = s.hibernationProcesses(ctx, sb.ProjectID, h.HibernatedSnapshot)
	}
	wop, err := s.wake(ctx, sb.ProjectID, sb.ID, "")
	if err == nil {
		_, err = s.waitDone(ctx, sb.ProjectID, wop)
	}
	if err != nil {
		// It is hibernated: any resume (or a data-plane call with
		// auto_resume) wakes it, on another node where one has room.
		return stay(SandboxHibernated, "hibernated, but the wake failed (resume it later): %v", err)
	}
	cur, err := s.store.GetSandbox(ctx, sb.ProjectID, sb.ID)
	if err != nil {
		return stay(sb.State, "%v", err)
	}
	if wasPaused {
		pop, err := s.Pause(ctx, sb.ProjectID, sb.ID, "")
		if err == nil {
			_, err = s.waitDone(ctx, sb.ProjectID, pop)
		}
		if err != nil {
			s.opts.Logf("sandbox %s: pause again after its move: %v", sb.ID, err)
		}
	}
	if cur.Node == sb.Node {
		return stay(cur.State, "no other node could take it when it woke; it runs on node %s again", sb.Node)
	}
	m := &DrainMoved{Sandbox: sb.ID, From: sb.Node, To: cur.Node, Processes: processes}
	s.opts.Logf("sandbox %s: moved from drained node %s to node %s", sb.ID, sb.Node, cur.Node)
	s.publishDrain(ctx, op, sb, map[string]any{"id": sb.ID, "from": m.From, "to": m.To, "processes": m.Processes})
	return m, nil
}

// publishDrain tells the sandbox's project (and the drain's, if another)
// that a drain moved or left its sandbox.
func (s *Service) publishDrain(ctx context.Context, op Operation, sb Sandbox, data map[string]any) {
	typ := "sandbox.moved"
	if _, ok := data["stayed"]; ok {
		typ = "sandbox.drain_stayed"
	}
	for _, p := range []string{sb.ProjectID, op.ProjectID} {
		if err := s.broker.Publish(context.WithoutCancel(ctx), p, typ, sb.ID, op.ID, data); err != nil {
			s.opts.Logf("sandbox %s: publish %s: %v", sb.ID, typ, err)
		}
		if op.ProjectID == sb.ProjectID {
			break
		}
	}
}

// waitDone waits for an operation to finish and returns its error, if it
// failed, as an error.
func (s *Service) waitDone(ctx context.Context, projectID string, op Operation) (Operation, error) {
	op, err := s.engine.Wait(ctx, projectID, op.ID, drainStepWait)
	switch {
	case err != nil:
		return op, err
	case op.State == OpSucceeded:
		return op, nil
	case op.Error != nil:
		return op, errors.New(op.Error.Message)
	default:
		return op, fmt.Errorf("operation %s is %s after %v", op.ID, op.State, drainStepWait)
	}
}
