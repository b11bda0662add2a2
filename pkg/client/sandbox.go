package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// maxStdinChunk is the data plane's limit on one stdin request.
const maxStdinChunk = 1 << 20

// SandboxConn is a data-plane connection to one sandbox, authenticated by
// a session token. It is safe for concurrent use.
type SandboxConn struct {
	s    Session
	base string // <data_url>/v1/sandboxes/<id>
	r    requester
	err  error  // set when the session cannot be used
	user string // file calls act as this user (AsUser); "" the default
}

// AsUser returns a connection whose file calls (Upload, Download, ListDir,
// Stat, Mkdir, Move, Remove) act as user inside the sandbox: a name from
// its /etc/passwd or a numeric uid. They get that user's permissions and
// what they create belongs to it. "" is the sandbox's default user.
func (c *SandboxConn) AsUser(user string) *SandboxConn {
	cp := *c
	cp.user = user
	return &cp
}

// NewSandboxConn returns a data-plane connection for a session obtained
// from the control API (CreateSandbox or NewSession).
func NewSandboxConn(s Session, opts ...Option) *SandboxConn {
	c := &SandboxConn{s: s, r: newRequester(opts)}
	switch {
	case s.SandboxID == "":
		c.err = errors.New("space: session has no sandbox id")
	case s.DataURL == "":
		c.err = errors.New("space: session has no data_url")
	case s.Token == "":
		c.err = errors.New("space: session has no token")
	}
	if c.err == nil {
		c.base, c.err = route(strings.TrimRight(s.DataURL, "/"), "/v1/sandboxes/%s", s.SandboxID)
	}
	tok := s.Token
	c.r.auth = func(h http.Header) { h.Set("Authorization", "Bearer "+tok) }
	return c
}

// Session returns the session this connection uses.
func (c *SandboxConn) Session() Session { return c.s }

func (c *SandboxConn) url(pattern string, ids ...string) (string, error) {
	if c.err != nil {
		return "", c.err
	}
	return route(c.base, pattern, ids...)
}

func (c *SandboxConn) fileURL(suffix, path string, extra url.Values) (string, error) {
	if c.err != nil {
		return "", c.err
	}
	q := url.Values{"path": {path}}
	for k, v := range extra {
		q[k] = v
	}
	if c.user != "" {
		q.Set("user", c.user)
	}
	return c.base + "/files" + suffix + "?" + q.Encode(), nil
}

// Exec starts a command and returns at once; follow its output with Stream.
func (c *SandboxConn) Exec(ctx context.Context, req ExecRequest) (Command, error) {
	var cmd Command
	u, err := c.url("/commands")
	if err != nil {
		return cmd, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodPost, url: u, json: req.spec(), out: &cmd})
	return cmd, err
}

// GetCommand returns a command's state.
func (c *SandboxConn) GetCommand(ctx context.Context, cmdID string) (Command, error) {
	var cmd Command
	u, err := c.url("/commands/%s", cmdID)
	if err != nil {
		return cmd, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodGet, url: u, out: &cmd})
	return cmd, err
}

// ListCommands returns the sandbox's commands, running and finished.
func (c *SandboxConn) ListCommands(ctx context.Context) ([]Command, error) {
	var res struct {
		Commands []Command `json:"commands"`
	}
	u, err := c.url("/commands")
	if err != nil {
		return nil, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodGet, url: u, out: &res})
	return res.Commands, err
}

// Stream follows a command's output after sequence number afterSeq (0: from
// the start), calling fn for each stdout/stderr chunk in order (and an
// EventDropped event where the server no longer kept some of it), and
// returns how the command exited. A dropped or silent connection is resumed with
// Last-Event-ID, a bounded number of times in a row, so no chunk is lost or
// delivered twice. An error from fn ends the stream with that error.
func (c *SandboxConn) Stream(ctx context.Context, cmdID string, afterSeq uint64, fn func(Event) error) (Exit, error) {
	return c.follow(ctx, &cmdStream{id: cmdID, last: afterSeq, fn: fn})
}

