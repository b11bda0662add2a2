// Package core holds SPACE's domain types, the operations engine and the
// sandbox lifecycle service. It knows nothing about HTTP or SQL: the api
// package maps its errors to status codes, and a Store implementation
// (internal/store/sqlite) persists its records.
package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/egress/policy"
)

// Sentinel errors; the API edge maps them to HTTP status codes.
var (
	ErrNotFound     = errors.New("not found")
	ErrConflict     = errors.New("conflict")
	ErrInvalid      = errors.New("invalid argument")
	ErrUnauthorized = errors.New("unauthorized")
	ErrUnavailable  = errors.New("unavailable")
	ErrExhausted    = errors.New("resource exhausted")
	// ErrEgressDisabled: the request asks for a network policy or
	// credentials, and this server runs without the egress gateway. It is
	// also ErrInvalid: the request cannot succeed on this server as it is.
	ErrEgressDisabled = fmt.Errorf("egress disabled: %w", ErrInvalid)
	// ErrIdempotencyReused: an Idempotency-Key already used for a
	// different request (another body, route or target).
	ErrIdempotencyReused = errors.New("idempotency key reused with a different request")
)

// SandboxState is where a sandbox is in its life.
type SandboxState string

// Sandbox states. creating → running → deleting → deleted; failed and lost
// are terminal states that carry a reason.
const (
	SandboxCreating SandboxState = "creating"
	SandboxRunning  SandboxState = "running"
	SandboxDeleting SandboxState = "deleting"
	SandboxDeleted  SandboxState = "deleted"
	SandboxFailed   SandboxState = "failed"
	SandboxLost     SandboxState = "lost"
)

// Terminal reports whether no further transition can happen.
func (s SandboxState) Terminal() bool {
	return s == SandboxDeleted || s == SandboxFailed || s == SandboxLost
}

