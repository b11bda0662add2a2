// Package agent is the in-sandbox daemon (space agent) and the wire types the
// host uses to talk to it. The agent is the only thing the host talks to
// inside a sandbox. It holds no platform credentials; everything it returns is
// treated by the host as untrusted input.
package agent

import "encoding/json"

// Limits on what the agent accepts, so a hostile host-side client (or a bug)
// cannot make it allocate without bound.
const (
	MaxArgs       = 4096
	MaxArgBytes   = 256 << 10 // total bytes of argv + env
	MaxPathBytes  = 4096
	MaxJSONBody   = 1 << 20
	MaxStdinChunk = 1 << 20
)

// ProcessSpec starts one command.
type ProcessSpec struct {
	// Exactly one of Argv or Shell. Shell runs as ["/bin/sh", "-c", Shell].
	Argv  []string          `json:"argv,omitempty"`
	Shell string            `json:"shell,omitempty"`
	Env   map[string]string `json:"env,omitempty"` // merged over the agent's defaults
	Cwd   string            `json:"cwd,omitempty"`
	// User is a user name from the sandbox's /etc/passwd or a numeric uid.
	// Empty means the agent's default user (root unless configured).
	User      string `json:"user,omitempty"`
	Stdin     bool   `json:"stdin,omitempty"`      // keep a stdin pipe open
	TimeoutMs int64  `json:"timeout_ms,omitempty"` // 0 = no timeout; killed with SIGKILL at the deadline
	PTY       *PTY   `json:"pty,omitempty"`        // run on a pseudo-terminal (stdout carries the PTY output; stdin is always open)
	Tag       string `json:"tag,omitempty"`        // free-form label, returned in listings
}

// PTY size.
type PTY struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// ProcessInfo describes a started command.
type ProcessInfo struct {
	ID      string   `json:"id"`  // agent-assigned, unique for the agent's life ("1", "2", ...)
	PID     int      `json:"pid"` // pid inside the sandbox
	Argv    []string `json:"argv"`
	Tag     string   `json:"tag,omitempty"`
	PTY     bool     `json:"pty"`
	Running bool     `json:"running"`
	Exit    *Exit    `json:"exit,omitempty"`
}

// Exit is how a command ended.
type Exit struct {
	Code     int    `json:"exit_code"`        // -1 when killed by a signal
	Signal   string `json:"signal,omitempty"` // e.g. "SIGKILL"
	TimedOut bool   `json:"timed_out,omitempty"`
	// OOMKilled is filled in by the host (the agent cannot see cgroup
	// counters); the agent always leaves it false.
	OOMKilled bool   `json:"oom_killed,omitempty"`
	Error     string `json:"error,omitempty"` // the command could not be started or waited for
}

// Event types on a process event stream.
const (
	EventStdout byte = 1
	EventStderr byte = 2
	EventExit   byte = 3 // payload: JSON Exit; always the last event
	// EventStarted is the first frame of a combined start and follow
	// (POST /v1/processes with Accept: EventsContentType): seq 0, payload
	// the JSON ProcessInfo. It never appears on GET .../events.
	EventStarted byte = 5
)

// Event is one entry of a process's output stream. Seq starts at 1 and grows
// by one per event.
type Event struct {
	Seq  uint64
	Type byte
	Data []byte
}

// FileInfo describes one file in the sandbox.
type FileInfo struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	Type    string `json:"type"` // "file", "dir", "symlink", "other"
	Size    int64  `json:"size"`
	Mode    uint32 `json:"mode"` // permission bits
	ModTime int64  `json:"mtime_unix"`
	Target  string `json:"symlink_target,omitempty"`
}

// Config holds per-sandbox defaults applied to every command; set when a
// sandbox is created or claimed from the warm pool.
type Config struct {
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	User string            `json:"user,omitempty"`
}

// Event stream framing (GET /v1/processes/{id}/events). Each frame is an
// 8-byte big-endian seq, a 1-byte type, a 4-byte big-endian payload length and
// the payload. The agent never sends a payload larger than MaxEventPayload.
const (
	EventsContentType = "application/x-space-events"
	FrameHeaderSize   = 13
	MaxEventPayload   = 1 << 20
	// MaxOutputChunk is the most output bytes the agent puts in one event.
	MaxOutputChunk = 256 << 10
)

// Health is the body of GET /health.
type Health struct {
	OK      bool   `json:"ok"`
	PID     int    `json:"pid"`
	Version string `json:"version"`
}

// ProcessList is the body of GET /v1/processes.
type ProcessList struct {
	Processes []ProcessInfo `json:"processes"`
}

// FileList is the body of GET /v1/files/list.
type FileList struct {
	Entries   []FileInfo `json:"entries"`
	Truncated bool       `json:"truncated,omitempty"`
}

// MkdirRequest is the body of POST /v1/files/mkdir (mkdir -p).
type MkdirRequest struct {
	Path string `json:"path"`
}

// MoveRequest is the body of POST /v1/files/move.
type MoveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// SignalRequest is the body of POST /v1/processes/{id}/signal. Signal is a
// JSON string ("SIGTERM" or "TERM") or a JSON number (15).
type SignalRequest struct {
	Signal json.RawMessage `json:"signal"`
}

// ResizeRequest is the body of POST /v1/processes/{id}/resize.
type ResizeRequest struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// ErrorBody is the body of every error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is a machine-readable code (snake_case) and a human message.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error codes the agent returns. The HTTP status carries the class (400, 404,
// 409, ...); the code says which case of it.
const (
	CodeBadRequest       = "bad_request"
	CodeInvalidPath      = "invalid_path"
	CodeTooLarge         = "too_large"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeNotRunning       = "not_running"
	CodeStdinClosed      = "stdin_closed"
	CodeNoStdin          = "no_stdin"
	CodeNotPTY           = "not_pty"
	CodeEventsGone       = "events_gone"
	CodeTooManyProcesses = "too_many_processes"
	CodeExecFailed       = "exec_failed"
	CodeUnknownUser      = "unknown_user"
	CodeInvalidCwd       = "invalid_cwd"
	CodeNotAFile         = "not_a_file"
	CodeNotADirectory    = "not_a_directory"
	CodeIsADirectory     = "is_a_directory"
	CodeAlreadyExists    = "already_exists"
	CodeNotEmpty         = "not_empty"
	CodePermissionDenied = "permission_denied"
	CodeNoSpace          = "no_space"
	CodeUnavailable      = "unavailable"
	CodeInternal         = "internal"
)