// follow reads st's command's events from after st.last to its exit.
func (c *SandboxConn) follow(ctx context.Context, st *cmdStream) (Exit, error) {
	u, err := c.url("/commands/%s/events", st.id)
	if err != nil {
		return Exit{}, err
	}
	// The server ends a finished command's stream after its exit event; a
	// stream that ends without one either was resumed past the exit or was
	// cut, which the command's state tells apart.
	atEOF := func(ctx context.Context) (bool, error) {
		cmd, err := c.GetCommand(ctx, st.id)
		if err != nil {
			return false, err
		}
		if !cmd.Running && cmd.Exit != nil && cmd.LastEventID <= st.last {
			st.exit = cmd.Exit
			return true, nil
		}
		return false, nil
	}
	lastID := ""
	if st.last > 0 {
		lastID = strconv.FormatUint(st.last, 10)
	}
	if err := c.r.follow(ctx, u, lastID, st.handle, atEOF); err != nil {
		return Exit{}, err
	}
	if st.exit == nil {
		return Exit{}, fmt.Errorf("command %s: stream ended without an exit", st.id)
	}
	return *st.exit, nil
}

// cmdStream is what following one command's events keeps across
// connections.
type cmdStream struct {
	id   string
	last uint64 // seq of the last event handled
	exit *Exit
	buf  []byte
	fn   func(Event) error
}

func (st *cmdStream) handle(ev sseEvent) (bool, error) {
	seq, err := strconv.ParseUint(ev.ID, 10, 64)
	if err != nil {
		return false, fmt.Errorf("command %s: event without a sequence number (id %.32q)", st.id, ev.ID)
	}
	if seq <= st.last {
		return false, nil // already delivered before a reconnection
	}
	switch ev.Type {
	case EventStdout, EventStderr:
		n := base64.StdEncoding.DecodedLen(len(ev.Data))
		if cap(st.buf) < n {
			st.buf = make([]byte, n)
		}
		n, err := base64.StdEncoding.Decode(st.buf[:n], ev.Data)
		if err != nil {
			return false, fmt.Errorf("command %s: event %d: bad base64: %w", st.id, seq, err)
		}
		st.last = seq
		if st.fn != nil {
			if err := st.fn(Event{Seq: seq, Type: ev.Type, Data: st.buf[:n]}); err != nil {
				return false, err
			}
		}
	case EventDropped:
		st.last = seq
		if st.fn != nil {
			if err := st.fn(Event{Seq: seq, Type: ev.Type, Data: ev.Data}); err != nil {
				return false, err
			}
		}
	case EventExit:
		var x Exit
		if err := json.Unmarshal(ev.Data, &x); err != nil {
			return false, fmt.Errorf("command %s: decode exit: %w", st.id, err)
		}
		st.last, st.exit = seq, &x
		return true, nil
	default:
		st.last = seq // an event type this client does not know
	}
	return false, nil
}

// ExecStream starts a command and follows its output on the same request,
// one round trip fewer than Exec and then Stream: fn sees the events as
// Stream's does, and the command and its exit are returned. If the
// connection drops before the exit, the rest is read as Stream reads it
// (resumed after the last event). Against a server that answers the start
// with JSON only, it is Exec and then Stream. An error from fn ends it with
// that error; the command keeps running.
func (c *SandboxConn) ExecStream(ctx context.Context, req ExecRequest, fn func(Event) error) (Command, Exit, error) {
	return c.ExecStreamStarted(ctx, req, nil, fn)
}

