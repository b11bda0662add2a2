package core

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// SandboxPaused is the state of a sandbox whose processes are all frozen.
// running → paused → running; a paused sandbox can be snapshotted or deleted.
const SandboxPaused SandboxState = "paused"

// SnapshotState is where a snapshot is in its life.
type SnapshotState string

// Snapshot states: creating → ready | failed; ready → retained when its
// owner deletes it while newer snapshots build on it.
const (
	SnapshotCreating SnapshotState = "creating"
	SnapshotReady    SnapshotState = "ready"
	SnapshotFailed   SnapshotState = "failed"
	// SnapshotRetained is a deleted snapshot whose data its children
	// still need: hidden from the API (404, not listed), kept in the
	// store and the chunk store until its last child goes, then deleted.
	SnapshotRetained SnapshotState = "retained"
)

// snapshotStatesShown are the states the API lists when asked for none.
func snapshotStatesShown() []SnapshotState {
	return []SnapshotState{SnapshotCreating, SnapshotReady, SnapshotFailed}
}

// SnapshotStatesKept are the states whose data a collector keeps.
func SnapshotStatesKept() []SnapshotState { return []SnapshotState{SnapshotReady, SnapshotRetained} }

// SnapshotKindFilesystem is the writable layer, not processes or memory. A
// restore or fork starts the sandbox's processes afresh.
const SnapshotKindFilesystem = "filesystem"

// SnapshotKindProcess is the writable layer plus every process with its
// memory (a driver checkpoint, gVisor's): a restore or fork continues them
// where they were. The driver decides at capture time which kind it is.
const SnapshotKindProcess = "process"

// What a restore does with processes, by kind.
const (
	processesNotCaptured = "not captured: a restore or fork starts the sandbox's processes afresh"
	processesCaptured    = "captured: a restore or fork continues every process where it was (same pids, memory and open files; connections to the outside are broken)"
)

// setKind records what a capture's stats say it captured.
func (sn *Snapshot) setKind(stats SnapshotStats) {
	switch {
	case stats.ProcessDriver != "":
		sn.Kind, sn.Processes = SnapshotKindProcess, processesCaptured
	case stats.ProcessNotCaptured != "":
		sn.Processes = "not captured (the driver's checkpoint failed: " + stats.ProcessNotCaptured + "): a restore or fork starts the sandbox's processes afresh"
	}
}

