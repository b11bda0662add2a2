package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/httpx"
)

// Client is a plain net/http client of the control API and the data plane,
// doing what an application would: JSON requests, long-polled operations and
// SSE command output, over kept-alive loopback connections.
type Client struct {
	base string // control API, e.g. http://127.0.0.1:7070
	key  string
	hc   *http.Client
	// readers are the 256 KiB stream readers of finished commands: the
	// benchmark's client runs in the server's process, and a new one per
	// command would be the largest allocation of an exec and make the
	// server collect garbage on the client's behalf.
	readers sync.Pool
}

// streamReader is a pooled 256 KiB reader of r; putReader returns it.
func (c *Client) streamReader(r io.Reader) *bufio.Reader {
	if br, ok := c.readers.Get().(*bufio.Reader); ok {
		br.Reset(r)
		return br
	}
	return bufio.NewReaderSize(r, 256<<10)
}

func (c *Client) putReader(br *bufio.Reader) {
	br.Reset(nil)
	c.readers.Put(br)
}

// NewClient returns a client of the control API at base (http://host:port).
func NewClient(base, apiKey string) *Client {
	tr := &http.Transport{
		Proxy:               nil, // loopback only; never an environment proxy
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &Client{base: strings.TrimRight(base, "/"), key: apiKey, hc: &http.Client{Transport: tr}}
}

// Close drops idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Sandbox is what a create returns: the id and the data-connection grant.
type Sandbox struct {
	ID      string
	Token   string
	DataURL string
	// CreateOp is how long the server's create operation took by its own
	// clock (updated_at − created_at): the client's latency minus HTTP,
	// request handling before the operation exists, and the long-poll.
	CreateOp time.Duration
}

// APIError is an error answer of the server.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("HTTP %d %s: %s", e.Status, e.Code, e.Message)
}