// ExecStreamStarted is ExecStream with started, if not nil, called once the
// command runs and before any of its events: a caller that forwards stdin
// or signals to the command learns its id there. An error from started
// ends it with that error; the command keeps running.
func (c *SandboxConn) ExecStreamStarted(ctx context.Context, req ExecRequest, started func(Command) error, fn func(Event) error) (Command, Exit, error) {
	var cmd Command
	u, err := c.url("/commands")
	if err != nil {
		return cmd, Exit{}, err
	}
	resp, err := c.r.do(ctx, request{method: http.MethodPost, url: u, json: req.spec(), stream: true,
		header: http.Header{"Accept": {"text/event-stream"}}})
	if err != nil {
		return cmd, Exit{}, err
	}
	defer resp.Body.Close()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		buf, err := readBounded(resp.Body, c.r.maxBody)
		if err == nil {
			err = json.Unmarshal(buf, &cmd)
		}
		if err != nil || cmd.ID == "" {
			return cmd, Exit{}, fmt.Errorf("POST %s: answer without a command (%v)", redact(u), err)
		}
		if started != nil {
			if err := started(cmd); err != nil {
				return cmd, Exit{}, err
			}
		}
		exit, err := c.Stream(ctx, cmd.ID, 0, fn)
		return cmd, exit, err
	}
	var body io.Reader = resp.Body
	if c.r.idle > 0 {
		t := time.AfterFunc(c.r.idle, func() { resp.Body.Close() })
		defer t.Stop()
		body = &idleReader{r: resp.Body, t: t, d: c.r.idle}
	}
	p := newSSEParser(body, maxSSEEvent)
	ev, err := p.next()
	if err != nil || ev.Type != "start" {
		return cmd, Exit{}, fmt.Errorf("POST %s: stream without a start event (%q, %v)", redact(u), ev.Type, err)
	}
	if err := json.Unmarshal(ev.Data, &cmd); err != nil || cmd.ID == "" {
		return cmd, Exit{}, fmt.Errorf("POST %s: bad start event: %v", redact(u), err)
	}
	if started != nil {
		if err := started(cmd); err != nil {
			return cmd, Exit{}, err
		}
	}
	st := &cmdStream{id: cmd.ID, fn: fn}
	for {
		ev, err := p.next()
		if err != nil {
			if ctx.Err() != nil {
				return cmd, Exit{}, ctx.Err()
			}
			if errors.Is(err, ErrEventTooLarge) {
				return cmd, Exit{}, err
			}
			break // cut: the rest as Stream reads it
		}
		stop, err := st.handle(ev)
		if err != nil {
			return cmd, Exit{}, err
		}
		if stop {
			// The server ends the answer after the exit event: reading to
			// its end hands the connection back for reuse.
			io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
			return cmd, *st.exit, nil
		}
	}
	exit, err := c.follow(ctx, st)
	return cmd, exit, err
}

// Run starts a command, copies its output to stdout and stderr (either may
// be nil to discard) and returns how it exited. A non-zero exit code is not
// an error; check Exit.Code.
func (c *SandboxConn) Run(ctx context.Context, req ExecRequest, stdout, stderr io.Writer) (Exit, error) {
	_, exit, err := c.ExecStream(ctx, req, func(ev Event) error {
		w := stdout
		switch ev.Type {
		case EventStderr:
			w = stderr
		case EventDropped:
			return nil // output the server no longer kept
		}
		if w == nil {
			return nil
		}
		if _, err := w.Write(ev.Data); err != nil {
			return fmt.Errorf("write %s: %w", ev.Type, err)
		}
		return nil
	})
	return exit, err
}

