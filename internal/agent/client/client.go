// Package client is the host side of the agent protocol: an HTTP/1.1 client
// over a stream dialer (unix socket, vsock, virtio-serial). Everything the
// agent sends is treated as untrusted: response sizes are bounded and event
// frames are validated.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/agent"
)

// Bounds on what is read from the agent.
const (
	maxJSONResponse  = 4 << 20
	maxErrorResponse = 64 << 10
	maxErrorMessage  = 1024
)

// Dialer opens one connection to the agent.
type Dialer func(ctx context.Context) (net.Conn, error)

// Client talks to one agent. It is safe for concurrent use.
type Client struct {
	hc   *http.Client
	tr   *http.Transport
	dial Dialer
	// user is who file calls act as; "" = the agent's default user.
	user string
	// readers are event streams' buffers, reused (newEventReader);
	// shared with the clients As makes.
	readers *sync.Pool
}

// New returns a client that dials the agent with dial and keeps idle
// connections for reuse.
func New(dial Dialer) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx)
		},
		MaxIdleConns:           32,
		MaxIdleConnsPerHost:    32,
		IdleConnTimeout:        90 * time.Second,
		DisableCompression:     true,
		MaxResponseHeaderBytes: 64 << 10,
		ForceAttemptHTTP2:      false,
		// Large buffers: output streams and file transfers dominate.
		WriteBufferSize: 64 << 10,
		ReadBufferSize:  64 << 10,
	}
	return &Client{tr: tr, hc: &http.Client{Transport: tr}, dial: dial, readers: &sync.Pool{}}
}

// As returns a client for the same agent (and connections) whose file
// calls act as user, a name or numeric uid inside the sandbox: with that
// user's permissions, and what they create belongs to that user. "" means
// the agent's default user (the sandbox's: the template's user, else
// root). Commands are unaffected; their user is ProcessSpec.User.
func (c *Client) As(user string) *Client {
	cp := *c
	cp.user = user
	return &cp
}

// Close drops idle connections. Requests in flight are not affected.
func (c *Client) Close() error {
	c.tr.CloseIdleConnections()
	return nil
}

// Error is an error response from the agent.
type Error struct {
	Status  int    // HTTP status
	Code    string // snake_case code, e.g. "not_found"
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("agent: %s: %s (HTTP %d)", e.Code, e.Message, e.Status)
}

func statusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// IsNotFound reports whether the agent answered 404 (no such process, file
// or route).
func IsNotFound(err error) bool { return statusOf(err) == http.StatusNotFound }

// IsBadRequest reports whether the agent refused the request as invalid.
func IsBadRequest(err error) bool { return statusOf(err) == http.StatusBadRequest }

// IsConflict reports whether the request conflicts with the current state
// (process not running, stdin closed, file exists, ...).
func IsConflict(err error) bool { return statusOf(err) == http.StatusConflict }

// IsGone reports whether requested events were dropped from retention.
func IsGone(err error) bool { return statusOf(err) == http.StatusGone }

// IsTooLarge reports whether a request body exceeded the agent's limit.
func IsTooLarge(err error) bool { return statusOf(err) == http.StatusRequestEntityTooLarge }

// IsTooManyProcesses reports whether the process limit was reached.
func IsTooManyProcesses(err error) bool { return statusOf(err) == http.StatusTooManyRequests }

// IsPermissionDenied reports whether the agent was not allowed to act.
func IsPermissionDenied(err error) bool { return statusOf(err) == http.StatusForbidden }

// HasCode reports whether err is an agent error with the given code.
func HasCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// do sends a request and returns the response if its status is one of ok;
// otherwise it returns the agent's error.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader, contentType string, ok ...int) (*http.Response, error) {
	return c.send(ctx, method, path, q, body, contentType, "", ok...)
}

// send is do with an Accept header (if not "").
func (c *Client) send(ctx context.Context, method, path string, q url.Values, body io.Reader, contentType, accept string, ok ...int) (*http.Response, error) {
	u := "http://agent" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("agent: %s %s: %w", method, path, err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("agent: %s %s: %w", method, path, err)
	}
	for _, s := range ok {
		if resp.StatusCode == s {
			return resp, nil
		}
	}
	defer resp.Body.Close()
	return nil, readError(resp)
}

