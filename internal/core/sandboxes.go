package core

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/egress/policy"
)

// Runtime is the node side of the lifecycle: it makes and removes the real
// sandboxes. In a single-node server it is the in-process node.
type Runtime interface {
	// StartSandbox creates the isolated instance for sb. On error nothing
	// is left behind.
	StartSandbox(ctx context.Context, sb Sandbox, progress Progress) (Placement, error)
	// StopSandbox destroys the instance; a sandbox it does not know is not an error.
	StopSandbox(ctx context.Context, id string) error
	// AdoptSandbox re-attaches a sandbox that survived a server restart. An
	// error means the sandbox is lost; its message is the reason.
	AdoptSandbox(ctx context.Context, sb Sandbox) error
	// Sweep removes host leftovers of every instance not in keep.
	Sweep(ctx context.Context, keep map[string]bool) error
	// HasTemplate reports whether a template can be used (ErrNotFound if not).
	HasTemplate(ctx context.Context, name string) error
}

// WarmTemplates is implemented by runtimes whose templates may carry a
// pre-warmed snapshot (a build file's START/READY): a create from such a
// template restores that snapshot, as a fork does ("" = start cold).
type WarmTemplates interface {
	WarmSnapshot(ctx context.Context, template string) string
}

// Placement says where a sandbox runs.
type Placement struct {
	Driver   string
	Instance string
}

// CreateRequest asks for a new sandbox.
type CreateRequest struct {
	Template string `json:"template"`
	// TemplateRef, set only by the server itself (forks, pre-warms), is
	// the already-resolved template; clients name templates by Template.
	TemplateRef string            `json:"-"`
	Env         map[string]string `json:"env,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	Limits      Limits            `json:"limits,omitempty"`
	// TimeoutSeconds: nil = the server default; 0 = no timeout.
	TimeoutSeconds *int64 `json:"timeout_seconds,omitempty"`
	// Network is the egress policy; nil = blocked.
	Network *NetworkPolicy `json:"network,omitempty"`
	// AutoPauseSeconds: pause (not delete) the sandbox after this long
	// without data-plane activity; nil or 0 = never.
	AutoPauseSeconds *int64 `json:"auto_pause_seconds,omitempty"`
	// OnTimeout: "delete" (default) or "hibernate" (keep the sandbox as a
	// snapshot that resume brings back).
	OnTimeout string `json:"on_timeout,omitempty"`
	// AutoResume: data-plane calls resume a paused or hibernated sandbox.
	AutoResume bool `json:"auto_resume,omitempty"`
	// PublicPorts: forwarded ports need no token (see Sandbox.PublicPorts).
	PublicPorts bool `json:"public_ports,omitempty"`
	// CheckpointSeconds: checkpoint the running sandbox this often, so it
	// restarts elsewhere when its node is lost; nil = the project's
	// default, 0 = never.
	CheckpointSeconds *int64 `json:"checkpoint_seconds,omitempty"`

	// emptyTemplate: the client sent "template": "" (refused), which
	// decoding cannot tell from leaving it out (the default).
	emptyTemplate bool
}

// UnmarshalJSON decodes a create request and notes an empty template name.
func (r *CreateRequest) UnmarshalJSON(b []byte) error {
	type plain CreateRequest
	var probe struct {
		Template *string `json:"template"`
	}
	// Strict, as the API's decoder is: an unknown field is an error.
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode((*plain)(r)); err != nil {
		return err
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return err
	}
	r.emptyTemplate = probe.Template != nil && *probe.Template == ""
	return nil
}

// NetworkRuntime is implemented by runtimes with an egress gateway.
type NetworkRuntime interface {
	// NetworkEnabled reports whether sandboxes get a network at all;
	// without one, only the blocked policy can be honoured.
	NetworkEnabled() bool
	// SetNetworkPolicy applies a (validated) policy to a running sandbox.
	SetNetworkPolicy(ctx context.Context, sb Sandbox, p NetworkPolicy) error
	// NetworkLog returns decisions after a position, and counters.
	NetworkLog(ctx context.Context, sb Sandbox, after uint64, limit int) (NetworkLog, error)
}

// NetworkAdmitter is implemented by network runtimes whose sandboxes do
// not all have a network (remote nodes with and without egress):
// AdmitNetwork refuses a policy the sandbox's node cannot honour before
// SetNetwork stores it.
type NetworkAdmitter interface {
	AdmitNetwork(ctx context.Context, sb Sandbox, p NetworkPolicy) error
}

// Validation bounds for client input.
const (
	MaxEnvVars       = 256
	MaxEnvBytes      = 64 << 10
	MaxMetadata      = 64
	MaxMetaKeyLen    = 64
	MaxMetaValLen    = 512
	MaxTimeoutSecond = 7 * 24 * 3600
	MinDiskBytes     = 16 << 20
)

var (
	templateNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}(:[a-z0-9][a-z0-9._-]{0,63})?$`)
	envKeyRE       = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)
	metaKeyRE      = regexp.MustCompile(`^[A-Za-z0-9._/-]{1,64}$`)
	sandboxIDRE    = regexp.MustCompile(`^sbx-[0-9a-f]{16}$`)
	credentialIDRE = regexp.MustCompile(`^cred-[0-9a-f]{16}$`)
)

