package core

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Node kinds and states in the node registry (NodeStore).
const (
	NodeKindNode   = "node"   // a `space node` process
	NodeKindServer = "server" // a `space server --remote-nodes` replica

	NodeReady = "ready"
	NodeLost  = "lost"
)

// NodeRecord is one registered process of a scaled-out cluster: a `space
// node` (which runs sandboxes) or a server replica (which runs operations).
// Each refreshes its record (a heartbeat) every few seconds; one whose
// heartbeat is older than the cluster's timeout is marked lost.
type NodeRecord struct {
	Name  string `json:"name"`
	Kind  string `json:"kind"`
	State string `json:"state"`
	// StateReason says why a node is lost.
	StateReason string `json:"state_reason,omitempty"`
	// RPCURL is where servers call the node (node kind only); DataURL is
	// the data plane its sandboxes' clients use.
	RPCURL  string `json:"rpc_url,omitempty"`
	DataURL string `json:"data_url,omitempty"`
	Driver  string `json:"driver,omitempty"`
	// Capacity and what is committed to sandboxes (limits, not use).
	CPUMillis       int64     `json:"cpu_millis,omitempty"`
	MemoryBytes     int64     `json:"memory_bytes,omitempty"`
	MaxSandboxes    int       `json:"max_sandboxes,omitempty"`
	UsedCPUMillis   int64     `json:"used_cpu_millis,omitempty"`
	UsedMemoryBytes int64     `json:"used_memory_bytes,omitempty"`
	Sandboxes       int       `json:"sandboxes"`
	Templates       []string  `json:"templates,omitempty"`
	StartedAt       time.Time `json:"started_at"`
	HeartbeatAt     time.Time `json:"heartbeat_at"`
	// SnapshotStore names the snapshot store the node shares with others
	// ("" = snapshots stay on the node): a snapshot captured on a node
	// can be restored on any node naming the same store.
	SnapshotStore string `json:"snapshot_store,omitempty"`
	// Egress: the node runs the egress gateway (space node --egress), so
	// its sandboxes can have a policy other than blocked.
	Egress bool `json:"egress,omitempty"`
	// EgressRanges are its gateway's effective address sets.
	EgressRanges *EgressRanges `json:"egress_ranges,omitempty"`
	// Generation numbers the committed set this record shows: the node
	// bumps it on every sandbox it takes or lets go (the placement view in
	// internal/cluster).
	Generation uint64 `json:"generation,omitempty"`
	// Drained: an operator drained the node (space node drain): nothing is
	// placed on it, and its sandboxes were moved away where they could
	// be. It is kept apart from the heartbeat (NodeDrainStore), so a
	// drained node that restarts stays drained until undrained.
	Drained   bool       `json:"drained,omitempty"`
	DrainedAt *time.Time `json:"drained_at,omitempty"`

	// TemplateLayers are the templates built over the API that the node
	// can hand to other nodes (TemplateLayer).
	TemplateLayers []TemplateLayer `json:"template_layers,omitempty"`
}

// NodeStore is the node registry, implemented by stores that a cluster
// shares (and by SQLite, for one machine).
type NodeStore interface {
	// PutNode stores n (a heartbeat): inserted or replaced, State set to
	// ready. It returns the record it replaced (State "" if none), so a
	// node learns that it had been marked lost.
	PutNode(ctx context.Context, n NodeRecord) (NodeRecord, error)
	ListNodes(ctx context.Context) ([]NodeRecord, error)
	// MarkNodeLost marks a ready node lost if its heartbeat is older than
	// staleBefore; it reports whether this call did it (so of several
	// servers watching, exactly one acts on the loss).
	MarkNodeLost(ctx context.Context, name string, staleBefore time.Time, reason string) (bool, error)
	// DeleteNode removes a record (a node that shut down cleanly).
	DeleteNode(ctx context.Context, name string) error
}

// NodeDrainStore records which nodes are drained, apart from their
// heartbeat records (a heartbeat never clears a drain, and a node that
// shuts down and comes back stays drained); ListNodes reports it in
// NodeRecord.Drained.
type NodeDrainStore interface {
	// SetNodeDrained records a drain of node name at at (drained) or
	// removes it; setting what is already set changes nothing (the first
	// drain's time stays).
	SetNodeDrained(ctx context.Context, name string, drained bool, at time.Time) error
}

// DecodeNodeRecord decodes a stored node record and sets its drain from
// the drain table (drainedAt in Unix nanoseconds, when drained); what the
// heartbeat's document says of it is ignored.
func DecodeNodeRecord(doc string, drainedAt int64, drained bool) (NodeRecord, error) {
	var n NodeRecord
	if err := json.Unmarshal([]byte(doc), &n); err != nil {
		return NodeRecord{}, fmt.Errorf("decode node: %w", err)
	}
	n.Drained, n.DrainedAt = drained, nil
	if drained {
		at := time.Unix(0, drainedAt).UTC()
		n.DrainedAt = &at
	}
	return n, nil
}