type operation struct {
	ID        string          `json:"id"`
	State     string          `json:"state"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	Result    json.RawMessage `json:"result"`
	Error     *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (o operation) done() bool {
	return o.State == "succeeded" || o.State == "failed" || o.State == "cancelled"
}

func (o operation) err() error {
	if o.State == "succeeded" {
		return nil
	}
	if o.Error != nil {
		return fmt.Errorf("operation %s %s: %s: %s", o.ID, o.State, o.Error.Code, o.Error.Message)
	}
	return fmt.Errorf("operation %s %s", o.ID, o.State)
}

// do sends one request and decodes a JSON answer into out (if non-nil).
func (c *Client) do(ctx context.Context, method, u, auth string, body any, want int, out any) error {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+auth)
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, u, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, u, err)
	}
	if resp.StatusCode != want {
		code, msg := httpx.ErrorEnvelope(raw)
		return fmt.Errorf("%s %s: %w", method, u, &APIError{Status: resp.StatusCode, Code: code, Message: msg})
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("%s %s: decode answer: %w", method, u, err)
		}
	}
	return nil
}

// waitOp long-polls an operation until it is done and returns it.
func (c *Client) waitOp(ctx context.Context, id string) (operation, error) {
	for {
		var op operation
		if err := c.do(ctx, http.MethodGet, c.base+"/v1/operations/"+url.PathEscape(id)+"?wait=30s", c.key, nil, http.StatusOK, &op); err != nil {
			return op, err
		}
		if op.done() {
			return op, op.err()
		}
	}
}

// StartCreate posts a create and returns the sandbox and its operation id
// without waiting.
func (c *Client) StartCreate(ctx context.Context, template string) (Sandbox, string, error) {
	return c.startCreate(ctx, map[string]any{"template": template})
}

// startCreate posts a create body and returns the sandbox and its
// operation id without waiting.
func (c *Client) startCreate(ctx context.Context, body map[string]any) (Sandbox, string, error) {
	var ans sandboxAnswer
	if err := c.do(ctx, http.MethodPost, c.base+"/v1/sandboxes", c.key, body, http.StatusAccepted, &ans); err != nil {
		return Sandbox{}, "", err
	}
	sb := Sandbox{ID: ans.Sandbox.ID, Token: ans.Session.Token, DataURL: strings.TrimRight(ans.Session.DataURL, "/")}
	if sb.ID == "" || sb.Token == "" || sb.DataURL == "" || ans.Operation.ID == "" {
		return sb, "", errors.New("create answer lacks sandbox id, session or operation")
	}
	return sb, ans.Operation.ID, nil
}

// Create creates a sandbox and waits until its create operation succeeded.
// On failure the returned Sandbox still names the sandbox if one was made.
func (c *Client) Create(ctx context.Context, template string) (Sandbox, error) {
	sb, id, err := c.StartCreate(ctx, template)
	if err != nil {
		return sb, err
	}
	op, err := c.waitOp(ctx, id)
	sb.CreateOp = op.UpdatedAt.Sub(op.CreatedAt)
	return sb, err
}

// Delete deletes a sandbox and waits until the delete operation succeeded.
func (c *Client) Delete(ctx context.Context, id string) error {
	var ans struct {
		Operation operation `json:"operation"`
	}
	if err := c.do(ctx, http.MethodDelete, c.base+"/v1/sandboxes/"+url.PathEscape(id), c.key, nil, http.StatusAccepted, &ans); err != nil {
		return err
	}
	_, err := c.waitOp(ctx, ans.Operation.ID)
	return err
}

// List returns the ids of the project's sandboxes in the given states
// (e.g. "creating,running").
func (c *Client) List(ctx context.Context, states string) ([]string, error) {
	var ids []string
	after := ""
	for {
		q := url.Values{"state": {states}, "limit": {"1000"}}
		if after != "" {
			q.Set("page_token", after)
		}
		var ans struct {
			Sandboxes []struct {
				ID string `json:"id"`
			} `json:"sandboxes"`
			Next string `json:"next_page_token"`
		}
		if err := c.do(ctx, http.MethodGet, c.base+"/v1/sandboxes?"+q.Encode(), c.key, nil, http.StatusOK, &ans); err != nil {
			return ids, err
		}
		for _, s := range ans.Sandboxes {
			ids = append(ids, s.ID)
		}
		if ans.Next == "" {
			return ids, nil
		}
		after = ans.Next
	}
}

// ExecResult is the outcome of one command.
type ExecResult struct {
	ExitCode int
	Stdout   int64 // decoded stdout bytes
	Events   int   // stdout events
	Stderr   []byte
}

// Exec runs argv in the sandbox over the data plane: one POST that asks
// for the command's events as SSE on its own response (a "start" event,
// then output to the exit event), decoding base64 output. onStdout, if
// set, sees each decoded chunk (valid only during the call). A server that
// answers the POST with JSON only (older ones) is followed with a GET.
func (c *Client) Exec(ctx context.Context, sb Sandbox, argv []string, onStdout func([]byte)) (ExecResult, error) {
	body, err := json.Marshal(map[string]any{"argv": argv})
	if err != nil {
		return ExecResult{}, fmt.Errorf("encode command: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, commandsURL(sb), bytes.NewReader(body))
	if err != nil {
		return ExecResult{}, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.hc.Do(req)
	if err != nil {
		return ExecResult{}, fmt.Errorf("start command: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return ExecResult{}, fmt.Errorf("start command: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(raw))
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		var cmd struct {
			ID string `json:"id"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&cmd); err != nil || cmd.ID == "" {
			return ExecResult{}, fmt.Errorf("start command: answer without an id (%v)", err)
		}
		return c.Follow(ctx, sb, cmd.ID, onStdout)
	}
	return c.readEvents(resp.Body, onStdout)
}

func commandsURL(sb Sandbox) string {
	return sb.DataURL + "/v1/sandboxes/" + url.PathEscape(sb.ID) + "/commands"
}

// StartCommand starts argv and returns the command id.
func (c *Client) StartCommand(ctx context.Context, sb Sandbox, argv []string) (string, error) {
	var cmd struct {
		ID string `json:"id"`
	}
	if err := c.do(ctx, http.MethodPost, commandsURL(sb), sb.Token, map[string]any{"argv": argv}, http.StatusCreated, &cmd); err != nil {
		return "", err
	}
	if cmd.ID == "" {
		return "", errors.New("command answer lacks an id")
	}
	return cmd.ID, nil
}