// WriteStdin sends data to a command started with Stdin (or a PTY).
func (c *SandboxConn) WriteStdin(ctx context.Context, cmdID string, data []byte) error {
	u, err := c.url("/commands/%s/stdin", cmdID)
	if err != nil {
		return err
	}
	for len(data) > 0 {
		n := min(len(data), maxStdinChunk)
		_, err := c.r.do(ctx, request{method: http.MethodPost, url: u,
			header: http.Header{"Content-Type": {"application/octet-stream"}},
			body:   bytes.NewReader(data[:n])})
		if err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// CloseStdin closes a command's stdin (the command reads EOF).
func (c *SandboxConn) CloseStdin(ctx context.Context, cmdID string) error {
	u, err := c.url("/commands/%s/stdin/close", cmdID)
	if err != nil {
		return err
	}
	_, err = c.r.do(ctx, request{method: http.MethodPost, url: u})
	return err
}

// StdinWriter returns a writer whose writes go to the command's stdin and
// whose Close closes it.
func (c *SandboxConn) StdinWriter(ctx context.Context, cmdID string) io.WriteCloser {
	return &stdinWriter{ctx: ctx, c: c, id: cmdID}
}

type stdinWriter struct {
	ctx context.Context
	c   *SandboxConn
	id  string
}

func (w *stdinWriter) Write(p []byte) (int, error) {
	if err := w.c.WriteStdin(w.ctx, w.id, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *stdinWriter) Close() error { return w.c.CloseStdin(w.ctx, w.id) }

// Signal sends a signal ("SIGTERM", "TERM" or "15") to a command.
func (c *SandboxConn) Signal(ctx context.Context, cmdID, sig string) error {
	u, err := c.url("/commands/%s/signal", cmdID)
	if err != nil {
		return err
	}
	_, err = c.r.do(ctx, request{method: http.MethodPost, url: u, json: map[string]string{"signal": sig}})
	return err
}

// Resize changes the terminal size of a command started with a PTY.
func (c *SandboxConn) Resize(ctx context.Context, cmdID string, cols, rows uint16) error {
	u, err := c.url("/commands/%s/resize", cmdID)
	if err != nil {
		return err
	}
	_, err = c.r.do(ctx, request{method: http.MethodPost, url: u, json: PTY{Cols: cols, Rows: rows}})
	return err
}

// Upload writes r to path in the sandbox, replacing the file; mode 0 means
// 0644. It is bounded by ctx only, not by the request timeout.
func (c *SandboxConn) Upload(ctx context.Context, path string, mode os.FileMode, r io.Reader) error {
	extra := url.Values{}
	if mode != 0 {
		extra.Set("mode", fmt.Sprintf("%04o", uint32(mode.Perm())|unixSpecial(mode)))
	}
	u, err := c.fileURL("", path, extra)
	if err != nil {
		return err
	}
	if r == nil {
		r = strings.NewReader("")
	}
	_, err = c.r.do(ctx, request{method: http.MethodPut, url: u, body: r, noTimeout: true,
		header: http.Header{"Content-Type": {"application/octet-stream"}}})
	return err
}

// unixSpecial maps Go's setuid/setgid/sticky mode bits to their octal values.
func unixSpecial(m os.FileMode) uint32 {
	var v uint32
	if m&os.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		v |= 0o1000
	}
	return v
}

// Download opens a file of the sandbox for reading; close it when done. It
// is bounded by ctx only, not by the request timeout.
func (c *SandboxConn) Download(ctx context.Context, path string) (io.ReadCloser, error) {
	u, err := c.fileURL("", path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.r.do(ctx, request{method: http.MethodGet, url: u, stream: true,
		header: http.Header{"Accept": {"application/octet-stream"}}})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ListDir lists a directory of the sandbox.
func (c *SandboxConn) ListDir(ctx context.Context, path string) ([]FileInfo, error) {
	var res struct {
		Entries []FileInfo `json:"entries"`
	}
	u, err := c.fileURL("/list", path, nil)
	if err != nil {
		return nil, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodGet, url: u, out: &res})
	return res.Entries, err
}

// Stat describes one file of the sandbox.
func (c *SandboxConn) Stat(ctx context.Context, path string) (FileInfo, error) {
	var fi FileInfo
	u, err := c.fileURL("/stat", path, nil)
	if err != nil {
		return fi, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodGet, url: u, out: &fi})
	return fi, err
}

// Mkdir creates a directory and its parents (mkdir -p).
func (c *SandboxConn) Mkdir(ctx context.Context, path string) error {
	u, err := c.url("/files/mkdir")
	if err != nil {
		return err
	}
	if c.user != "" {
		u += "?" + url.Values{"user": {c.user}}.Encode()
	}
	_, err = c.r.do(ctx, request{method: http.MethodPost, url: u, json: map[string]string{"path": path}})
	return err
}

// Move renames a file or directory.
func (c *SandboxConn) Move(ctx context.Context, from, to string) error {
	u, err := c.url("/files/move")
	if err != nil {
		return err
	}
	if c.user != "" {
		u += "?" + url.Values{"user": {c.user}}.Encode()
	}
	_, err = c.r.do(ctx, request{method: http.MethodPost, url: u, json: map[string]string{"from": from, "to": to}})
	return err
}

// Remove deletes a file, or a directory tree when recursive.
func (c *SandboxConn) Remove(ctx context.Context, path string, recursive bool) error {
	var extra url.Values
	if recursive {
		extra = url.Values{"recursive": {"true"}}
	}
	u, err := c.fileURL("", path, extra)
	if err != nil {
		return err
	}
	_, err = c.r.do(ctx, request{method: http.MethodDelete, url: u})
	return err
}