// Snapshot is the persisted record of one snapshot. Its content (a manifest
// of changes since ParentID, and chunks) lives in the node's snapshot store.
type Snapshot struct {
	ID          string         `json:"id"`
	ProjectID   string         `json:"project_id"`
	SandboxID   string         `json:"sandbox_id"`
	Name        string         `json:"name,omitempty"` // a label (E2B's createSnapshot({name}))
	ParentID    string         `json:"parent_id,omitempty"`
	Template    string         `json:"template"`
	TemplateRef string         `json:"template_ref,omitempty"` // see Sandbox.TemplateRef
	State       SnapshotState  `json:"state"`
	StateReason string         `json:"state_reason,omitempty"`
	Kind        string         `json:"kind"`
	Processes   string         `json:"processes"` // what a restore does with processes
	Manifest    string         `json:"manifest,omitempty"`
	Stats       *SnapshotStats `json:"stats,omitempty"`
	// Auto marks a snapshot the server took on its own (a timeout
	// hibernation); it is deleted with its sandbox unless others need it.
	Auto      bool      `json:"auto,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SnapshotStats describe what a capture read and stored.
type SnapshotStats struct {
	Entries       int   `json:"entries"`
	Changed       int   `json:"changed"`
	Removed       int   `json:"removed"`
	Skipped       int   `json:"skipped"`
	LogicalBytes  int64 `json:"logical_bytes"`
	BytesRead     int64 `json:"bytes_read"`
	NewChunks     int   `json:"new_chunks"`
	ChunkBytes    int64 `json:"chunk_bytes"`
	ManifestBytes int64 `json:"manifest_bytes"`
	// BytesStored is what this snapshot added to the store.
	BytesStored int64 `json:"bytes_stored"`
	FrozenMS    int64 `json:"frozen_ms"`
	// A process snapshot's checkpoint (kind "process"): the driver that
	// wrote it, how long it took and the image it stored (files, size,
	// new chunks and their bytes, also counted in BytesStored).
	ProcessDriver     string `json:"process_driver,omitempty"`
	CheckpointMS      int64  `json:"checkpoint_ms,omitempty"`
	ProcessImageFiles int    `json:"process_image_files,omitempty"`
	ProcessImageBytes int64  `json:"process_image_bytes,omitempty"`
	ProcessNewChunks  int    `json:"process_new_chunks,omitempty"`
	ProcessChunkBytes int64  `json:"process_chunk_bytes,omitempty"`
	// ProcessNotCaptured is why a driver that checkpoints processes did
	// not (its checkpoint failed): the snapshot holds the files only.
	ProcessNotCaptured string `json:"process_not_captured,omitempty"`
}

// SnapshotFilter selects snapshots in ListSnapshots.
type SnapshotFilter struct {
	ProjectID string // "" = every project
	SandboxID string
	States    []SnapshotState
	After     string // page cursor: snapshots created after this one
	Limit     int    // 0 = all
}

// PauseRuntime is implemented by runtimes that can freeze sandboxes.
type PauseRuntime interface {
	// PauseSandbox freezes every process of a sandbox; idempotent.
	PauseSandbox(ctx context.Context, id string) error
	// ResumeSandbox continues them; idempotent.
	ResumeSandbox(ctx context.Context, id string) error
}

// SnapshotRuntime is implemented by runtimes that can capture and restore
// sandboxes' writable layers.
type SnapshotRuntime interface {
	// CaptureSnapshot records sandbox id's writable layer as its changes
	// since the state of chain (manifest digests, oldest first; empty: since
	// the template), with the sandbox frozen meanwhile. It returns the new
	// manifest's digest; the data is durable when it returns.
	CaptureSnapshot(ctx context.Context, id string, chain []string) (string, SnapshotStats, error)
	// StartSandboxFromSnapshot is StartSandbox with the writable layer
	// restored from chain.
	StartSandboxFromSnapshot(ctx context.Context, sb Sandbox, chain []string, progress Progress) (Placement, error)
	// CollectSnapshots removes stored data that no manifest in keep needs.
	CollectSnapshots(ctx context.Context, keep []string) (any, error)
}

// MaxFork bounds the sandboxes one fork request makes.
const MaxFork = 20

// maxChain bounds snapshot chains (and the walk up a chain).
const maxChain = 1000

var snapshotIDRE = regexp.MustCompile(`^snap-[0-9a-f]{16}$`)

// ValidSnapshotID reports whether id has the shape of a snapshot id.
func ValidSnapshotID(id string) bool { return snapshotIDRE.MatchString(id) }

// ForkRequest asks for count new sandboxes from one snapshot. Env and
// limits default to those of the snapshot's sandbox.
//
// Every field the request leaves unset takes the snapshot's source
// sandbox's value (limits field by field); what the request sets wins.
// Env is merged: the request's variables go on top of the source's, as
// E2B documents for a create from a snapshot.
// docs/security.md ("Security attributes by creation path") is the table.
type ForkRequest struct {
	Count          int               `json:"count"`
	Env            map[string]string `json:"env,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	Limits         Limits            `json:"limits,omitempty"`
	TimeoutSeconds *int64            `json:"timeout_seconds,omitempty"`
	Network        *NetworkPolicy    `json:"network,omitempty"`
	// PublicPorts, AutoPauseSeconds, OnTimeout and AutoResume as in
	// CreateRequest; nil ("" for OnTimeout) = the source's.
	PublicPorts      *bool  `json:"public_ports,omitempty"`
	AutoPauseSeconds *int64 `json:"auto_pause_seconds,omitempty"`
	OnTimeout        string `json:"on_timeout,omitempty"`
	AutoResume       *bool  `json:"auto_resume,omitempty"`
}