// WaitCommand polls a command every interval until it is no longer running
// (without reading its output).
func (c *Client) WaitCommand(ctx context.Context, sb Sandbox, cid string, interval time.Duration) error {
	for {
		var v struct {
			Running bool `json:"running"`
		}
		if err := c.do(ctx, http.MethodGet, commandsURL(sb)+"/"+url.PathEscape(cid), sb.Token, nil, http.StatusOK, &v); err != nil {
			return err
		}
		if !v.Running {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// Follow reads a command's SSE stream from the start to its exit event.
func (c *Client) Follow(ctx context.Context, sb Sandbox, cid string, onStdout func([]byte)) (ExecResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, commandsURL(sb)+"/"+url.PathEscape(cid)+"/events", nil)
	if err != nil {
		return ExecResult{}, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.hc.Do(req)
	if err != nil {
		return ExecResult{}, fmt.Errorf("command events: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return ExecResult{}, fmt.Errorf("command events: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(raw))
	}
	return c.readEvents(resp.Body, onStdout)
}

// readEvents reads an SSE answer of command events to the exit event, then
// to the end of the answer so the connection goes back to the pool, as a
// long-lived client's would.
func (c *Client) readEvents(body io.Reader, onStdout func([]byte)) (ExecResult, error) {
	br := c.streamReader(body)
	res, err := readCommandEvents(br, onStdout)
	c.putReader(br)
	if err != nil {
		return res, err
	}
	_, _ = io.Copy(io.Discard, body)
	return res, nil
}

// FollowFrames reads a command's events as binary frames (Accept:
// application/x-space-events): no base64 on either side.
func (c *Client) FollowFrames(ctx context.Context, sb Sandbox, cid string) (ExecResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, commandsURL(sb)+"/"+url.PathEscape(cid)+"/events", nil)
	if err != nil {
		return ExecResult{}, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	req.Header.Set("Accept", "application/x-space-events")
	resp, err := c.hc.Do(req)
	if err != nil {
		return ExecResult{}, fmt.Errorf("command frames: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return ExecResult{}, fmt.Errorf("command frames: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(raw))
	}
	br := c.streamReader(resp.Body)
	defer c.putReader(br)
	var (
		res ExecResult
		hdr [13]byte
		buf []byte
	)
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return res, fmt.Errorf("command frames: %w", err)
		}
		n := binary.BigEndian.Uint32(hdr[9:13])
		if n > 1<<20 {
			return res, fmt.Errorf("command frames: frame of %d bytes", n)
		}
		if cap(buf) < int(n) {
			buf = make([]byte, n)
		}
		data := buf[:n]
		if _, err := io.ReadFull(br, data); err != nil {
			return res, fmt.Errorf("command frames: %w", err)
		}
		switch hdr[8] {
		case 1:
			res.Stdout += int64(n)
			res.Events++
		case 2:
			if len(res.Stderr) < 4096 {
				res.Stderr = append(res.Stderr, data...)
			}
		case 3:
			var x struct {
				Code int `json:"exit_code"`
			}
			if err := json.Unmarshal(data, &x); err != nil {
				return res, fmt.Errorf("command frames: exit: %w", err)
			}
			res.ExitCode = x.Code
			_, _ = io.Copy(io.Discard, resp.Body)
			return res, nil
		}
	}
}

// readCommandEvents parses a command's SSE stream until its exit event.
// br's size bounds the lines it reads without copying.
func readCommandEvents(br *bufio.Reader, onStdout func([]byte)) (ExecResult, error) {
	var (
		res     ExecResult
		event   string
		long    []byte // a line longer than the reader's buffer
		decoded []byte
	)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long, line...)
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return res, errors.New("command events: stream ended without an exit event")
			}
			return res, fmt.Errorf("command events: %w", err)
		}
		if long != nil {
			long = append(long, line...)
			line, long = long, nil
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			event = ""
		case line[0] == ':':
		case bytes.HasPrefix(line, []byte("event:")):
			event = string(bytes.TrimSpace(line[len("event:"):]))
		case bytes.HasPrefix(line, []byte("data:")):
			data := line[len("data:"):]
			if len(data) > 0 && data[0] == ' ' {
				data = data[1:]
			}
			switch event {
			case "stdout", "stderr":
				n := base64.StdEncoding.DecodedLen(len(data))
				if cap(decoded) < n {
					decoded = make([]byte, n)
				}
				n, err := base64.StdEncoding.Decode(decoded[:n], data)
				if err != nil {
					return res, fmt.Errorf("command events: bad base64 in %s event: %w", event, err)
				}
				if event == "stdout" {
					res.Stdout += int64(n)
					res.Events++
					if onStdout != nil {
						onStdout(decoded[:n])
					}
				} else if len(res.Stderr) < 4096 {
					res.Stderr = append(res.Stderr, decoded[:n]...)
				}
			case "exit":
				var ex struct {
					Code   int    `json:"exit_code"`
					Signal string `json:"signal"`
					Error  string `json:"error"`
				}
				if err := json.Unmarshal(data, &ex); err != nil {
					return res, fmt.Errorf("command events: bad exit event: %w", err)
				}
				res.ExitCode = ex.Code
				if ex.Error != "" || ex.Signal != "" {
					return res, fmt.Errorf("command failed: signal %q, error %q", ex.Signal, ex.Error)
				}
				return res, nil
			}
		}
	}
}

