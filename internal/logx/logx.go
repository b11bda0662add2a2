// Package logx is SPACE's operational log: log/slog records as JSON or text
// lines, the adapter that turns the printf-style Logf callbacks the
// packages take into such records, the request id a context carries (the
// one internal/audit assigns) added to every record logged with it, and the
// access log of the HTTP listeners (access.go).
package logx

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/audit"
)

// Formats and levels New accepts (--log-format, --log-level).
var (
	Formats = []string{"text", "json"}
	Levels  = []string{"debug", "info", "warn", "error"}
)

// ParseLevel reads debug|info|warn|error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil || !contains(Levels, strings.ToLower(s)) {
		return 0, fmt.Errorf("log level %q: want one of %s", s, strings.Join(Levels, ", "))
	}
	return l, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// New returns a logger writing format ("json": one JSON object per line;
// "text": slog's key=value lines) at level and above to w. Records logged
// with a context carry its request id (request_id).
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	lv, err := ParseLevel(level)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch format {
	case "json":
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("log format %q: want one of %s", format, strings.Join(Formats, ", "))
	}
	return slog.New(WithRequestIDs(h)), nil
}

// WithRequestIDs wraps h so that a record logged with a context that
// carries a request id (audit.WithRequestID) gets it as request_id.
func WithRequestIDs(h slog.Handler) slog.Handler {
	if _, ok := h.(ctxHandler); ok {
		return h
	}
	return ctxHandler{h}
}

type ctxHandler struct{ slog.Handler }

func (h ctxHandler) Handle(ctx context.Context, r slog.Record) error {
	if id := audit.RequestID(ctx); id != "" && !hasAttr(r, "request_id") {
		r = r.Clone()
		r.AddAttrs(slog.String("request_id", id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h ctxHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return ctxHandler{h.Handler.WithAttrs(as)}
}
func (h ctxHandler) WithGroup(name string) slog.Handler { return ctxHandler{h.Handler.WithGroup(name)} }

func hasAttr(r slog.Record, key string) bool {
	found := false
	r.Attrs(func(a slog.Attr) bool {
		found = a.Key == key
		return !found
	})
	return found
}

var (
	componentRE = regexp.MustCompile(`^([a-z][a-z0-9-]{1,23})[ :]`)
	sandboxRE   = regexp.MustCompile(`\bsbx-[0-9a-f]{16}\b`)
	operationRE = regexp.MustCompile(`\bop-[0-9a-f]{16}\b`)
)

// Logf adapts l to the printf-style func(format, args...) that the
// packages' Options take, so every such line becomes a record: the
// formatted text is msg; the first word (e.g. "reaper", "egress",
// "sandbox") is component; the first sandbox and operation ids in it are
// sandbox and operation; a line with a non-nil error argument is logged
// at warn with that error as error, every other line at info.
func Logf(l *slog.Logger) func(string, ...any) {
	return func(format string, args ...any) {
		level := slog.LevelInfo
		var errArg error
		for _, a := range args {
			if e, ok := a.(error); ok && e != nil {
				level, errArg = slog.LevelWarn, e
				break
			}
		}
		ctx := context.Background()
		if !l.Enabled(ctx, level) {
			return
		}
		msg := fmt.Sprintf(format, args...)
		r := slog.NewRecord(time.Now(), level, msg, 0)
		if m := componentRE.FindStringSubmatch(msg); m != nil {
			r.AddAttrs(slog.String("component", m[1]))
		}
		if id := sandboxRE.FindString(msg); id != "" {
			r.AddAttrs(slog.String("sandbox", id))
		}
		if id := operationRE.FindString(msg); id != "" {
			r.AddAttrs(slog.String("operation", id))
		}
		if errArg != nil {
			r.AddAttrs(slog.String("error", errArg.Error()))
		}
		_ = l.Handler().Handle(ctx, r)
	}
}

// FromLogf returns a logger that renders each record as one line, msg
// then key=value attributes, and hands it to logf: the default of
// packages given only a Logf (tests pass t.Logf). nil logf discards.
func FromLogf(logf func(string, ...any)) *slog.Logger {
	if logf == nil {
		return Discard()
	}
	return slog.New(WithRequestIDs(&logfHandler{logf: logf}))
}

// Discard returns a logger that drops everything.
func Discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

type logfHandler struct {
	logf  func(string, ...any)
	attrs []slog.Attr
	group string
}

func (h *logfHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *logfHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	if r.Level != slog.LevelInfo {
		b.WriteString(r.Level.String())
		b.WriteByte(' ')
	}
	b.WriteString(r.Message)
	write := func(a slog.Attr) bool {
		if a.Equal(slog.Attr{}) {
			return true
		}
		b.WriteByte(' ')
		if h.group != "" {
			b.WriteString(h.group + ".")
		}
		fmt.Fprintf(&b, "%s=%v", a.Key, a.Value.Resolve())
		return true
	}
	for _, a := range h.attrs {
		write(a)
	}
	r.Attrs(write)
	h.logf("%s", b.String())
	return nil
}

func (h *logfHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &c
}

func (h *logfHandler) WithGroup(name string) slog.Handler {
	c := *h
	if c.group != "" {
		name = c.group + "." + name
	}
	c.group = name
	return &c
}