// ValidSandboxID reports whether id has the shape of a sandbox id.
func ValidSandboxID(id string) bool { return sandboxIDRE.MatchString(id) }

// ServiceOptions configure the sandbox service.
type ServiceOptions struct {
	DefaultTimeout time.Duration // applied when a create request names none
	MaxLimits      Limits        // upper bounds; zero = unbounded
	DefaultLimits  Limits
	NodeName       string
	Logf           func(string, ...any)
	Now            func() time.Time
	// AnyNode: the runtime reaches every node (remote nodes), so this
	// server may act on sandboxes of any node, not only NodeName's.
	AnyNode bool
	// CheckpointDefaults: project → checkpoint interval in seconds for
	// creates that name none ("*": every other project).
	CheckpointDefaults map[string]int64
}

// Service is the sandbox lifecycle: it validates requests, records state and
// drives the runtime through operations.
type Service struct {
	store   Store
	engine  *Engine
	broker  *Broker
	runtime Runtime
	opts    ServiceOptions

	snapMu   sync.RWMutex // captures and restores (R) vs snapshot GC (W)
	sbLocks  sync.Map     // sandbox id → *sync.Mutex (pause, resume, snapshot)
	ckptBusy sync.Map     // sandbox id → true while this process checkpoints it
	ckptMu   sync.Mutex
	ckptNode map[string]int // node → automatic checkpoints this process runs on it
}

// NewService wires a service.
func NewService(store Store, engine *Engine, broker *Broker, runtime Runtime, opts ServiceOptions) *Service {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	return &Service{store: store, engine: engine, broker: broker, runtime: runtime, opts: opts}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrInvalid)
}

// bytesRange words a byte limit's bounds in one unit, MiB, with the
// maximum's exact byte count: "must be between 16 MiB and 8192 MiB
// (8589934592 bytes)", or "must be at least 16 MiB" without a maximum.
func bytesRange(lo, hi int64) string {
	if hi <= 0 {
		return fmt.Sprintf("must be at least %d MiB (%d bytes)", lo>>20, lo)
	}
	return fmt.Sprintf("must be between %d MiB and %d MiB (%d to %d bytes)", lo>>20, hi>>20, lo, hi)
}