func readError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorResponse))
	var body agent.ErrorBody
	e := &Error{Status: resp.StatusCode}
	if json.Unmarshal(data, &body) == nil && body.Error.Code != "" {
		e.Code, e.Message = body.Error.Code, body.Error.Message
	} else {
		e.Code, e.Message = "http_"+strconv.Itoa(resp.StatusCode), string(data)
	}
	e.Code = sanitize(e.Code, 64)
	e.Message = sanitize(e.Message, maxErrorMessage)
	return e
}

// sanitize bounds an untrusted string and strips control characters, so it
// is safe to log and to put in the host's own error messages.
func sanitize(s string, n int) string {
	if len(s) > n {
		s = s[:n]
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
}

// doJSON sends in (if not nil) as JSON and decodes the response into out
// (if not nil).
func (c *Client) doJSON(ctx context.Context, method, path string, q url.Values, in, out any, ok ...int) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("agent: encoding %s %s: %w", method, path, err)
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, method, path, q, body, ct, ok...)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorResponse))
		return nil
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxJSONResponse+1))
	if err != nil {
		return fmt.Errorf("agent: reading %s %s: %w", method, path, err)
	}
	if len(data) > maxJSONResponse {
		return fmt.Errorf("agent: %s %s: response larger than %d bytes", method, path, maxJSONResponse)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("agent: decoding %s %s: %w", method, path, err)
	}
	return nil
}

// Health checks that the agent answers.
func (c *Client) Health(ctx context.Context) error {
	var h agent.Health
	if err := c.doJSON(ctx, http.MethodGet, "/health", nil, nil, &h, http.StatusOK); err != nil {
		return err
	}
	if !h.OK {
		return errors.New("agent: health: not ok")
	}
	return nil
}

// SetConfig replaces the defaults applied to later commands.
func (c *Client) SetConfig(ctx context.Context, cfg agent.Config) error {
	return c.doJSON(ctx, http.MethodPut, "/v1/config", nil, cfg, nil, http.StatusNoContent)
}

// Start starts a command. Follow its output with Events(ctx, info.ID, 0).
func (c *Client) Start(ctx context.Context, spec agent.ProcessSpec) (agent.ProcessInfo, error) {
	var info agent.ProcessInfo
	err := c.doJSON(ctx, http.MethodPost, "/v1/processes", nil, spec, &info, http.StatusCreated)
	return info, err
}

// List returns running and recently exited processes.
func (c *Client) List(ctx context.Context) ([]agent.ProcessInfo, error) {
	var l agent.ProcessList
	err := c.doJSON(ctx, http.MethodGet, "/v1/processes", nil, nil, &l, http.StatusOK)
	return l.Processes, err
}

func processPath(id string, rest string) string {
	return "/v1/processes/" + url.PathEscape(id) + rest
}

// Get describes one process.
func (c *Client) Get(ctx context.Context, id string) (agent.ProcessInfo, error) {
	var info agent.ProcessInfo
	err := c.doJSON(ctx, http.MethodGet, processPath(id, ""), nil, nil, &info, http.StatusOK)
	return info, err
}

// WriteStdin writes data to the process's stdin; it blocks while the
// command does not read. Chunks larger than agent.MaxStdinChunk are split.
func (c *Client) WriteStdin(ctx context.Context, id string, data []byte) error {
	for {
		chunk := data[:min(len(data), agent.MaxStdinChunk)]
		resp, err := c.do(ctx, http.MethodPost, processPath(id, "/stdin"), nil, bytes.NewReader(chunk), "application/octet-stream", http.StatusNoContent)
		if err != nil {
			return err
		}
		resp.Body.Close()
		data = data[len(chunk):]
		if len(data) == 0 {
			return nil
		}
	}
}

// CloseStdin closes the process's stdin (on a PTY: sends the EOF character).
func (c *Client) CloseStdin(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodPost, processPath(id, "/stdin/close"), nil, nil, nil, http.StatusNoContent)
}

