package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client talks to the control API. It is safe for concurrent use.
type Client struct {
	base string
	r    requester
	opts []Option // passed on to SandboxConns
}

// New returns a client for the control API at baseURL (e.g.
// "http://127.0.0.1:7070") authenticated with apiKey.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), r: newRequester(opts), opts: opts}
	c.r.auth = func(h http.Header) {
		if apiKey != "" {
			h.Set("X-API-Key", apiKey)
		}
	}
	return c
}

// route fills the %s of pattern with escaped ids. Empty and dot ids are
// refused: they would silently address another resource.
func route(base, pattern string, ids ...string) (string, error) {
	args := make([]any, len(ids))
	for i, id := range ids {
		if id == "" || id == "." || id == ".." {
			return "", fmt.Errorf("space: invalid id %q", id)
		}
		args[i] = url.PathEscape(id)
	}
	return base + fmt.Sprintf(pattern, args...), nil
}

func idemHeader(key string) http.Header {
	if key == "" {
		return nil
	}
	return http.Header{"Idempotency-Key": {key}}
}

// Health checks GET /healthz.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.r.do(ctx, request{method: http.MethodGet, url: c.base + "/healthz"})
	return err
}

// CreateSandbox starts creating a sandbox. The answer comes at once; the
// sandbox is usable when Operation has succeeded (see WaitOperation). With
// an idempotency key, repeating the call returns the first operation.
func (c *Client) CreateSandbox(ctx context.Context, req CreateRequest, idemKey string) (CreateResult, error) {
	var res CreateResult
	_, err := c.r.do(ctx, request{method: http.MethodPost, url: c.base + "/v1/sandboxes",
		header: idemHeader(idemKey), json: req, out: &res})
	res.Session.SandboxID = res.Sandbox.ID
	return res, err
}

// GetSandbox returns one sandbox.
func (c *Client) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	u, err := route(c.base, "/v1/sandboxes/%s", id)
	if err != nil {
		return sb, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodGet, url: u, out: &sb})
	return sb, err
}

// ListSandboxes returns one page of the project's sandboxes.
func (c *Client) ListSandboxes(ctx context.Context, o ListOptions) (SandboxPage, error) {
	q := url.Values{}
	if len(o.State) > 0 {
		q.Set("state", strings.Join(o.State, ","))
	}
	for k, v := range o.Metadata {
		q.Set("metadata."+k, v)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.PageToken != "" {
		q.Set("page_token", o.PageToken)
	}
	if o.AllProjects {
		q.Set("all_projects", "true")
	}
	u := c.base + "/v1/sandboxes"
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var page SandboxPage
	_, err := c.r.do(ctx, request{method: http.MethodGet, url: u, out: &page})
	return page, err
}

// AllSandboxes iterates over every page of ListSandboxes. After an error
// it yields that error once and stops.
func (c *Client) AllSandboxes(ctx context.Context, o ListOptions) iter.Seq2[Sandbox, error] {
	return func(yield func(Sandbox, error) bool) {
		for {
			page, err := c.ListSandboxes(ctx, o)
			if err != nil {
				yield(Sandbox{}, err)
				return
			}
			for _, sb := range page.Sandboxes {
				if !yield(sb, nil) {
					return
				}
			}
			if page.NextPageToken == "" || page.NextPageToken == o.PageToken {
				return
			}
			o.PageToken = page.NextPageToken
		}
	}
}

// DeleteSandbox starts deleting a sandbox.
func (c *Client) DeleteSandbox(ctx context.Context, id string) (Operation, error) {
	var res struct {
		Operation Operation `json:"operation"`
	}
	u, err := route(c.base, "/v1/sandboxes/%s", id)
	if err != nil {
		return Operation{}, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodDelete, url: u, out: &res})
	return res.Operation, err
}

// SetTimeout makes the server delete the sandbox d from now; 0 means never.
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) (Sandbox, error) {
	var sb Sandbox
	u, err := route(c.base, "/v1/sandboxes/%s/timeout", id)
	if err != nil {
		return sb, err
	}
	secs := int64((d + time.Second - 1) / time.Second)
	_, err = c.r.do(ctx, request{method: http.MethodPost, url: u,
		json: map[string]int64{"timeout_seconds": secs}, out: &sb})
	return sb, err
}

