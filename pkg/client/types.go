package client

import (
	"encoding/json"
	"fmt"
	"time"
)

// Sandbox states.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StateDeleting = "deleting"
	StateDeleted  = "deleted"
	StateFailed   = "failed"
	StateLost     = "lost"
)

// Operation states.
const (
	OpPending   = "pending"
	OpRunning   = "running"
	OpSucceeded = "succeeded"
	OpFailed    = "failed"
	OpCancelled = "cancelled"
)

// Limits are a sandbox's resource limits; zero fields take the server default.
type Limits struct {
	CPUMillis   int64 `json:"cpu_millis,omitempty"`
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	Pids        int64 `json:"pids,omitempty"`
	// DiskBytes is the size of the sandbox's writable layer (writes past
	// it fail with ENOSPC inside); zero: the server's default.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// CreateRequest asks for a new sandbox.
type CreateRequest struct {
	Template string            `json:"template,omitempty"` // default "base"
	Env      map[string]string `json:"env,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Limits   Limits            `json:"limits,omitzero"`
	// TimeoutSeconds: nil takes the server default, 0 means no timeout.
	TimeoutSeconds *int64 `json:"timeout_seconds,omitempty"`
	// PublicPorts opens the sandbox's forwarded ports to anyone with the
	// URL; otherwise each request needs the session token or a signed URL.
	PublicPorts bool `json:"public_ports,omitempty"`
	// Network is the egress policy; nil: blocked (needs a server run
	// with --egress for anything else).
	Network *NetworkPolicy `json:"network,omitempty"`
	// AutoPauseSeconds pauses the sandbox after this long without
	// data-plane activity; nil or 0: never.
	AutoPauseSeconds *int64 `json:"auto_pause_seconds,omitempty"`
	// OnTimeout is "delete" (the default) or "hibernate".
	OnTimeout string `json:"on_timeout,omitempty"`
	// AutoResume makes data-plane calls resume a paused or hibernated
	// sandbox.
	AutoResume bool `json:"auto_resume,omitempty"`
}

// Sandbox is a sandbox as the control API reports it.
type Sandbox struct {
	ID          string            `json:"id"`
	ProjectID   string            `json:"project_id"`
	Template    string            `json:"template"`
	State       string            `json:"state"`
	StateReason string            `json:"state_reason,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	Limits      Limits            `json:"limits"`
	Driver      string            `json:"driver,omitempty"`
	Node        string            `json:"node,omitempty"`
	Instance    string            `json:"instance,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
	ExpiresAt   *time.Time        `json:"expires_at,omitempty"` // nil: never
	PublicPorts bool              `json:"public_ports,omitempty"`
	// Network is the egress policy; nil: blocked.
	Network          *NetworkPolicy `json:"network,omitempty"`
	AutoPauseSeconds int64          `json:"auto_pause_seconds,omitempty"`
	OnTimeout        string         `json:"on_timeout,omitempty"` // "" or "delete", or "hibernate"
	AutoResume       bool           `json:"auto_resume,omitempty"`
}

// OpError is the error recorded on a failed operation.
type OpError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Operation is one asynchronous lifecycle change.
type Operation struct {
	ID        string          `json:"id"`
	ProjectID string          `json:"project_id"`
	Kind      string          `json:"kind"`   // e.g. "sandbox.create"
	Target    string          `json:"target"` // sandbox id or template name
	State     string          `json:"state"`
	Progress  int             `json:"progress"` // 0..100
	Message   string          `json:"message,omitempty"`
	Error     *OpError        `json:"error,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// Done reports whether the operation has finished, successfully or not.
func (o Operation) Done() bool {
	return o.State == OpSucceeded || o.State == OpFailed || o.State == OpCancelled
}

// DecodeResult decodes the operation's result (a Sandbox for sandbox
// operations, a TemplateInfo for template builds) into v.
func (o Operation) DecodeResult(v any) error {
	if len(o.Result) == 0 {
		return fmt.Errorf("operation %s has no result", o.ID)
	}
	if err := json.Unmarshal(o.Result, v); err != nil {
		return fmt.Errorf("decode result of operation %s: %w", o.ID, err)
	}
	return nil
}

// OperationError is returned when an awaited operation ends failed or
// cancelled. Operation holds its final state.
type OperationError struct {
	Operation Operation
}

func (e *OperationError) Error() string {
	o := e.Operation
	if o.Error != nil {
		return fmt.Sprintf("operation %s (%s %s) %s: %s: %s", o.ID, o.Kind, o.Target, o.State, o.Error.Code, o.Error.Message)
	}
	return fmt.Sprintf("operation %s (%s %s) %s", o.ID, o.Kind, o.Target, o.State)
}

// Session grants access to one sandbox's data plane until ExpiresAt.
type Session struct {
	// SandboxID is filled in by this package (the wire object does not
	// carry it) so a Session alone is enough to connect.
	SandboxID string    `json:"sandbox_id,omitempty"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
	DataURL   string    `json:"data_url"`
	// Domain is the sandbox domain of forwarded ports: port P is
	// <scheme of DataURL>://P-<sandbox id>.<Domain>/ (see PortURL). Empty
	// from a server without port forwarding.
	Domain string `json:"domain,omitempty"`
}

// CreateResult is the answer to CreateSandbox.
type CreateResult struct {
	Operation Operation `json:"operation"`
	Sandbox   Sandbox   `json:"sandbox"`
	Session   Session   `json:"session"`
}

// ListOptions filter ListSandboxes.
type ListOptions struct {
	State     []string          // empty: every state but deleted
	Metadata  map[string]string // exact matches, all must hold
	Limit     int               // page size, 1..1000; 0 takes the server default (100)
	PageToken string            // NextPageToken of the previous page
	// AllProjects lists every project's sandboxes (admin keys only).
	AllProjects bool
}

// SandboxPage is one page of ListSandboxes.
type SandboxPage struct {
	Sandboxes     []Sandbox `json:"sandboxes"`
	NextPageToken string    `json:"next_page_token"` // empty on the last page
}

// TemplateInfo describes a built template.
type TemplateInfo struct {
	Name string `json:"name"`
	// Public templates (builtins, operator-published) are read-only to
	// project keys; the others belong to Project.
	Public    bool              `json:"public"`
	Project   string            `json:"project,omitempty"`
	Digest    string            `json:"digest"`
	Source    string            `json:"source"`
	SizeBytes int64             `json:"size_bytes"`
	Files     int               `json:"files"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	User      string            `json:"user,omitempty"`
	Cmd       []string          `json:"cmd,omitempty"`   // start command from an image
	Ready     []string          `json:"ready,omitempty"` // ready check (a build file's READY)
	CreatedAt time.Time         `json:"created_at"`
	// WarmSnapshot is the pre-warmed snapshot sandboxes of the template
	// start from (a build file with START); WarmProcesses says whether
	// the start command's processes come back or it runs again at create.
	WarmSnapshot  string `json:"warm_snapshot,omitempty"`
	WarmProcesses string `json:"warm_processes,omitempty"`
}

// TemplateBuildRequest asks the server to build a template. Over the API the
// source is "busybox", "debian" or "image" (Image names a registry
// reference); image archives go through UploadTemplate; directories and
// rootfs tarballs are built on the server machine with the CLI.
type TemplateBuildRequest struct {
	Name     string            `json:"name"`
	Source   string            `json:"source"`
	Packages []string          `json:"packages,omitempty"`
	Image    string            `json:"image,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	User     string            `json:"user,omitempty"`
	// Public publishes the template to every project (admin keys only).
	Public bool `json:"public,omitempty"`
}

// APIKey is an API key's record; the secret is only shown by CreateKey.
type APIKey struct {
	ID        string     `json:"id"`
	ProjectID string     `json:"project_id"`
	Name      string     `json:"name"`
	Admin     bool       `json:"admin,omitempty"` // an operator's key
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// LifecycleEvent is one entry of the project's event stream (/v1/events).
type LifecycleEvent struct {
	Seq         int64           `json:"seq"`
	ProjectID   string          `json:"project_id"`
	Type        string          `json:"type"` // "operation.updated", "sandbox.state"
	SandboxID   string          `json:"sandbox_id,omitempty"`
	OperationID string          `json:"operation_id,omitempty"`
	Data        json.RawMessage `json:"data"`
	CreatedAt   time.Time       `json:"created_at"`
}

// PTY is a terminal size.
type PTY struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// ExecRequest starts a command in a sandbox. Give exactly one of Argv or Shell.
type ExecRequest struct {
	Argv    []string
	Shell   string // run as /bin/sh -c Shell
	Env     map[string]string
	Cwd     string
	User    string        // user name or numeric uid inside the sandbox
	Stdin   bool          // keep stdin open for WriteStdin/CloseStdin
	Timeout time.Duration // 0: none; the command is killed at the deadline
	PTY     *PTY          // run on a pseudo-terminal; output arrives as stdout
	Tag     string
}

// processSpec is ExecRequest on the wire (agent.ProcessSpec).
type processSpec struct {
	Argv      []string          `json:"argv,omitempty"`
	Shell     string            `json:"shell,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	User      string            `json:"user,omitempty"`
	Stdin     bool              `json:"stdin,omitempty"`
	TimeoutMs int64             `json:"timeout_ms,omitempty"`
	PTY       *PTY              `json:"pty,omitempty"`
	Tag       string            `json:"tag,omitempty"`
}

func (r ExecRequest) spec() processSpec {
	ms := r.Timeout.Milliseconds()
	if r.Timeout > 0 && ms == 0 {
		ms = 1 // sub-millisecond timeouts must not mean "none"
	}
	return processSpec{Argv: r.Argv, Shell: r.Shell, Env: r.Env, Cwd: r.Cwd, User: r.User,
		Stdin: r.Stdin, TimeoutMs: ms, PTY: r.PTY, Tag: r.Tag}
}

// Exit is how a command ended.
type Exit struct {
	Code      int    `json:"exit_code"`        // -1 when killed by a signal
	Signal    string `json:"signal,omitempty"` // e.g. "SIGKILL"
	TimedOut  bool   `json:"timed_out,omitempty"`
	OOMKilled bool   `json:"oom_killed,omitempty"`
	Error     string `json:"error,omitempty"` // the command could not be started or waited for
}

// Command describes a started command.
type Command struct {
	ID              string   `json:"id"`
	PID             int      `json:"pid"`
	Argv            []string `json:"argv"`
	Tag             string   `json:"tag,omitempty"`
	PTY             bool     `json:"pty"`
	Running         bool     `json:"running"`
	Exit            *Exit    `json:"exit,omitempty"`
	LastEventID     uint64   `json:"last_event_id"`
	OutputTruncated bool     `json:"output_truncated,omitempty"`
}

// Output event types of a command stream.
const (
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
	// EventDropped stands for output the sandbox's bound on kept output
	// dropped before it was read; Data is a JSON Dropped.
	EventDropped = "dropped"
)

// Event is one output chunk of a command. Data is decoded and owned by the
// callee only for the duration of the callback.
type Event struct {
	Seq  uint64
	Type string // EventStdout, EventStderr or EventDropped
	Data []byte
}

// Dropped is the payload of an EventDropped event: the command's output
// log no longer keeps events 1..DroppedEvents (DroppedBytes of output);
// the next event is FirstSeq.
type Dropped struct {
	DroppedEvents uint64 `json:"dropped_events"`
	DroppedBytes  int64  `json:"dropped_bytes"`
	FirstSeq      uint64 `json:"first_seq"`
}

// FileInfo describes one file in a sandbox.
type FileInfo struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	Type    string `json:"type"` // "file", "dir", "symlink", "other"
	Size    int64  `json:"size"`
	Mode    uint32 `json:"mode"`
	ModTime int64  `json:"mtime_unix"`
	Target  string `json:"symlink_target,omitempty"`
}