// Signal sends a signal ("SIGTERM", "TERM" or "15") to the process group.
func (c *Client) Signal(ctx context.Context, id string, sig string) error {
	raw, err := json.Marshal(sig)
	if err != nil {
		return fmt.Errorf("agent: signal: %w", err)
	}
	return c.doJSON(ctx, http.MethodPost, processPath(id, "/signal"), nil, agent.SignalRequest{Signal: raw}, nil, http.StatusNoContent)
}

// Resize changes a PTY process's terminal size.
func (c *Client) Resize(ctx context.Context, id string, cols, rows uint16) error {
	return c.doJSON(ctx, http.MethodPost, processPath(id, "/resize"), nil, agent.ResizeRequest{Cols: cols, Rows: rows}, nil, http.StatusNoContent)
}

// pathQuery is the query of a file call on path.
func (c *Client) pathQuery(path string) url.Values {
	q := c.userQuery()
	q.Set("path", path)
	return q
}

// userQuery names the user file calls act as.
func (c *Client) userQuery() url.Values {
	q := url.Values{}
	if c.user != "" {
		q.Set("user", c.user)
	}
	return q
}

// Download opens a file in the sandbox. size is -1 when the agent does not
// know it (procfs-like files). The caller closes the reader; a file cut
// short reads as io.ErrUnexpectedEOF.
func (c *Client) Download(ctx context.Context, path string) (io.ReadCloser, int64, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/files", c.pathQuery(path), nil, "", http.StatusOK)
	if err != nil {
		return nil, 0, err
	}
	return resp.Body, resp.ContentLength, nil
}

// Upload writes r to a file in the sandbox atomically (temporary file and
// rename), creating parent directories, as the client's user (As): new
// files and directories belong to that user.
func (c *Client) Upload(ctx context.Context, path string, mode os.FileMode, r io.Reader) error {
	q := c.pathQuery(path)
	// Both spellings of the special bits are accepted: os.ModeSetuid and
	// friends, and raw unix bits as in os.FileMode(0o4755).
	bits := uint32(mode & 0o7777)
	if mode&os.ModeSetuid != 0 {
		bits |= 0o4000
	}
	if mode&os.ModeSetgid != 0 {
		bits |= 0o2000
	}
	if mode&os.ModeSticky != 0 {
		bits |= 0o1000
	}
	q.Set("mode", strconv.FormatUint(uint64(bits), 8))
	resp, err := c.do(ctx, http.MethodPut, "/v1/files", q, r, "application/octet-stream", http.StatusNoContent, http.StatusCreated)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// ListDir lists a directory (not recursively). The agent caps listings;
// ListDirTruncated says whether entries were left out.
func (c *Client) ListDir(ctx context.Context, path string) ([]agent.FileInfo, error) {
	l, err := c.ListDirTruncated(ctx, path)
	return l.Entries, err
}

// ListDirTruncated is ListDir that also says whether the agent left entries out.
func (c *Client) ListDirTruncated(ctx context.Context, path string) (agent.FileList, error) {
	var l agent.FileList
	err := c.doJSON(ctx, http.MethodGet, "/v1/files/list", c.pathQuery(path), nil, &l, http.StatusOK)
	return l, err
}

// Stat describes a file without following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (agent.FileInfo, error) {
	var fi agent.FileInfo
	err := c.doJSON(ctx, http.MethodGet, "/v1/files/stat", c.pathQuery(path), nil, &fi, http.StatusOK)
	return fi, err
}

// Mkdir creates a directory and its parents.
func (c *Client) Mkdir(ctx context.Context, path string) error {
	return c.doJSON(ctx, http.MethodPost, "/v1/files/mkdir", c.userQuery(), agent.MkdirRequest{Path: path}, nil, http.StatusNoContent)
}

// Move renames from to to.
func (c *Client) Move(ctx context.Context, from, to string) error {
	return c.doJSON(ctx, http.MethodPost, "/v1/files/move", c.userQuery(), agent.MoveRequest{From: from, To: to}, nil, http.StatusNoContent)
}

// Remove deletes a file or an empty directory, or a whole tree when
// recursive is set.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	q := c.pathQuery(path)
	if recursive {
		q.Set("recursive", "true")
	}
	return c.doJSON(ctx, http.MethodDelete, "/v1/files", q, nil, nil, http.StatusNoContent)
}