func (s *Service) validate(req *CreateRequest) error {
	if req.emptyTemplate {
		return invalid(`template must not be empty (leave it out for the default, "base")`)
	}
	if req.Template == "" {
		req.Template = "base"
	}
	if !templateNameRE.MatchString(req.Template) {
		return invalid("template must match %s", templateNameRE)
	}
	if len(req.Env) > MaxEnvVars {
		return invalid("at most %d env vars", MaxEnvVars)
	}
	total := 0
	for k, v := range req.Env {
		if !envKeyRE.MatchString(k) {
			return invalid("env name %.64q is not a valid variable name", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return invalid("env %s contains a NUL byte", k)
		}
		total += len(k) + len(v)
	}
	if total > MaxEnvBytes {
		return invalid("env larger than %d bytes", MaxEnvBytes)
	}
	if len(req.Metadata) > MaxMetadata {
		return invalid("at most %d metadata entries", MaxMetadata)
	}
	for k, v := range req.Metadata {
		if !metaKeyRE.MatchString(k) {
			return invalid("metadata key %.64q must match %s", k, metaKeyRE)
		}
		if len(v) > MaxMetaValLen {
			return invalid("metadata value for %s longer than %d bytes", k, MaxMetaValLen)
		}
	}
	l, mx, def := &req.Limits, s.opts.MaxLimits, s.opts.DefaultLimits
	if l.MemoryBytes == 0 {
		l.MemoryBytes = def.MemoryBytes
	}
	if l.CPUMillis == 0 {
		l.CPUMillis = def.CPUMillis
	}
	if l.Pids == 0 {
		l.Pids = def.Pids
	}
	if l.DiskBytes == 0 {
		// No default but a maximum: the maximum, so no sandbox goes
		// without a bound the operator asked for.
		l.DiskBytes = cmp.Or(def.DiskBytes, mx.DiskBytes)
	}
	if l.MemoryBytes < 0 || l.MemoryBytes != 0 && l.MemoryBytes < 16<<20 || mx.MemoryBytes > 0 && l.MemoryBytes > mx.MemoryBytes {
		return invalid("memory_bytes %d: %s", l.MemoryBytes, bytesRange(16<<20, mx.MemoryBytes))
	}
	if l.CPUMillis < 0 || l.CPUMillis != 0 && l.CPUMillis < 10 || mx.CPUMillis > 0 && l.CPUMillis > mx.CPUMillis {
		return invalid("cpu_millis must be between 10 and %d", mx.CPUMillis)
	}
	if l.Pids < 0 || l.Pids != 0 && l.Pids < 8 || mx.Pids > 0 && l.Pids > mx.Pids {
		return invalid("pids must be between 8 and %d", mx.Pids)
	}
	if l.DiskBytes > 0 && def.DiskBytes == 0 && mx.DiskBytes == 0 {
		return invalid("disk_bytes: this server does not limit disks (its operator turns that on with --default-disk-bytes or --max-disk-bytes)")
	}
	if l.DiskBytes%(1<<20) != 0 {
		return invalid("disk_bytes must be a whole number of MiB (a multiple of 1048576); %d is not", l.DiskBytes)
	}
	if l.DiskBytes < 0 || l.DiskBytes != 0 && l.DiskBytes < MinDiskBytes || mx.DiskBytes > 0 && l.DiskBytes > mx.DiskBytes {
		return invalid("disk_bytes %d: %s", l.DiskBytes, bytesRange(MinDiskBytes, mx.DiskBytes))
	}
	if req.TimeoutSeconds != nil && (*req.TimeoutSeconds < 0 || *req.TimeoutSeconds > MaxTimeoutSecond) {
		return invalid("timeout_seconds must be between 0 and %d", MaxTimeoutSecond)
	}
	if req.AutoPauseSeconds != nil && (*req.AutoPauseSeconds < 0 || *req.AutoPauseSeconds > MaxTimeoutSecond) {
		return invalid("auto_pause_seconds must be between 0 and %d", MaxTimeoutSecond)
	}
	switch req.OnTimeout {
	case "", OnTimeoutDelete:
	case OnTimeoutHibernate:
		if _, err := s.snapshotRuntime(); err != nil {
			return invalid("on_timeout %q: this server cannot hibernate sandboxes", req.OnTimeout)
		}
	default:
		return invalid("on_timeout must be %q or %q", OnTimeoutDelete, OnTimeoutHibernate)
	}
	if err := s.validateCheckpoint(req); err != nil {
		return err
	}
	if req.Network != nil {
		p, err := s.validateNetwork(*req.Network)
		if err != nil {
			return err
		}
		req.Network = &p
	}
	return nil
}

// validateNetwork parses a policy with the gateway's own parser and
// returns it in canonical form.
func (s *Service) validateNetwork(p NetworkPolicy) (NetworkPolicy, error) {
	allow := p.Allow
	if len(p.Presets) > 0 {
		pre, err := policy.ExpandPresets(p.Presets)
		if err != nil {
			return NetworkPolicy{}, fmt.Errorf("network: %w", invalid("%v", err))
		}
		allow = append(pre, p.Allow...)
	}
	parsed, err := policy.Parse(p.Mode, allow)
	if err != nil {
		return NetworkPolicy{}, fmt.Errorf("network: %w", invalid("%v", err))
	}
	out := NetworkPolicy{Mode: string(parsed.Mode)}
	if len(parsed.Rules) > 0 {
		out.Allow = parsed.Strings()
	}
	if parsed, err = parsed.WithPassthrough(p.Passthrough); err != nil {
		return NetworkPolicy{}, fmt.Errorf("network: %w", invalid("%v", err))
	}
	if len(parsed.Passthrough) > 0 {
		out.Passthrough = parsed.PassthroughStrings()
	}
	if len(p.Credentials) > 32 {
		return NetworkPolicy{}, invalid("network: at most 32 credentials")
	}
	for i, id := range p.Credentials {
		if !credentialIDRE.MatchString(id) || slices.Contains(p.Credentials[:i], id) {
			return NetworkPolicy{}, invalid("network: bad or repeated credential id %.40q", id)
		}
	}
	out.Credentials = p.Credentials
	if out.Mode != string(policy.Blocked) {
		nr, ok := s.runtime.(NetworkRuntime)
		if !ok || !nr.NetworkEnabled() {
			return NetworkPolicy{}, fmt.Errorf("network mode %s needs the egress gateway, and this server runs without it (start it with space server --egress): %w", out.Mode, ErrEgressDisabled)
		}
	}
	return out, nil
}

// resolveTemplate finds the template a project means by name: its own
// first, else the public one.
func (s *Service) resolveTemplate(ctx context.Context, projectID, name string) (string, error) {
	own := TemplateRef(projectID, name)
	err := s.runtime.HasTemplate(ctx, own)
	if err == nil || !errors.Is(err, ErrNotFound) {
		return own, err
	}
	if err := s.runtime.HasTemplate(ctx, name); err != nil {
		return "", err
	}
	return name, nil
}

// Create records a sandbox and starts the operation that makes it. With an
// idempotency key, a repeated request returns the first operation.
func (s *Service) Create(ctx context.Context, projectID string, req CreateRequest, idemKey string) (Sandbox, Operation, error) {
	return s.create(ctx, projectID, req, idemKey, "", "")
}

// create is Create; from names the snapshot a fork restores ("" = none);
// fp is the request's fingerprint ("": the validated create request's).
func (s *Service) create(ctx context.Context, projectID string, req CreateRequest, idemKey, from, fp string) (Sandbox, Operation, error) {
	if err := s.validate(&req); err != nil {
		return Sandbox{}, Operation{}, err
	}
	if fp == "" {
		fp = Fingerprint("sandbox.create", req)
	}
	if len(idemKey) > 128 {
		return Sandbox{}, Operation{}, invalid("Idempotency-Key longer than 128 bytes")
	}
	ref := req.TemplateRef
	if ref == "" {
		var err error
		if ref, err = s.resolveTemplate(ctx, projectID, req.Template); err != nil {
			return Sandbox{}, Operation{}, err
		}
	} else if err := s.runtime.HasTemplate(ctx, ref); err != nil {
		return Sandbox{}, Operation{}, err
	}
	restoreFrom := from
	if wt, ok := s.runtime.(WarmTemplates); ok && from == "" {
		restoreFrom = wt.WarmSnapshot(ctx, ref)
	}
	now := s.opts.Now().UTC()
	sb := Sandbox{
		ID: NewID("sbx-"), ProjectID: projectID, Template: req.Template, TemplateRef: ref, State: SandboxCreating,
		Env: req.Env, Metadata: req.Metadata, Limits: req.Limits, Node: s.opts.NodeName,
		CreatedAt: now, UpdatedAt: now, Network: req.Network, Snapshot: restoreFrom,
	}
	timeout := s.opts.DefaultTimeout
	if req.TimeoutSeconds != nil {
		timeout = time.Duration(*req.TimeoutSeconds) * time.Second
	}
	if timeout > 0 {
		exp := now.Add(timeout)
		sb.ExpiresAt = &exp
		sb.TimeoutSeconds = int64(timeout / time.Second)
	}
	if req.AutoPauseSeconds != nil {
		sb.AutoPauseSeconds = *req.AutoPauseSeconds
	}
	sb.OnTimeout, sb.AutoResume, sb.PublicPorts = req.OnTimeout, req.AutoResume, req.PublicPorts
	sb.CheckpointSeconds = s.checkpointSeconds(projectID, &req)
	if pl, ok := s.runtime.(Placer); ok {
		node, err := pl.Place(ctx, sb)
		if err != nil {
			return Sandbox{}, Operation{}, err
		}
		sb.Node = node
	}
	kind := "sandbox.create"
	if from != "" {
		kind = "sandbox.fork"
	}
	op := s.engine.NewOperation(projectID, kind, sb.ID)
	op.Fingerprint = fp
	// The records and their two events (the sandbox's state, the
	// operation's pending) in one write (RecordEvents).
	stateEv, err := s.stateEvent(sb)
	if err != nil {
		return Sandbox{}, Operation{}, err
	}
	opEv, err := s.engine.PendingEvent(op)
	if err != nil {
		return Sandbox{}, Operation{}, err
	}
	stored, created, err := CreateSandboxOpEvents(ctx, s.store, sb, op, idemKey, []Event{stateEv, opEv})
	if errors.Is(err, errEventNotStored) {
		s.opts.Logf("sandbox %s: publish: %v", sb.ID, err)
		err = nil
	}
	if rel, ok := s.runtime.(PlacementReleaser); ok && sb.Node != "" && (err != nil || !created) {
		rel.ReleasePlacement(sb.Node, sb.ID)
	}
	if err != nil {
		return Sandbox{}, Operation{}, err
	}
	if !created {
		if err := CheckReplay(stored, op); err != nil {
			return Sandbox{}, Operation{}, err
		}
		existing, err := s.store.GetSandbox(ctx, projectID, stored.Target)
		return existing, stored, err
	}
	s.broker.Wake(projectID)
	s.engine.StartStored(ctx, stored, Step{Progress: 5, Message: "starting sandbox"}, func(ctx context.Context, progress Progress) (any, error) {
		return s.runCreate(ctx, sb, progress)
	})
	return sb, stored, nil
}

// runCreate runs a create operation, which starts at 5 % "starting sandbox".
func (s *Service) runCreate(ctx context.Context, sb Sandbox, progress Progress) (any, error) {
	start := s.runtime.StartSandbox
	if sb.Snapshot != "" {
		start = s.startFromSnapshot
	}
	pl, err := start(ctx, sb, progress)
	if err != nil {
		s.setTerminal(context.WithoutCancel(ctx), sb.ID, SandboxFailed, err.Error())
		return nil, err
	}
	updated, err := s.updateState(ctx, sb.ID, func(cur *Sandbox) error {
		if cur.State != SandboxCreating {
			return fmt.Errorf("sandbox became %s while starting: %w", cur.State, ErrConflict)
		}
		cur.State, cur.Driver, cur.Instance, cur.UpdatedAt = SandboxRunning, pl.Driver, pl.Instance, s.opts.Now().UTC()
		return nil
	})
	if err != nil {
		// Deleted while starting (or the store failed): do not leave the instance behind.
		if stopErr := s.runtime.StopSandbox(context.WithoutCancel(ctx), sb.ID); stopErr != nil {
			s.opts.Logf("sandbox %s: stop after failed start: %v", sb.ID, stopErr)
		}
		return nil, err
	}
	return updated, nil
}

func (s *Service) setTerminal(ctx context.Context, id string, st SandboxState, reason string) {
	updated, err := s.store.UpdateSandbox(ctx, id, func(cur *Sandbox) error {
		if cur.State.Terminal() {
			return nil
		}
		cur.State, cur.StateReason, cur.UpdatedAt = st, reason, s.opts.Now().UTC()
		return nil
	})
	if err != nil {
		s.opts.Logf("sandbox %s: set %s: %v", id, st, err)
		return
	}
	s.publishState(ctx, updated)
}

func (s *Service) publishState(ctx context.Context, sb Sandbox) {
	if err := s.broker.Publish(ctx, sb.ProjectID, "sandbox.state", sb.ID, "", stateData(sb)); err != nil {
		s.opts.Logf("sandbox %s: publish: %v", sb.ID, err)
	}
}

func stateData(sb Sandbox) map[string]any {
	return map[string]any{"id": sb.ID, "state": sb.State, "reason": sb.StateReason}
}

// stateEvent is the sandbox.state event publishState publishes for sb.
func (s *Service) stateEvent(sb Sandbox) (Event, error) {
	return s.broker.NewEvent(sb.ProjectID, "sandbox.state", sb.ID, "", stateData(sb))
}

// updateState is UpdateSandbox followed by publishState, in one store
// write where the store can (RecordEvents).
func (s *Service) updateState(ctx context.Context, id string, fn func(*Sandbox) error) (Sandbox, error) {
	updated, err := UpdateSandboxEvent(ctx, s.store, id, fn, s.stateEvent)
	if errors.Is(err, errEventNotStored) {
		s.opts.Logf("sandbox %s: publish: %v", id, err)
		err = nil
	}
	if err != nil {
		return updated, err
	}
	s.broker.Wake(updated.ProjectID)
	return updated, nil
}

// MarkLost records that a running sandbox died on its own and removes what
// is left of it on the node.
func (s *Service) MarkLost(ctx context.Context, id, reason string) {
	s.opts.Logf("sandbox %s lost: %s", id, reason)
	s.setTerminal(ctx, id, SandboxLost, reason)
	if err := s.runtime.StopSandbox(ctx, id); err != nil {
		s.opts.Logf("sandbox %s: clean up after loss: %v", id, err)
	}
}

// Get returns a project's sandbox.
func (s *Service) Get(ctx context.Context, projectID, id string) (Sandbox, error) {
	if !ValidSandboxID(id) {
		return Sandbox{}, fmt.Errorf("sandbox %.80q: %w", id, ErrNotFound)
	}
	return s.store.GetSandbox(ctx, projectID, id)
}

// getLocal is Get for lifecycle calls: a live sandbox that runs on another
// node (another server replica's in-process node) is refused, since this
// server cannot act on it and would only corrupt its record.
func (s *Service) getLocal(ctx context.Context, projectID, id string) (Sandbox, error) {
	sb, err := s.Get(ctx, projectID, id)
	if err != nil {
		return sb, err
	}
	if !s.opts.AnyNode && sb.Node != "" && sb.Node != s.opts.NodeName && !sb.State.Terminal() {
		return sb, fmt.Errorf("sandbox %s runs on node %s; send lifecycle calls to that node's server: %w", id, sb.Node, ErrConflict)
	}
	return sb, nil
}

// List returns a page of a project's sandboxes.
func (s *Service) List(ctx context.Context, f SandboxFilter) ([]Sandbox, error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 100
	}
	return s.store.ListSandboxes(ctx, f)
}

