// Package audit records security-relevant decisions (refused cross-project
// access, key creation and revocation, template publish and delete) as
// structured JSON lines, one event per line, apart from the server's
// operational log so that it can be kept, shipped and alerted on as such.
package audit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"sync"
)

// Event is one audited decision.
type Event struct {
	Action    string // e.g. "sandbox.get", "key.create", "template.delete"
	Outcome   string // "succeeded", "denied"
	ProjectID string // the caller's project
	KeyID     string // the caller's API key
	Admin     bool   // the caller used an admin key
	Kind      string // the object's kind: "sandbox", "template", "key", ...
	Target    string // the object's id or name
	// Owner is the project that owns Target when that is not the caller's
	// (a refused cross-project access).
	Owner  string
	Reason string
}

// Log writes audit events. A nil *Log discards them.
type Log struct {
	mu     sync.Mutex
	l      *slog.Logger
	closer io.Closer
	ops    *slog.Logger
}

// AlsoWarn makes every refusal (outcome "denied": a cross-project access,
// a 403) also a warn record "request refused" in the operational log ops,
// with the same fields; the audit log keeps its own copy.
func (l *Log) AlsoWarn(ops *slog.Logger) {
	if l != nil {
		l.ops = ops
	}
}

// New writes events to w as JSON lines.
func New(w io.Writer) *Log {
	return &Log{l: slog.New(slog.NewJSONHandler(w, nil))}
}

// Open appends events to the file at path (created owner-only), or to
// standard error for "-".
func Open(path string) (*Log, error) {
	if path == "-" {
		return New(os.Stderr), nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, fmt.Errorf("audit log: %w", err)
	}
	l := New(f)
	l.closer = f
	return l, nil
}

// Close closes the file behind the log.
func (l *Log) Close() error {
	if l == nil || l.closer == nil {
		return nil
	}
	return l.closer.Close()
}

// Record writes e with the request id carried by ctx.
func (l *Log) Record(ctx context.Context, e Event) {
	if l == nil {
		return
	}
	attrs := []slog.Attr{
		slog.String("action", e.Action),
		slog.String("outcome", e.Outcome),
		slog.String("project", e.ProjectID),
		slog.String("key_id", e.KeyID),
		slog.Bool("admin", e.Admin),
		slog.String("kind", e.Kind),
		slog.String("target", e.Target),
	}
	if e.Owner != "" {
		attrs = append(attrs, slog.String("owner", e.Owner))
	}
	if e.Reason != "" {
		attrs = append(attrs, slog.String("reason", e.Reason))
	}
	if id := RequestID(ctx); id != "" {
		attrs = append(attrs, slog.String("request_id", id))
	}
	if e.Outcome == "denied" && l.ops != nil {
		warn := attrs
		if e.Owner != "" {
			warn = append(warn[:len(warn):len(warn)], slog.Bool("cross_project", true))
		}
		l.ops.LogAttrs(context.WithoutCancel(ctx), slog.LevelWarn, "request refused", warn...)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.l.LogAttrs(context.WithoutCancel(ctx), slog.LevelInfo, "audit", attrs...)
}

type ctxKey struct{}

// WithRequestID returns ctx carrying a request id.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// RequestID returns the request id ctx carries, "" if none.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(ctxKey{}).(string)
	return id
}

var requestIDRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// RequestIDFrom returns a client's X-Request-Id if it is a sane token, else
// a new random one.
func RequestIDFrom(header string) string {
	if requestIDRE.MatchString(header) {
		return header
	}
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "req-unknown"
	}
	return "req-" + hex.EncodeToString(b)
}