// OwnedOperations is implemented by stores that record which server runs
// each operation (PostgreSQL): a surviving replica fails the unfinished
// operations of a lost one.
type OwnedOperations interface {
	UnfinishedOperationsOf(ctx context.Context, owner string) ([]Operation, error)
}

// Placer is implemented by runtimes that choose a node per sandbox (the
// scheduler of a server with remote nodes). Place runs before the sandbox
// is stored; the sandbox record then names the node from its first state.
type Placer interface {
	Place(ctx context.Context, sb Sandbox) (node string, err error)
}

// PlacementReleaser is implemented by placers that reserve room: a
// placement whose sandbox is not stored (a store error, or an idempotent
// replay of an earlier create) gives its room back at once.
type PlacementReleaser interface {
	ReleasePlacement(node, id string)
}

// MarkNodeSandboxesLost reports every live sandbox of node lost with reason,
// without asking the (unreachable) node to clean up: it does that itself
// when it comes back. A running or paused sandbox with a checkpoint then
// restarts on another node from it (restartFromCheckpoint); one without
// stays lost. It returns how many it marked.
func (s *Service) MarkNodeSandboxesLost(ctx context.Context, node, reason string) (int, error) {
	n, after := 0, ""
	for {
		page, err := s.store.ListSandboxes(ctx, SandboxFilter{After: after, Limit: 500,
			States: []SandboxState{SandboxCreating, SandboxRunning, SandboxPaused, SandboxDeleting, SandboxRestarting}})
		if err != nil {
			return n, fmt.Errorf("list sandboxes of node %s: %w", node, err)
		}
		for _, sb := range page {
			if sb.Node != node {
				continue
			}
			s.opts.Logf("sandbox %s lost: %s", sb.ID, reason)
			why := reason
			if sb.CheckpointSeconds > 0 && sb.Checkpoint == "" {
				why += " (no checkpoint taken yet)"
			}
			s.setTerminal(ctx, sb.ID, SandboxLost, why)
			n++
			if sb.Checkpoint != "" && sb.State != SandboxCreating && sb.State != SandboxDeleting {
				s.restartFromCheckpoint(ctx, sb, reason)
			}
		}
		if len(page) < 500 {
			return n, nil
		}
		after = page[len(page)-1].ID
	}
}

// FailOrphanOperations fails operations that a lost server replica left
// unfinished, and settles the sandboxes they were changing: a sandbox still
// creating is failed (and stopped on its node, which may have started it).
func (s *Service) FailOrphanOperations(ctx context.Context, ops []Operation, reason string) {
	for _, op := range ops {
		if op.State.Done() {
			continue
		}
		// The sandbox is settled first, so whoever sees the operation
		// failed also sees the sandbox's final state.
		s.settleOrphan(ctx, op, reason)
		s.engine.interrupted(ctx, op, reason)
		op.State = OpFailed
		op.Error = &OpError{Code: "interrupted", Message: reason}
		s.engine.saveCtx(ctx, op)
	}
}

func (s *Service) settleOrphan(ctx context.Context, op Operation, reason string) {
	if op.Kind != "sandbox.create" && op.Kind != "sandbox.fork" && op.Kind != "sandbox.delete" && op.Kind != "sandbox.timeout" && op.Kind != "sandbox.restart" {
		return
	}
	sb, err := s.store.GetSandbox(ctx, "", op.Target)
	if err != nil {
		return
	}
	switch sb.State {
	case SandboxRestarting:
		// The restart may have started the instance on its new node.
		s.setTerminal(ctx, sb.ID, SandboxLost, reason+" (not restarted from checkpoint "+sb.Checkpoint+": the restart was interrupted)")
		if err := s.runtime.StopSandbox(ctx, sb.ID); err != nil {
			s.opts.Logf("sandbox %s: stop after orphaned restart: %v", sb.ID, err)
		}
	case SandboxCreating:
		s.setTerminal(ctx, sb.ID, SandboxFailed, reason)
		if err := s.runtime.StopSandbox(ctx, sb.ID); err != nil {
			s.opts.Logf("sandbox %s: stop after orphaned create: %v", sb.ID, err)
		}
	case SandboxDeleting:
		if err := s.runtime.StopSandbox(ctx, sb.ID); err != nil {
			s.opts.Logf("sandbox %s: stop after orphaned delete: %v", sb.ID, err)
			return
		}
		s.setTerminal(ctx, sb.ID, SandboxDeleted, sb.StateReason)
	}
}