// Limits are the resource limits requested for a sandbox.
type Limits struct {
	CPUMillis   int64 `json:"cpu_millis,omitempty"`
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	Pids        int64 `json:"pids,omitempty"`
	// DiskBytes bounds the sandbox's writable layer (its own filesystem
	// of this size; writes past it fail with ENOSPC inside). Zero: the
	// server's default, which may be none.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// Sandbox is the persisted record of one sandbox.
type Sandbox struct {
	ID        string `json:"id"`
	ProjectID string `json:"project_id"`
	Template  string `json:"template"`
	// TemplateRef is the template the name resolved to at create time
	// (see TemplateRef): the project's own, else the public one.
	TemplateRef string            `json:"template_ref,omitempty"`
	State       SandboxState      `json:"state"`
	StateReason string            `json:"state_reason,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	Limits      Limits            `json:"limits"`
	Driver      string            `json:"driver,omitempty"`
	Node        string            `json:"node,omitempty"`
	// Instance is the node's handle for the isolated instance (a warm-pool
	// instance keeps the id it was created with).
	Instance  string    `json:"instance,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// ExpiresAt is when the server deletes the sandbox on its own; zero means never.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// Network is the egress policy; nil means blocked.
	Network *NetworkPolicy `json:"network,omitempty"`
	// PausedRemainingMS is, while paused, how much of the timeout is left
	// (the clock stops while paused); nil = no timeout.
	PausedRemainingMS *int64 `json:"paused_remaining_ms,omitempty"`
	// Snapshot is the snapshot this sandbox was restored or forked from.
	Snapshot string `json:"snapshot,omitempty"`
	// HibernatedSnapshot is, while hibernated, the snapshot resume restores.
	HibernatedSnapshot string `json:"hibernated_snapshot,omitempty"`
	// AutoPauseSeconds: the server pauses the running sandbox after this
	// long without data-plane activity (0 = never).
	AutoPauseSeconds int64 `json:"auto_pause_seconds,omitempty"`
	// OnTimeout is what the server does when the timeout is reached:
	// OnTimeoutDelete ("" too) or OnTimeoutHibernate.
	OnTimeout string `json:"on_timeout,omitempty"`
	// AutoResume: a data-plane call to this paused or hibernated sandbox
	// resumes it first instead of failing with sandbox_paused.
	AutoResume bool `json:"auto_resume,omitempty"`
	// PublicPorts: the sandbox's forwarded ports open without a token
	// (preview links anyone can follow); otherwise each request needs the
	// session token or a port token.
	PublicPorts bool `json:"public_ports,omitempty"`
	// TimeoutSeconds is the timeout the sandbox was created with (0 = none);
	// a sandbox woken with no time left gets it again.
	TimeoutSeconds int64 `json:"timeout_seconds,omitempty"`
	// CheckpointSeconds: the server checkpoints the running sandbox this
	// often (0 = never); when its node is lost it restarts on another node
	// from the latest one (Checkpoint, taken at CheckpointAt).
	CheckpointSeconds int64      `json:"checkpoint_seconds,omitempty"`
	Checkpoint        string     `json:"checkpoint,omitempty"`
	CheckpointAt      *time.Time `json:"checkpoint_at,omitempty"`
	// Checkpoints counts the checkpoints taken (every checkpointRebase-th
	// captures the whole layer and starts a new chain).
	Checkpoints int64 `json:"checkpoints,omitempty"`
}

// What the server does with a sandbox whose timeout is reached.
const (
	OnTimeoutDelete    = "delete"
	OnTimeoutHibernate = "hibernate"
)

// NetworkPolicy is a sandbox's egress policy: mode "blocked" (the default:
// nothing leaves, DNS included), "allowlist" (only the host[:port[,port]]
// rules in Allow; "*.name" matches proper subdomains) or "open" (any
// public address, never an internal one).
type NetworkPolicy struct {
	Mode string `json:"mode"`
	// Allow holds rules as strings ("host[:ports][ METHODS][ PATHS]") or,
	// on input, as objects ({"host", "ports", "methods", "paths"}); both
	// are stored and returned in canonical string form.
	Allow AllowRules `json:"allow,omitempty"`
	// Presets name registry presets ("debian", "pypi", "npm", "goproxy");
	// validation expands them into read-only Allow rules and clears this
	// field, so a stored policy always shows its rules.
	Presets []string `json:"presets,omitempty"`
	// Passthrough lists allowlisted names (rule syntax) whose TLS is
	// relayed as is; all other allowlisted TLS is terminated by the
	// gateway with the sandbox's own CA.
	Passthrough []string `json:"passthrough,omitempty"`
	// Credentials are ids of the project's credentials attached to the
	// sandbox: the gateway substitutes their placeholders on requests to
	// their bound hosts.
	Credentials []string `json:"credentials,omitempty"`
}

// EgressRanges are the address sets of an egress gateway, as it applies
// them (GET /v1/info, node records).
type EgressRanges struct {
	// Internal is every range the gateway never dials for a sandbox, in
	// any mode: the defaults (loopback, RFC 1918, CGNAT, link-local and
	// metadata, ..., IPv6 outside global unicast, or all IPv6 without
	// IPv6 egress), the sandbox pools, the host's own
	// networks and --egress-internal-ranges, less --egress-public-ranges.
	// Disjoint CIDRs, sorted.
	Internal []string `json:"internal"`
	// Public are the ranges --egress-public-ranges declares public.
	Public []string `json:"public"`
}

// Credential is a secret stored by the platform (encrypted at rest) and
// bound to one upstream slot. The secret itself is never returned; a
// sandbox that has it attached sends Placeholder in its place.
type Credential struct {
	ID          string    `json:"id"`
	ProjectID   string    `json:"project_id"`
	Name        string    `json:"name,omitempty"`
	Host        string    `json:"host"`
	Port        uint16    `json:"port"`
	Header      string    `json:"header"`
	Prefix      string    `json:"prefix,omitempty"`
	Methods     []string  `json:"methods,omitempty"`
	PathPrefix  string    `json:"path_prefix,omitempty"`
	Env         string    `json:"env,omitempty"`
	Placeholder string    `json:"placeholder"`
	CreatedAt   time.Time `json:"created_at"`
}

// CredentialRequest creates a credential.
type CredentialRequest struct {
	Name       string   `json:"name,omitempty"`
	Secret     string   `json:"secret"`
	Host       string   `json:"host"`
	Port       uint16   `json:"port,omitempty"`        // default 443
	Header     string   `json:"header,omitempty"`      // default Authorization
	Prefix     string   `json:"prefix,omitempty"`      // e.g. "Bearer "
	Methods    []string `json:"methods,omitempty"`     // default: any but TRACE, OPTIONS, CONNECT
	PathPrefix string   `json:"path_prefix,omitempty"` // default: any path
	// Env, if set, names an environment variable that sandboxes created
	// with this credential attached get, holding the placeholder.
	Env string `json:"env,omitempty"`
}

// NetworkDecision is one entry of a sandbox's egress decision log.
type NetworkDecision struct {
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	Proto   string    `json:"proto"`
	Name    string    `json:"name,omitempty"`
	Port    uint16    `json:"port,omitempty"`
	Dest    string    `json:"dest,omitempty"`
	Dialled string    `json:"dialled,omitempty"`
	Verdict string    `json:"verdict"`
	Rule    string    `json:"rule,omitempty"`
	Reason  string    `json:"reason,omitempty"`
	TLS     string    `json:"tls,omitempty"` // terminated or passthrough
	Via     string    `json:"via,omitempty"` // "proxy": through the explicit proxy
}

// NetworkLog is a page of the decision log plus the sandbox's counters.
type NetworkLog struct {
	Decisions []NetworkDecision `json:"decisions"`
	Counters  map[string]uint64 `json:"counters,omitempty"`
}

// OpState is the state of an operation.
type OpState string

// Operation states: pending → running → succeeded | failed | cancelled.
const (
	OpPending   OpState = "pending"
	OpRunning   OpState = "running"
	OpSucceeded OpState = "succeeded"
	OpFailed    OpState = "failed"
	OpCancelled OpState = "cancelled"
)

// Done reports whether the operation has finished.
func (s OpState) Done() bool { return s == OpSucceeded || s == OpFailed || s == OpCancelled }

// OpError is the error of a failed operation.
type OpError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Operation is one asynchronous lifecycle change.
type Operation struct {
	ID        string          `json:"id"`
	ProjectID string          `json:"project_id"`
	Kind      string          `json:"kind"`   // e.g. "sandbox.create"
	Target    string          `json:"target"` // the sandbox id or template name it acts on
	State     OpState         `json:"state"`
	Progress  int             `json:"progress"` // 0..100
	Message   string          `json:"message,omitempty"`
	Error     *OpError        `json:"error,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	// Fingerprint identifies the request that made the operation (see
	// Fingerprint). Stores keep it (EncodeOperation); clients never see it.
	Fingerprint string `json:"-"`
}

// Event is a lifecycle event, visible to one project. Seq orders all events.
type Event struct {
	Seq         int64           `json:"seq"`
	ProjectID   string          `json:"project_id"`
	Type        string          `json:"type"` // "operation.updated", "sandbox.state"
	SandboxID   string          `json:"sandbox_id,omitempty"`
	OperationID string          `json:"operation_id,omitempty"`
	Data        json.RawMessage `json:"data"`
	CreatedAt   time.Time       `json:"created_at"`
}

// APIKey is a stored (hashed) API key.
type APIKey struct {
	ID        string `json:"id"`
	ProjectID string `json:"project_id"`
	Name      string `json:"name"`
	// Admin keys may also publish public templates, run template GC and
	// list across projects.
	Admin     bool       `json:"admin,omitempty"`
	Hash      []byte     `json:"-"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// SandboxFilter selects sandboxes in List.
type SandboxFilter struct {
	ProjectID string
	States    []SandboxState // empty: every state but deleted
	Metadata  map[string]string
	After     string // page cursor: return ids greater than this
	Limit     int
}

// TemplateInfo describes a built template.
type TemplateInfo struct {
	Name string `json:"name"`
	// Public: a builtin or operator-published template, read-only to
	// projects; else Project owns it.
	Public    bool              `json:"public"`
	Project   string            `json:"project,omitempty"`
	Digest    string            `json:"digest"`
	Source    string            `json:"source"`
	SizeBytes int64             `json:"size_bytes"`
	Files     int               `json:"files"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	User      string            `json:"user,omitempty"`
	Cmd       []string          `json:"cmd,omitempty"`   // start command from an image (entrypoint + cmd)
	Ready     []string          `json:"ready,omitempty"` // ready check (a build file's READY)
	CreatedAt time.Time         `json:"created_at"`
	// WarmSnapshot is the template's pre-warmed snapshot (a build file
	// with START): creates start from it. WarmProcesses says whether its
	// processes come back or the start command is run again at create.
	WarmSnapshot  string `json:"warm_snapshot,omitempty"`
	WarmProcesses string `json:"warm_processes,omitempty"`
	// Nodes: with remote nodes, the ready nodes that have the template
	// (sandboxes of it are placed only there).
	Nodes []string `json:"nodes,omitempty"`
}

// TemplateBuildRequest asks the server to build a template. Over the API only
// self-contained sources are allowed ("busybox", "debian", "image" with a
// registry reference) plus uploaded image archives ("archive", Path set by
// the server); local directories and tarballs are built by the admin CLI on
// the server's machine.
type TemplateBuildRequest struct {
	Name     string            `json:"name"`
	Source   string            `json:"source"`
	Packages []string          `json:"packages,omitempty"`
	Image    string            `json:"image,omitempty"` // registry reference (source "image")
	Path     string            `json:"-"`
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	User     string            `json:"user,omitempty"`
	// Public publishes the template to every project (admin keys only);
	// otherwise it belongs to the caller's project.
	Public bool `json:"public,omitempty"`
}

// Templates lists and builds templates on the node.
type Templates interface {
	ListTemplates(ctx context.Context) ([]TemplateInfo, error)
	GetTemplate(ctx context.Context, name string) (TemplateInfo, error)
	BuildTemplate(ctx context.Context, req TemplateBuildRequest, progress Progress) (TemplateInfo, error)
}

// AllowRules is a policy's allow list. It decodes each element from a JSON
// string or a rule object (policy.RuleObject) into the string form.
type AllowRules []string

// UnmarshalJSON accepts strings and rule objects.
func (a *AllowRules) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	out := make(AllowRules, 0, len(raw))
	for _, r := range raw {
		s, err := policy.DecodeRule(r)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		out = append(out, s)
	}
	*a = out
	return nil
}