// Delete starts the operation that removes a sandbox.
func (s *Service) Delete(ctx context.Context, projectID, id string) (Operation, error) {
	return s.delete(ctx, projectID, id, "sandbox.delete", "deleted by request")
}

func (s *Service) delete(ctx context.Context, projectID, id, kind, reason string) (Operation, error) {
	sb, err := s.getLocal(ctx, projectID, id)
	if err != nil {
		return Operation{}, err
	}
	if sb.State == SandboxDeleted {
		return Operation{}, fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
	}
	_, err = s.updateState(ctx, id, func(cur *Sandbox) error {
		if cur.State == SandboxDeleted {
			return fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
		}
		if cur.State == SandboxCreating || cur.State == SandboxRunning || cur.State == SandboxPaused || cur.State == SandboxHibernated || cur.State == SandboxRestarting {
			cur.State = SandboxDeleting
		}
		cur.StateReason, cur.UpdatedAt = reason, s.opts.Now().UTC()
		return nil
	})
	if err != nil {
		return Operation{}, err
	}
	op := s.engine.NewOperation(projectID, kind, id)
	return s.engine.SubmitWith(ctx, op, "", Step{Progress: 10, Message: "stopping sandbox"}, func(ctx context.Context, progress Progress) (any, error) {
		if err := s.runtime.StopSandbox(ctx, id); err != nil {
			return nil, err
		}
		done, err := s.updateState(ctx, id, func(cur *Sandbox) error {
			cur.State, cur.UpdatedAt = SandboxDeleted, s.opts.Now().UTC()
			return nil
		})
		if err != nil {
			return nil, err
		}
		if sb.OnTimeout == OnTimeoutHibernate || sb.CheckpointSeconds > 0 {
			progress(90, "deleting the snapshots its timeouts and checkpoints took")
			s.dropAutoSnapshots(ctx, projectID, id)
		}
		return done, nil
	})
}