// forkCreate is the create request of one sandbox of a fork: req where it
// says something, else src's (nil src: a source that is gone, so the
// server's defaults).
func forkCreate(snap Snapshot, req ForkRequest, src *Sandbox) CreateRequest {
	creq := CreateRequest{Template: snap.Template, TemplateRef: snap.TemplateKey(), Env: req.Env, Metadata: req.Metadata,
		Limits: req.Limits, TimeoutSeconds: req.TimeoutSeconds, Network: req.Network, AutoPauseSeconds: req.AutoPauseSeconds,
		OnTimeout: req.OnTimeout}
	if req.PublicPorts != nil {
		creq.PublicPorts = *req.PublicPorts
	}
	if req.AutoResume != nil {
		creq.AutoResume = *req.AutoResume
	}
	if src == nil {
		return creq
	}
	if len(src.Env) > 0 {
		creq.Env = maps.Clone(src.Env)
		maps.Copy(creq.Env, req.Env)
	}
	for _, f := range []struct{ dst, src *int64 }{
		{&creq.Limits.MemoryBytes, &src.Limits.MemoryBytes}, {&creq.Limits.CPUMillis, &src.Limits.CPUMillis},
		{&creq.Limits.Pids, &src.Limits.Pids}, {&creq.Limits.DiskBytes, &src.Limits.DiskBytes},
	} {
		if *f.dst == 0 {
			*f.dst = *f.src
		}
	}
	if creq.TimeoutSeconds == nil {
		t := src.TimeoutSeconds
		creq.TimeoutSeconds = &t
	}
	if creq.Network == nil && src.Network != nil {
		n := *src.Network
		creq.Network = &n
	}
	if creq.AutoPauseSeconds == nil && src.AutoPauseSeconds > 0 {
		a := src.AutoPauseSeconds
		creq.AutoPauseSeconds = &a
	}
	if creq.OnTimeout == "" {
		creq.OnTimeout = src.OnTimeout
	}
	if req.PublicPorts == nil {
		creq.PublicPorts = src.PublicPorts
	}
	if req.AutoResume == nil {
		creq.AutoResume = src.AutoResume
	}
	return creq
}