// NewSession asks for a fresh data-plane session token for a sandbox.
func (c *Client) NewSession(ctx context.Context, id string) (Session, error) {
	var s Session
	u, err := route(c.base, "/v1/sandboxes/%s/session", id)
	if err != nil {
		return s, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodPost, url: u, out: &s})
	s.SandboxID = id
	return s, err
}

// Connect returns a data-plane connection to a sandbox with a new session.
func (c *Client) Connect(ctx context.Context, id string) (*SandboxConn, error) {
	s, err := c.NewSession(ctx, id)
	if err != nil {
		return nil, err
	}
	return c.Sandbox(s), nil
}

// Sandbox returns a data-plane connection for a session, sharing this
// client's options (HTTP client, limits, retries).
func (c *Client) Sandbox(s Session) *SandboxConn {
	return NewSandboxConn(s, c.opts...)
}

// GetOperation returns an operation. With wait > 0 (at most 60 s) the
// server holds the answer until the operation is done or wait has passed.
func (c *Client) GetOperation(ctx context.Context, id string, wait time.Duration) (Operation, error) {
	var op Operation
	u, err := route(c.base, "/v1/operations/%s", id)
	if err != nil {
		return op, err
	}
	if wait > 0 {
		u += "?wait=" + url.QueryEscape(wait.String())
	}
	_, err = c.r.do(ctx, request{method: http.MethodGet, url: u, out: &op, wait: wait})
	return op, err
}

// WaitOperation long-polls until the operation is done. It returns
// *OperationError if the operation failed or was cancelled. Transient
// failures (network, 5xx) are retried a bounded number of times in a row.
func (c *Client) WaitOperation(ctx context.Context, id string) (Operation, error) {
	failures := 0
	for {
		op, err := c.GetOperation(ctx, id, 30*time.Second)
		if err != nil {
			failures++
			if !transient(ctx, err) || failures > c.r.retries {
				return op, err
			}
			if berr := backoff(ctx, failures, 0); berr != nil {
				return op, berr
			}
			continue
		}
		failures = 0
		if op.Done() {
			return op, opResult(op)
		}
	}
}

func opResult(op Operation) error {
	if op.State != OpSucceeded {
		return &OperationError{Operation: op}
	}
	return nil
}

// decodeOpEvent reads an operation from an event of
// /v1/operations/{id}/events: the first event carries the operation itself,
// later ones a lifecycle event whose data is the operation.
func decodeOpEvent(data []byte) (Operation, error) {
	var probe struct {
		Seq  *int64          `json:"seq"`
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return Operation{}, fmt.Errorf("decode operation event: %w", err)
	}
	if probe.Seq != nil && len(probe.Data) > 0 {
		data = probe.Data
	}
	var op Operation
	if err := json.Unmarshal(data, &op); err != nil {
		return Operation{}, fmt.Errorf("decode operation event: %w", err)
	}
	return op, nil
}