// SetTimeout changes when the server deletes a sandbox on its own.
func (s *Service) SetTimeout(ctx context.Context, projectID, id string, seconds int64) (Sandbox, error) {
	if seconds < 0 || seconds > MaxTimeoutSecond {
		return Sandbox{}, invalid("timeout_seconds must be between 0 and %d", MaxTimeoutSecond)
	}
	if _, err := s.getLocal(ctx, projectID, id); err != nil {
		return Sandbox{}, err
	}
	return s.store.UpdateSandbox(ctx, id, func(cur *Sandbox) error {
		if cur.State.Terminal() || cur.State == SandboxDeleting {
			return fmt.Errorf("sandbox is %s: %w", cur.State, ErrConflict)
		}
		if cur.State == SandboxPaused || cur.State == SandboxHibernated {
			// The clock is stopped: set what will be left at resume.
			cur.PausedRemainingMS = nil
			if seconds > 0 {
				ms := seconds * 1000
				cur.PausedRemainingMS = &ms
			}
		} else if seconds == 0 {
			cur.ExpiresAt = nil
		} else {
			exp := s.opts.Now().UTC().Add(time.Duration(seconds) * time.Second)
			cur.ExpiresAt = &exp
		}
		cur.UpdatedAt = s.opts.Now().UTC()
		return nil
	})
}