// sandboxLock serialises lifecycle operations on one sandbox in this
// process (pause, resume, snapshot); the store's state checks guard the rest.
func (s *Service) sandboxLock(id string) func() {
	v, _ := s.sbLocks.LoadOrStore(id, &sync.Mutex{})
	mu := v.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

func (s *Service) pauseRuntime() (PauseRuntime, error) {
	pr, ok := s.runtime.(PauseRuntime)
	if !ok {
		return nil, fmt.Errorf("this server's driver cannot pause sandboxes: %w", ErrUnavailable)
	}
	return pr, nil
}

func (s *Service) snapshotRuntime() (SnapshotRuntime, error) {
	sr, ok := s.runtime.(SnapshotRuntime)
	if !ok {
		return nil, fmt.Errorf("this server's driver cannot snapshot sandboxes: %w", ErrUnavailable)
	}
	return sr, nil
}

// Pause starts the operation that freezes a running sandbox. Its timeout
// clock stops until Resume.
func (s *Service) Pause(ctx context.Context, projectID, id, idemKey string) (Operation, error) {
	pr, err := s.pauseRuntime()
	if err != nil {
		return Operation{}, err
	}
	sb, err := s.getLocal(ctx, projectID, id)
	if err != nil {
		return Operation{}, err
	}
	if sb.State != SandboxRunning && sb.State != SandboxPaused {
		return Operation{}, fmt.Errorf("sandbox is %s: %w", sb.State, ErrConflict)
	}
	op := s.engine.NewOperation(projectID, "sandbox.pause", id)
	return s.engine.Submit(ctx, op, idemKey, func(ctx context.Context, progress Progress) (any, error) {
		defer s.sandboxLock(id)()
		cur, err := s.store.GetSandbox(ctx, projectID, id)
		if err != nil {
			return nil, err
		}
		if cur.State == SandboxPaused {
			return cur, nil
		}
		if cur.State != SandboxRunning {
			return nil, fmt.Errorf("sandbox is %s: %w", cur.State, ErrConflict)
		}
		progress(20, "freezing")
		if err := pr.PauseSandbox(ctx, id); err != nil {
			return nil, err
		}
		updated, err := s.store.UpdateSandbox(ctx, id, func(cur *Sandbox) error {
			if cur.State != SandboxRunning {
				return fmt.Errorf("sandbox became %s while pausing: %w", cur.State, ErrConflict)
			}
			now := s.opts.Now().UTC()
			cur.State, cur.UpdatedAt, cur.PausedRemainingMS = SandboxPaused, now, nil
			if cur.ExpiresAt != nil {
				rem := max(cur.ExpiresAt.Sub(now).Milliseconds(), 0)
				cur.PausedRemainingMS, cur.ExpiresAt = &rem, nil
			}
			return nil
		})
		if err != nil {
			if rerr := pr.ResumeSandbox(context.WithoutCancel(ctx), id); rerr != nil {
				s.opts.Logf("sandbox %s: resume after failed pause: %v", id, rerr)
			}
			return nil, err
		}
		s.publishState(ctx, updated)
		return updated, nil
	})
}

// Resume starts the operation that continues a paused sandbox; its timeout
// restarts with the time that was left.
func (s *Service) Resume(ctx context.Context, projectID, id, idemKey string) (Operation, error) {
	pr, err := s.pauseRuntime()
	if err != nil {
		return Operation{}, err
	}
	sb, err := s.getLocal(ctx, projectID, id)
	if err != nil {
		return Operation{}, err
	}
	if sb.State == SandboxHibernated {
		return s.wake(ctx, projectID, id, idemKey)
	}
	if sb.State != SandboxRunning && sb.State != SandboxPaused {
		return Operation{}, fmt.Errorf("sandbox is %s: %w", sb.State, ErrConflict)
	}
	op := s.engine.NewOperation(projectID, "sandbox.resume", id)
	return s.engine.Submit(ctx, op, idemKey, func(ctx context.Context, progress Progress) (any, error) {
		defer s.sandboxLock(id)()
		cur, err := s.store.GetSandbox(ctx, projectID, id)
		if err != nil {
			return nil, err
		}
		if cur.State == SandboxRunning {
			return cur, nil
		}
		if cur.State != SandboxPaused {
			return nil, fmt.Errorf("sandbox is %s: %w", cur.State, ErrConflict)
		}
		progress(20, "thawing")
		if err := pr.ResumeSandbox(ctx, id); err != nil {
			return nil, err
		}
		updated, err := s.store.UpdateSandbox(ctx, id, func(cur *Sandbox) error {
			if cur.State != SandboxPaused {
				return fmt.Errorf("sandbox became %s while resuming: %w", cur.State, ErrConflict)
			}
			now := s.opts.Now().UTC()
			cur.State, cur.UpdatedAt = SandboxRunning, now
			if cur.PausedRemainingMS != nil {
				exp := now.Add(time.Duration(*cur.PausedRemainingMS) * time.Millisecond)
				cur.ExpiresAt, cur.PausedRemainingMS = &exp, nil
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		s.publishState(ctx, updated)
		return updated, nil
	})
}

// CreateSnapshot starts the operation that captures a running or paused
// sandbox's writable layer. A running sandbox is frozen during the capture.
func (s *Service) CreateSnapshot(ctx context.Context, projectID, sandboxID, idemKey string) (Snapshot, Operation, error) {
	return s.CreateNamedSnapshot(ctx, projectID, sandboxID, "", idemKey)
}

// MaxSnapshotName bounds a snapshot's name.
const MaxSnapshotName = 128

// printable reports whether s is valid UTF-8 without control characters.
func printable(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// CreateNamedSnapshot is CreateSnapshot with a name stored on the snapshot.
func (s *Service) CreateNamedSnapshot(ctx context.Context, projectID, sandboxID, name, idemKey string) (Snapshot, Operation, error) {
	if len(name) > MaxSnapshotName || !printable(name) {
		return Snapshot{}, Operation{}, invalid("snapshot name must be at most %d printable characters", MaxSnapshotName)
	}
	sr, err := s.snapshotRuntime()
	if err != nil {
		return Snapshot{}, Operation{}, err
	}
	if len(idemKey) > 128 {
		return Snapshot{}, Operation{}, invalid("Idempotency-Key longer than 128 bytes")
	}
	sb, err := s.getLocal(ctx, projectID, sandboxID)
	if err != nil {
		return Snapshot{}, Operation{}, err
	}
	if sb.State != SandboxRunning && sb.State != SandboxPaused {
		return Snapshot{}, Operation{}, fmt.Errorf("sandbox is %s: %w", sb.State, ErrConflict)
	}
	now := s.opts.Now().UTC()
	snap := Snapshot{ID: NewID("snap-"), ProjectID: projectID, SandboxID: sandboxID, Name: name, Template: sb.Template, TemplateRef: sb.TemplateRef,
		State: SnapshotCreating, Kind: SnapshotKindFilesystem, Processes: processesNotCaptured,
		CreatedAt: now, UpdatedAt: now}
	op := s.engine.NewOperation(projectID, "snapshot.create", snap.ID)
	op.Fingerprint = Fingerprint("snapshot.create", sandboxID) // snap.ID is new each time
	if name != "" {
		op.Fingerprint = Fingerprint("snapshot.create", sandboxID, name)
	}
	stored, created, err := s.store.CreateSnapshotOp(ctx, snap, op, idemKey)
	if err != nil {
		return Snapshot{}, Operation{}, err
	}
	if !created {
		if err := CheckReplay(stored, op); err != nil {
			return Snapshot{}, Operation{}, err
		}
		existing, err := s.store.GetSnapshot(ctx, projectID, stored.Target)
		return existing, stored, err
	}
	s.engine.Start(ctx, stored, func(ctx context.Context, progress Progress) (any, error) {
		out, err := s.runSnapshot(ctx, sr, snap, progress)
		if err != nil {
			s.snapshotFailed(ctx, snap.ID, err)
			return nil, err
		}
		return out, nil
	})
	return snap, stored, nil
}

// snapshotFailed records why a capture failed on its snapshot.
func (s *Service) snapshotFailed(ctx context.Context, id string, err error) {
	if _, uerr := s.store.UpdateSnapshot(context.WithoutCancel(ctx), id, func(cur *Snapshot) error {
		cur.State, cur.StateReason, cur.UpdatedAt = SnapshotFailed, err.Error(), s.opts.Now().UTC()
		return nil
	}); uerr != nil {
		s.opts.Logf("snapshot %s: mark failed: %v", id, uerr)
	}
}

func (s *Service) runSnapshot(ctx context.Context, sr SnapshotRuntime, snap Snapshot, progress Progress) (Snapshot, error) {
	return s.runCapture(ctx, sr, snap, false, progress)
}

// runCapture is runSnapshot; full captures the whole layer (no parent),
// starting a new chain.
func (s *Service) runCapture(ctx context.Context, sr SnapshotRuntime, snap Snapshot, full bool, progress Progress) (Snapshot, error) {
	// Captures share the store; garbage collection waits for them all.
	s.snapMu.RLock()
	defer s.snapMu.RUnlock()
	defer s.sandboxLock(snap.SandboxID)()
	sb, err := s.store.GetSandbox(ctx, snap.ProjectID, snap.SandboxID)
	if err != nil {
		return snap, err
	}
	if sb.State != SandboxRunning && sb.State != SandboxPaused {
		return snap, fmt.Errorf("sandbox is %s: %w", sb.State, ErrConflict)
	}
	var chain []string
	if !full {
		parent, err := s.snapshotParent(ctx, sb, snap.ID)
		if err != nil {
			return snap, err
		}
		if parent != "" {
			if chain, err = s.chain(ctx, parent); err != nil {
				return snap, err
			}
		}
	}
	progress(10, "capturing the writable layer (and processes where the driver can)")
	digest, stats, err := sr.CaptureSnapshot(ctx, sb.ID, chain)
	if err != nil {
		return snap, err
	}
	// The manifest is durable; committing its digest makes the snapshot.
	return s.store.UpdateSnapshot(ctx, snap.ID, func(cur *Snapshot) error {
		if cur.State != SnapshotCreating {
			return fmt.Errorf("snapshot became %s: %w", cur.State, ErrConflict)
		}
		cur.State, cur.Manifest, cur.Stats, cur.UpdatedAt = SnapshotReady, digest, &stats, s.opts.Now().UTC()
		cur.setKind(stats)
		return nil
	})
}

// snapshotParent picks the parent of a new snapshot of sb (its newest ready
// snapshot, else the one it was forked from) and records the link before
// the capture, so the parent cannot be deleted under it.
func (s *Service) snapshotParent(ctx context.Context, sb Sandbox, snapID string) (string, error) {
	parent := sb.Snapshot
	own, err := s.store.ListSnapshots(ctx, SnapshotFilter{ProjectID: sb.ProjectID, SandboxID: sb.ID, States: []SnapshotState{SnapshotReady}})
	if err != nil {
		return "", err
	}
	if len(own) > 0 {
		parent = own[len(own)-1].ID
	}
	if parent == "" {
		return "", nil
	}
	if _, err := s.store.UpdateSnapshot(ctx, snapID, func(cur *Snapshot) error {
		cur.ParentID = parent
		return nil
	}); err != nil {
		return "", err
	}
	// A delete that ran before the link was stored is seen here; one after
	// it is refused (the parent has a child).
	if p, err := s.store.GetSnapshot(ctx, sb.ProjectID, parent); err == nil && p.State == SnapshotReady {
		return parent, nil
	}
	_, err = s.store.UpdateSnapshot(ctx, snapID, func(cur *Snapshot) error {
		cur.ParentID = ""
		return nil
	})
	return "", err
}

// chain returns the manifests from the root of id's chain to id.
func (s *Service) chain(ctx context.Context, id string) ([]string, error) {
	var rev []string
	for cur := id; cur != ""; {
		if len(rev) >= maxChain {
			return nil, fmt.Errorf("snapshot chain longer than %d: %w", maxChain, ErrExhausted)
		}
		snap, err := s.store.GetSnapshot(ctx, "", cur)
		if err != nil {
			return nil, fmt.Errorf("snapshot chain: %w", err)
		}
		if (snap.State != SnapshotReady && snap.State != SnapshotRetained) || snap.Manifest == "" {
			return nil, fmt.Errorf("snapshot %s is %s: %w", cur, snap.State, ErrConflict)
		}
		rev = append(rev, snap.Manifest)
		cur = snap.ParentID
	}
	out := make([]string, len(rev))
	for i, m := range rev {
		out[len(rev)-1-i] = m
	}
	return out, nil
}

// GetSnapshot returns a project's snapshot.
func (s *Service) GetSnapshot(ctx context.Context, projectID, id string) (Snapshot, error) {
	if !ValidSnapshotID(id) {
		return Snapshot{}, fmt.Errorf("snapshot %.80q: %w", id, ErrNotFound)
	}
	snap, err := s.store.GetSnapshot(ctx, projectID, id)
	if err == nil && snap.State == SnapshotRetained {
		return Snapshot{}, fmt.Errorf("snapshot %s was deleted: %w", id, ErrNotFound)
	}
	return snap, err
}

// ListSnapshots returns a page of a project's snapshots, oldest first.
func (s *Service) ListSnapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 100
	}
	if len(f.States) == 0 {
		f.States = snapshotStatesShown()
	}
	return s.store.ListSnapshots(ctx, f)
}

// DeleteSnapshot deletes a snapshot and starts the operation that reclaims
// its data. Snapshots of one sandbox may go in any order: one that newer
// snapshots build on is retained (hidden, its data kept) until the last of
// them goes, and then deleted with it. A snapshot that holds a hibernated
// sandbox is 409.
func (s *Service) DeleteSnapshot(ctx context.Context, projectID, id string) (Operation, error) {
	snap, err := s.GetSnapshot(ctx, projectID, id)
	if err != nil {
		return Operation{}, err
	}
	if err := s.snapshotHibernates(ctx, projectID, id); err != nil {
		return Operation{}, err
	}
	err = s.store.DeleteSnapshot(ctx, projectID, id)
	if errors.Is(err, ErrConflict) {
		// Children need its data: the store said so within its
		// transaction, and a child made after it keeps it retained too.
		_, err = s.store.UpdateSnapshot(ctx, id, func(cur *Snapshot) error {
			if cur.State != SnapshotReady {
				return fmt.Errorf("snapshot is %s: %w", cur.State, ErrConflict)
			}
			cur.State, cur.UpdatedAt = SnapshotRetained, s.opts.Now().UTC()
			return nil
		})
		if err != nil {
			return Operation{}, err
		}
	} else if err != nil {
		return Operation{}, err
	} else {
		s.dropRetained(ctx, snap.ParentID)
	}
	op := s.engine.NewOperation(projectID, "snapshot.delete", id)
	return s.engine.Submit(ctx, op, "", func(ctx context.Context, progress Progress) (any, error) {
		progress(10, "collecting unreferenced chunks")
		return s.CollectSnapshots(ctx)
	})
}

// dropRetained deletes the retained snapshots up the chain from id that no
// snapshot needs any more (the store refuses one that still has children).
func (s *Service) dropRetained(ctx context.Context, id string) {
	for n := 0; id != "" && n < maxChain; n++ {
		p, err := s.store.GetSnapshot(ctx, "", id)
		if err != nil || p.State != SnapshotRetained {
			return
		}
		if err := s.store.DeleteSnapshot(ctx, "", id); err != nil {
			if !errors.Is(err, ErrConflict) && !errors.Is(err, ErrNotFound) {
				s.opts.Logf("snapshot %s: delete once its children are gone: %v", id, err)
			}
			return
		}
		id = p.ParentID
	}
}

// CollectSnapshots removes stored snapshot data no ready snapshot needs. It
// waits for captures and restores in flight (they hold data not yet
// referenced by a committed manifest).
func (s *Service) CollectSnapshots(ctx context.Context) (any, error) {
	sr, ok := s.runtime.(SnapshotRuntime)
	if !ok {
		return nil, nil
	}
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	ready, err := s.store.ListSnapshots(ctx, SnapshotFilter{States: SnapshotStatesKept()})
	if err != nil {
		return nil, err
	}
	keep := make([]string, 0, len(ready))
	for _, sn := range ready {
		keep = append(keep, sn.Manifest)
	}
	return sr.CollectSnapshots(ctx, keep)
}

// Fork starts count new sandboxes from a ready snapshot, each with its own
// id, writable layer, session and create operation. The source keeps
// running. Processes come back only from a process snapshot (each fork
// gets its own copy of them); otherwise each fork starts afresh.
func (s *Service) Fork(ctx context.Context, projectID, snapID string, req ForkRequest, idemKey string) ([]Sandbox, []Operation, error) {
	if _, err := s.snapshotRuntime(); err != nil {
		return nil, nil, err
	}
	if req.Count == 0 {
		req.Count = 1
	}
	if req.Count < 1 || req.Count > MaxFork {
		return nil, nil, invalid("count must be between 1 and %d", MaxFork)
	}
	if len(idemKey) > 120 {
		return nil, nil, invalid("Idempotency-Key longer than 120 bytes")
	}
	snap, err := s.GetSnapshot(ctx, projectID, snapID)
	if err != nil {
		return nil, nil, err
	}
	if snap.State != SnapshotReady {
		return nil, nil, fmt.Errorf("snapshot is %s: %w", snap.State, ErrConflict)
	}
	var src *Sandbox
	if sb, err := s.store.GetSandbox(ctx, projectID, snap.SandboxID); err == nil {
		src = &sb
	} else if !errors.Is(err, ErrNotFound) {
		return nil, nil, err
	}
	creq := forkCreate(snap, req, src)
	var sbs []Sandbox
	var ops []Operation
	// Every sandbox of the fork carries the fork request's fingerprint: a
	// retry with the key replays only the same request (count included).
	fp := Fingerprint("snapshot.fork", snap.ID, req)
	for i := 0; i < req.Count; i++ {
		key := ""
		if idemKey != "" {
			key = fmt.Sprintf("%s/%d", idemKey, i)
		}
		sb, op, err := s.create(ctx, projectID, creq, key, snap.ID, fp)
		if err != nil {
			return sbs, ops, err
		}
		sbs, ops = append(sbs, sb), append(ops, op)
	}
	return sbs, ops, nil
}

// startFromSnapshot is runCreate's start for a restored or forked sandbox.
func (s *Service) startFromSnapshot(ctx context.Context, sb Sandbox, progress Progress) (Placement, error) {
	sr, err := s.snapshotRuntime()
	if err != nil {
		return Placement{}, err
	}
	// Chunks read by the restore must outlive it: GC waits.
	s.snapMu.RLock()
	defer s.snapMu.RUnlock()
	chain, err := s.chain(ctx, sb.Snapshot)
	if err != nil {
		return Placement{}, err
	}
	progress(10, "restoring the writable layer")
	return sr.StartSandboxFromSnapshot(ctx, sb, chain, progress)
}

// reconcileSnapshots runs at start, after operations were recovered: a
// snapshot a crash interrupted is failed, and data no ready snapshot
// references (its chunks, a manifest written but never committed, temp
// files) is removed.
func (s *Service) reconcileSnapshots(ctx context.Context) error {
	if _, ok := s.runtime.(SnapshotRuntime); !ok {
		return nil
	}
	creating, err := s.store.ListSnapshots(ctx, SnapshotFilter{States: []SnapshotState{SnapshotCreating}})
	if err != nil {
		return err
	}
	for _, sn := range creating {
		if _, err := s.store.UpdateSnapshot(ctx, sn.ID, func(cur *Snapshot) error {
			cur.State, cur.StateReason, cur.UpdatedAt = SnapshotFailed, "the server stopped while this snapshot was taken", s.opts.Now().UTC()
			return nil
		}); err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	res, err := s.CollectSnapshots(ctx)
	if err != nil {
		return fmt.Errorf("snapshot gc: %w", err)
	}
	if res != nil {
		s.opts.Logf("snapshot gc at start: %+v", res)
	}
	return nil
}