// WatchOperation follows an operation over server-sent events, calling fn
// for every change (the current state first), until it is done. It
// reconnects after a dropped connection and returns like WaitOperation.
func (c *Client) WatchOperation(ctx context.Context, id string, fn func(Operation)) (Operation, error) {
	u, err := route(c.base, "/v1/operations/%s/events", id)
	if err != nil {
		return Operation{}, err
	}
	var last Operation
	seen := false
	deliver := func(op Operation) {
		// The stream opens with the current state and may then replay
		// older history, and a reconnection repeats the current state:
		// report each change once, never going back in time.
		if seen && (op.UpdatedAt.Before(last.UpdatedAt) || last.Done() ||
			op.State == last.State && op.Progress == last.Progress &&
				op.Message == last.Message && op.UpdatedAt.Equal(last.UpdatedAt)) {
			return
		}
		last, seen = op, true
		if fn != nil {
			fn(op)
		}
	}
	err = c.r.follow(ctx, u, "", func(ev sseEvent) (bool, error) {
		if ev.Type != "operation.updated" {
			return false, nil
		}
		op, err := decodeOpEvent(ev.Data)
		if err != nil {
			return false, err
		}
		if op.ID != id {
			return false, nil
		}
		deliver(op)
		return op.Done(), nil
	}, func(ctx context.Context) (bool, error) {
		op, err := c.GetOperation(ctx, id, 0)
		if err != nil {
			return false, err
		}
		if op.Done() {
			deliver(op)
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return last, err
	}
	return last, opResult(last)
}

// WatchEvents follows the project's lifecycle events after seq (0: from the
// start of the retained history) until fn returns an error or ctx ends.
// Returning ErrStopWatching from fn ends it with a nil error.
func (c *Client) WatchEvents(ctx context.Context, after int64, fn func(LifecycleEvent) error) error {
	last := ""
	if after > 0 {
		last = strconv.FormatInt(after, 10)
	}
	err := c.r.follow(ctx, c.base+"/v1/events", last, func(ev sseEvent) (bool, error) {
		var le LifecycleEvent
		if err := json.Unmarshal(ev.Data, &le); err != nil {
			return false, fmt.Errorf("decode lifecycle event: %w", err)
		}
		if err := fn(le); err != nil {
			return false, err
		}
		return false, nil
	}, nil)
	if errors.Is(err, ErrStopWatching) {
		return nil
	}
	return err
}

// ErrStopWatching, returned by a WatchEvents callback, ends the watch cleanly.
var ErrStopWatching = errors.New("stop watching")

// ListTemplates returns the templates built on the server.
func (c *Client) ListTemplates(ctx context.Context) ([]TemplateInfo, error) {
	var res struct {
		Templates []TemplateInfo `json:"templates"`
	}
	_, err := c.r.do(ctx, request{method: http.MethodGet, url: c.base + "/v1/templates", out: &res})
	return res.Templates, err
}

// GetTemplate returns one template.
func (c *Client) GetTemplate(ctx context.Context, name string) (TemplateInfo, error) {
	var t TemplateInfo
	u, err := route(c.base, "/v1/templates/%s", name)
	if err != nil {
		return t, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodGet, url: u, out: &t})
	return t, err
}

// BuildTemplate starts a template build ("busybox" or "debian" sources).
func (c *Client) BuildTemplate(ctx context.Context, req TemplateBuildRequest, idemKey string) (Operation, error) {
	var res struct {
		Operation Operation `json:"operation"`
	}
	_, err := c.r.do(ctx, request{method: http.MethodPost, url: c.base + "/v1/templates",
		header: idemHeader(idemKey), json: req, out: &res})
	return res.Operation, err
}

// UploadTemplate starts a template build from a docker-archive or
// OCI-layout tarball (plain or gzip) read from archive.
func (c *Client) UploadTemplate(ctx context.Context, name string, archive io.Reader, idemKey string) (Operation, error) {
	var res struct {
		Operation Operation `json:"operation"`
	}
	h := idemHeader(idemKey)
	if h == nil {
		h = http.Header{}
	}
	h.Set("Content-Type", "application/x-tar")
	_, err := c.r.do(ctx, request{method: http.MethodPost, url: c.base + "/v1/templates/upload?name=" + url.QueryEscape(name),
		header: h, body: archive, out: &res, noTimeout: true})
	return res.Operation, err
}

// ListKeys returns the project's API keys (without secrets).
func (c *Client) ListKeys(ctx context.Context) ([]APIKey, error) {
	var res struct {
		Keys []APIKey `json:"keys"`
	}
	_, err := c.r.do(ctx, request{method: http.MethodGet, url: c.base + "/v1/keys", out: &res})
	return res.Keys, err
}

// CreateKey makes a new API key in the caller's project. The secret is
// returned only here.
func (c *Client) CreateKey(ctx context.Context, name string) (APIKey, string, error) {
	var res struct {
		Key    APIKey `json:"key"`
		Secret string `json:"secret"`
	}
	_, err := c.r.do(ctx, request{method: http.MethodPost, url: c.base + "/v1/keys",
		json: map[string]string{"name": name}, out: &res})
	return res.Key, res.Secret, err
}

// RevokeKey revokes an API key.
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	u, err := route(c.base, "/v1/keys/%s", id)
	if err != nil {
		return err
	}
	_, err = c.r.do(ctx, request{method: http.MethodDelete, url: u})
	return err
}