// SetNetwork changes a running sandbox's egress policy. It is stored, then
// applied; new connections and DNS queries see it at once.
func (s *Service) SetNetwork(ctx context.Context, projectID, id string, p NetworkPolicy) (Sandbox, error) {
	p, err := s.validateNetwork(p)
	if err != nil {
		return Sandbox{}, err
	}
	before, err := s.getLocal(ctx, projectID, id)
	if err != nil {
		return Sandbox{}, err
	}
	if na, ok := s.runtime.(NetworkAdmitter); ok {
		if err := na.AdmitNetwork(ctx, before, p); err != nil {
			return Sandbox{}, err
		}
	}
	updated, err := s.store.UpdateSandbox(ctx, id, func(cur *Sandbox) error {
		if cur.State != SandboxRunning {
			return fmt.Errorf("sandbox is %s: %w", cur.State, ErrConflict)
		}
		cur.Network, cur.UpdatedAt = &p, s.opts.Now().UTC()
		return nil
	})
	if err != nil {
		return Sandbox{}, err
	}
	if nr, ok := s.runtime.(NetworkRuntime); ok {
		if err := nr.SetNetworkPolicy(ctx, updated, p); err != nil {
			return Sandbox{}, err
		}
	}
	return updated, nil
}

// NetworkLog returns a running sandbox's egress decisions after a position.
func (s *Service) NetworkLog(ctx context.Context, projectID, id string, after uint64, limit int) (NetworkLog, error) {
	sb, err := s.getLocal(ctx, projectID, id)
	if err != nil {
		return NetworkLog{}, err
	}
	nr, ok := s.runtime.(NetworkRuntime)
	if !ok || !nr.NetworkEnabled() || sb.State != SandboxRunning {
		return NetworkLog{Decisions: []NetworkDecision{}}, nil
	}
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	return nr.NetworkLog(ctx, sb, after, limit)
}

