// Package client is the Go SDK for SPACE. A Client talks to the control API
// (sandboxes, operations, templates, keys) with an API key; a SandboxConn
// talks to one sandbox's data plane (commands, their output, files) with the
// session token the control API hands out.
//
// Every lifecycle call answers at once with an Operation; WaitOperation
// long-polls and WatchOperation follows it as server-sent events. Command
// output streams resume after a dropped connection with Last-Event-ID, so
// no output is lost or repeated.
//
// Error answers are *APIError (status, code, message); errors.Is matches
// them against ErrNotFound, ErrConflict, ErrSandboxPaused, ErrUnauthorized
// and the other sentinels by code, then by status. An awaited operation that
// failed is *OperationError.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"
)

// APIError is an error answer of the control API or the data plane.
type APIError struct {
	Status  int    // HTTP status
	Code    string // machine-readable, e.g. "not_found", "token_expired"
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

// IsNotFound reports whether err is an API "not found" answer.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

// Defaults; see the options to change them.
const (
	DefaultMaxResponseBytes = 32 << 20
	DefaultRequestTimeout   = 2 * time.Minute
	DefaultStreamRetries    = 5
	DefaultIdleTimeout      = 60 * time.Second // the server sends a keep-alive every 15 s
	maxErrorBody            = 64 << 10
	maxSSEEvent             = 8 << 20
)

// Option configures a Client or a SandboxConn.
type Option func(*requester)

// WithHTTPClient sets the HTTP client. Leave its Timeout zero: streams are
// long-lived; per-call limits come from contexts and WithRequestTimeout.
func WithHTTPClient(hc *http.Client) Option { return func(r *requester) { r.hc = hc } }

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option { return func(r *requester) { r.ua = ua } }

// WithMaxResponseBytes bounds how much of a JSON answer is read.
func WithMaxResponseBytes(n int64) Option { return func(r *requester) { r.maxBody = n } }

// WithRequestTimeout bounds each non-streaming call (0: only the context
// bounds it). Long-polls get their wait on top; streams, uploads and
// downloads are bounded by their context alone.
func WithRequestTimeout(d time.Duration) Option { return func(r *requester) { r.timeout = d } }

// WithStreamRetries sets how many times in a row an event stream or a wait
// reconnects after a failure before giving up; progress resets the count.
func WithStreamRetries(n int) Option { return func(r *requester) { r.retries = n } }

// WithIdleTimeout sets how long an event stream may stay silent (no event,
// no keep-alive) before it is treated as dropped and reconnected.
func WithIdleTimeout(d time.Duration) Option { return func(r *requester) { r.idle = d } }

// requester holds what the control and data clients share: transport,
// limits and how to authenticate.
type requester struct {
	hc      *http.Client
	ua      string
	maxBody int64
	timeout time.Duration
	retries int
	idle    time.Duration
	auth    func(http.Header)
}

func newRequester(opts []Option) requester {
	r := requester{
		hc: &http.Client{}, ua: "space-go-client/0.1", maxBody: DefaultMaxResponseBytes,
		timeout: DefaultRequestTimeout, retries: DefaultStreamRetries, idle: DefaultIdleTimeout,
	}
	for _, o := range opts {
		o(&r)
	}
	if r.hc == nil {
		r.hc = &http.Client{}
	}
	return r
}

// request is one HTTP call.
type request struct {
	method, url string
	header      http.Header
	json        any       // encoded as the body when non-nil
	body        io.Reader // raw body when json is nil
	out         any       // the 2xx answer is decoded into it when non-nil
	wait        time.Duration
	stream      bool // the caller reads and closes the body; no request timeout
	noTimeout   bool // bounded by the context only (uploads)
}

// do sends req. Non-2xx answers become *APIError. Unless req.stream, the
// body is read (bounded), decoded into req.out and closed.
func (r *requester) do(ctx context.Context, req request) (*http.Response, error) {
	var body io.Reader = req.body
	if req.json != nil {
		buf, err := json.Marshal(req.json)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(buf)
	}
	cancel := context.CancelFunc(func() {})
	if !req.stream && !req.noTimeout && r.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, r.timeout+req.wait)
	}
	hreq, err := http.NewRequestWithContext(ctx, req.method, req.url, body)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("build request: %w", err)
	}
	for k, v := range req.header {
		hreq.Header[k] = v
	}
	if req.json != nil {
		hreq.Header.Set("Content-Type", "application/json")
	}
	if hreq.Header.Get("Accept") == "" {
		hreq.Header.Set("Accept", "application/json")
	}
	hreq.Header.Set("User-Agent", r.ua)
	if r.auth != nil {
		r.auth(hreq.Header)
	}
	resp, err := r.hc.Do(hreq)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("%s %s: %w", req.method, redact(req.url), err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer cancel()
		defer resp.Body.Close()
		return resp, decodeError(resp)
	}
	if req.stream {
		resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
		return resp, nil
	}
	defer cancel()
	defer resp.Body.Close()
	if req.out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		return resp, nil
	}
	buf, err := readBounded(resp.Body, r.maxBody)
	if err != nil {
		return resp, fmt.Errorf("%s %s: read answer: %w", req.method, redact(req.url), err)
	}
	if err := json.Unmarshal(buf, req.out); err != nil {
		return resp, fmt.Errorf("%s %s: decode answer: %w", req.method, redact(req.url), err)
	}
	return resp, nil
}

// cancelBody releases a request's context when its body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// readBounded reads all of rd, failing if it is longer than max.
func readBounded(rd io.Reader, max int64) ([]byte, error) {
	buf, err := io.ReadAll(io.LimitReader(rd, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(buf)) > max {
		return nil, fmt.Errorf("answer larger than %d bytes", max)
	}
	return buf, nil
}

// decodeError turns an error answer into *APIError, tolerating bodies that
// are not the JSON envelope (a proxy's HTML page, say).
func decodeError(resp *http.Response) error {
	buf, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var env struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	e := &APIError{Status: resp.StatusCode}
	if json.Unmarshal(buf, &env) == nil && env.Error.Code != "" {
		e.Code, e.Message = env.Error.Code, env.Error.Message
		return e
	}
	e.Code = fmt.Sprintf("http_%d", resp.StatusCode)
	msg := strings.TrimSpace(string(buf))
	if len(msg) > 512 {
		msg = msg[:512] + "..."
	}
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	e.Message = msg
	return e
}

// redact drops the query string from URLs in error messages: paths of
// sandbox files may be private.
func redact(u string) string {
	if i := strings.IndexByte(u, '?'); i >= 0 {
		return u[:i]
	}
	return u
}

// transient reports whether a failed call is worth repeating.
func transient(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status >= 500 || ae.Status == http.StatusTooManyRequests
	}
	return true // network errors, dropped connections
}

// backoff sleeps before retry n (1-based): exponential from base, capped,
// with jitter so many clients do not reconnect in lockstep.
func backoff(ctx context.Context, n int, base time.Duration) error {
	if base <= 0 {
		base = 250 * time.Millisecond
	}
	d := base << min(n-1, 6)
	d = min(d, 5*time.Second)
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