// SnapshotInfo is what a snapshot operation's result says about it.
type SnapshotInfo struct {
	ID    string `json:"id"`
	Kind  string `json:"kind"` // "process" (memory too) or "filesystem"
	Stats struct {
		CheckpointMS      float64 `json:"checkpoint_ms"`
		FrozenMS          float64 `json:"frozen_ms"`
		ProcessImageBytes int64   `json:"process_image_bytes"`
		BytesStored       int64   `json:"bytes_stored"`
	} `json:"stats"`
	// Op is the operation's duration by the server's clock.
	Op time.Duration `json:"-"`
}

// Snapshot takes a snapshot of a running sandbox (POST
// /v1/sandboxes/{id}/snapshots) and waits until its operation succeeded.
func (c *Client) Snapshot(ctx context.Context, id string) (SnapshotInfo, error) {
	var ans struct {
		Operation operation `json:"operation"`
	}
	if err := c.do(ctx, http.MethodPost, c.base+"/v1/sandboxes/"+url.PathEscape(id)+"/snapshots", c.key, nil, http.StatusAccepted, &ans); err != nil {
		return SnapshotInfo{}, err
	}
	op, err := c.waitOp(ctx, ans.Operation.ID)
	if err != nil {
		return SnapshotInfo{}, err
	}
	var info SnapshotInfo
	if err := json.Unmarshal(op.Result, &info); err != nil || info.ID == "" {
		return info, fmt.Errorf("snapshot operation %s: result %s: %v", op.ID, op.Result, err)
	}
	info.Op = op.UpdatedAt.Sub(op.CreatedAt)
	return info, nil
}

// sandboxAnswer is a create's answer, and one sandbox of a fork's.
type sandboxAnswer struct {
	Operation operation `json:"operation"`
	Sandbox   struct {
		ID string `json:"id"`
	} `json:"sandbox"`
	Session struct {
		Token   string `json:"token"`
		DataURL string `json:"data_url"`
	} `json:"session"`
}

// Fork starts one sandbox from a snapshot (POST /v1/snapshots/{id}/fork
// {"count":1}) and waits until it runs.
func (c *Client) Fork(ctx context.Context, snapshotID string) (Sandbox, error) {
	var ans struct {
		Sandboxes []sandboxAnswer `json:"sandboxes"`
	}
	if err := c.do(ctx, http.MethodPost, c.base+"/v1/snapshots/"+url.PathEscape(snapshotID)+"/fork", c.key, map[string]any{"count": 1}, http.StatusAccepted, &ans); err != nil {
		return Sandbox{}, err
	}
	if len(ans.Sandboxes) != 1 {
		return Sandbox{}, fmt.Errorf("fork of %s: %d sandboxes in the answer, want 1", snapshotID, len(ans.Sandboxes))
	}
	it := ans.Sandboxes[0]
	sb := Sandbox{ID: it.Sandbox.ID, Token: it.Session.Token, DataURL: strings.TrimRight(it.Session.DataURL, "/")}
	op, err := c.waitOp(ctx, it.Operation.ID)
	sb.CreateOp = op.UpdatedAt.Sub(op.CreatedAt)
	return sb, err
}