// ReapExpired deletes running sandboxes past their timeout.
func (s *Service) ReapExpired(ctx context.Context) {
	expired, err := s.store.ExpiredSandboxes(ctx, s.opts.Now())
	if err != nil {
		s.opts.Logf("reaper: %v", err)
		return
	}
	for _, sb := range expired {
		if sb.OnTimeout == OnTimeoutHibernate {
			// The key makes the ticks that see the sandbox expired while its
			// hibernation runs join that one operation.
			key := fmt.Sprintf("timeout-hibernate-%s-%d", sb.ID, sb.ExpiresAt.UnixNano())
			op, err := s.hibernate(ctx, sb.ProjectID, sb.ID, key, true)
			switch {
			case err == nil && op.State != OpFailed, errors.Is(err, ErrNotFound), errors.Is(err, ErrConflict):
				// Running, done, gone, or another replica's sandbox.
				continue
			case err == nil:
				s.opts.Logf("reaper: hibernate %s failed (deleting it instead): %v", sb.ID, op.Error)
			default:
				s.opts.Logf("reaper: hibernate %s (deleting it instead): %v", sb.ID, err)
			}
		}
		if _, err := s.delete(ctx, sb.ProjectID, sb.ID, "sandbox.timeout", "timeout reached"); err != nil && !errors.Is(err, ErrNotFound) {
			s.opts.Logf("reaper: delete %s: %v", sb.ID, err)
		}
	}
}

// RunReaper calls ReapExpired every interval until ctx ends.
func (s *Service) RunReaper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.ReapExpired(ctx)
			s.AutoPauseIdle(ctx)
		}
	}
}

// Reconcile runs at start: it fails operations a crash interrupted, re-adopts
// running sandboxes, marks the rest lost or finishes their deletion, and
// sweeps host leftovers of everything else.
func (s *Service) Reconcile(ctx context.Context) error {
	if _, err := s.engine.Recover(ctx); err != nil {
		return fmt.Errorf("recover operations: %w", err)
	}
	all, err := s.store.ListSandboxes(ctx, SandboxFilter{States: []SandboxState{SandboxCreating, SandboxRunning, SandboxDeleting, SandboxPaused}})
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	keep := map[string]bool{}
	for _, sb := range all {
		if sb.Node != "" && sb.Node != s.opts.NodeName {
			continue
		}
		switch sb.State {
		case SandboxRunning, SandboxPaused:
			if err := s.runtime.AdoptSandbox(ctx, sb); err != nil {
				s.setTerminal(ctx, sb.ID, SandboxLost, "lost after server restart: "+err.Error())
				continue
			}
			keep[sb.Instance] = true
		case SandboxCreating:
			s.setTerminal(ctx, sb.ID, SandboxFailed, "server stopped while the sandbox was being created")
		case SandboxDeleting:
			s.setTerminal(ctx, sb.ID, SandboxDeleted, sb.StateReason)
		}
	}
	if err := s.runtime.Sweep(ctx, keep); err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	return s.reconcileSnapshots(ctx)
}
