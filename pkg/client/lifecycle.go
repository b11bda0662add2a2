package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Sandbox states beyond the basic lifecycle.
const (
	StatePaused     = "paused"
	StateHibernated = "hibernated"
)

// Sentinel errors an *APIError matches with errors.Is, by envelope code
// first and HTTP status second (as the Python SDK's exceptions do).
var (
	ErrInvalidArgument   = errors.New("space: invalid argument")
	ErrUnauthorized      = errors.New("space: unauthorized")
	ErrTokenExpired      = errors.New("space: session token expired")
	ErrForbidden         = errors.New("space: forbidden")
	ErrNotFound          = errors.New("space: not found")
	ErrConflict          = errors.New("space: conflict")
	ErrSandboxPaused     = errors.New("space: sandbox paused")
	ErrGone              = errors.New("space: gone")
	ErrTooLarge          = errors.New("space: body too large")
	ErrResourceExhausted = errors.New("space: resource exhausted")
	ErrInternal          = errors.New("space: internal server error")
	ErrAgent             = errors.New("space: agent error")
	ErrUnavailable       = errors.New("space: unavailable")
	ErrDeadlineExceeded  = errors.New("space: deadline exceeded")
)

// errByCode maps envelope codes to the sentinels they match: a paused sandbox is a
// conflict, an expired token is unauthorized.
var errByCode = map[string][]error{
	"invalid_argument":       {ErrInvalidArgument},
	"invalid_json":           {ErrInvalidArgument},
	"unknown_field":          {ErrInvalidArgument},
	"invalid_body":           {ErrInvalidArgument},
	"invalid_path":           {ErrInvalidArgument},
	"unsupported_media_type": {ErrInvalidArgument},
	"unauthorized":           {ErrUnauthorized},
	"token_expired":          {ErrTokenExpired, ErrUnauthorized},
	"forbidden":              {ErrForbidden},
	"not_found":              {ErrNotFound},
	"route_not_found":        {ErrNotFound},
	"conflict":               {ErrConflict},
	"sandbox_paused":         {ErrSandboxPaused, ErrConflict},
	"events_gone":            {ErrGone},
	"body_too_large":         {ErrTooLarge},
	"resource_exhausted":     {ErrResourceExhausted},
	"internal":               {ErrInternal},
	"agent_error":            {ErrAgent},
	"unavailable":            {ErrUnavailable},
	"deadline_exceeded":      {ErrDeadlineExceeded},
}

var errByStatus = map[int]error{
	http.StatusBadRequest: ErrInvalidArgument, http.StatusUnauthorized: ErrUnauthorized,
	http.StatusForbidden: ErrForbidden, http.StatusNotFound: ErrNotFound, http.StatusConflict: ErrConflict,
	http.StatusGone: ErrGone, http.StatusRequestEntityTooLarge: ErrTooLarge,
	http.StatusUnsupportedMediaType: ErrInvalidArgument, http.StatusTooManyRequests: ErrResourceExhausted,
	http.StatusInternalServerError: ErrInternal, http.StatusBadGateway: ErrAgent,
	http.StatusServiceUnavailable: ErrUnavailable, http.StatusGatewayTimeout: ErrDeadlineExceeded,
}

// Is lets errors.Is(err, ErrNotFound) and friends match an API answer.
func (e *APIError) Is(target error) bool {
	for _, s := range errByCode[e.Code] {
		if s == target {
			return true
		}
	}
	return errByStatus[e.Status] == target
}

// Snapshot is a stored capture of a sandbox's writable layer.
type Snapshot struct {
	ID          string         `json:"id"`
	ProjectID   string         `json:"project_id"`
	SandboxID   string         `json:"sandbox_id"`
	ParentID    string         `json:"parent_id,omitempty"`
	Template    string         `json:"template"`
	State       string         `json:"state"` // creating, ready, failed
	StateReason string         `json:"state_reason,omitempty"`
	Kind        string         `json:"kind"`      // e.g. "filesystem"
	Processes   string         `json:"processes"` // what a restore does with processes
	Stats       map[string]any `json:"stats,omitempty"`
	CreatedAt   time.Time      `json:"created_at"`
	UpdatedAt   time.Time      `json:"updated_at"`
}

// ForkRequest asks for Count new sandboxes from one snapshot; empty fields
// take the source sandbox's values.
type ForkRequest struct {
	Count          int               `json:"count"`
	Env            map[string]string `json:"env,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	Limits         Limits            `json:"limits,omitzero"`
	TimeoutSeconds *int64            `json:"timeout_seconds,omitempty"`
}

// ForkResult is one sandbox a fork started, as CreateSandbox answers it.
type ForkResult = CreateResult

// lifecycle posts to /v1/sandboxes/{id}/{verb} and returns the operation.
func (c *Client) lifecycle(ctx context.Context, id, verb, idemKey string, out any) (Operation, error) {
	var res struct {
		Operation Operation `json:"operation"`
	}
	u, err := route(c.base, "/v1/sandboxes/%s/"+verb, id)
	if err != nil {
		return Operation{}, err
	}
	if out == nil {
		out = &res
	}
	_, err = c.r.do(ctx, request{method: http.MethodPost, url: u, header: idemHeader(idemKey), out: out})
	return res.Operation, err
}

// PauseSandbox starts freezing a sandbox: its processes stop and keep their
// memory, its timeout clock stops and its data plane refuses calls
// (ErrSandboxPaused) until ResumeSandbox.
func (c *Client) PauseSandbox(ctx context.Context, id, idemKey string) (Operation, error) {
	return c.lifecycle(ctx, id, "pause", idemKey, nil)
}

// ResumeSandbox starts resuming a paused or hibernated sandbox.
func (c *Client) ResumeSandbox(ctx context.Context, id, idemKey string) (Operation, error) {
	return c.lifecycle(ctx, id, "resume", idemKey, nil)
}

// HibernateSandbox starts capturing a sandbox as a snapshot and releasing
// its instance; ResumeSandbox starts it again from that snapshot.
func (c *Client) HibernateSandbox(ctx context.Context, id, idemKey string) (Operation, error) {
	return c.lifecycle(ctx, id, "hibernate", idemKey, nil)
}

// CreateSnapshot starts a snapshot of a sandbox. The snapshot is usable when
// the operation has succeeded (its state is then "ready").
func (c *Client) CreateSnapshot(ctx context.Context, sandboxID, idemKey string) (Snapshot, Operation, error) {
	var res struct {
		Snapshot  Snapshot  `json:"snapshot"`
		Operation Operation `json:"operation"`
	}
	_, err := c.lifecycle(ctx, sandboxID, "snapshots", idemKey, &res)
	return res.Snapshot, res.Operation, err
}

// ListSnapshots returns the project's snapshots, or one sandbox's when
// sandboxID is not empty, following every page.
func (c *Client) ListSnapshots(ctx context.Context, sandboxID string) ([]Snapshot, error) {
	var all []Snapshot
	token := ""
	for {
		q := url.Values{"limit": {strconv.Itoa(1000)}}
		if sandboxID != "" {
			q.Set("sandbox_id", sandboxID)
		}
		if token != "" {
			q.Set("page_token", token)
		}
		var page struct {
			Snapshots     []Snapshot `json:"snapshots"`
			NextPageToken string     `json:"next_page_token"`
		}
		if _, err := c.r.do(ctx, request{method: http.MethodGet, url: c.base + "/v1/snapshots?" + q.Encode(), out: &page}); err != nil {
			return all, err
		}
		all = append(all, page.Snapshots...)
		if page.NextPageToken == "" || page.NextPageToken == token {
			return all, nil
		}
		token = page.NextPageToken
	}
}

// GetSnapshot returns one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, id string) (Snapshot, error) {
	var s Snapshot
	u, err := route(c.base, "/v1/snapshots/%s", id)
	if err != nil {
		return s, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodGet, url: u, out: &s})
	return s, err
}

// DeleteSnapshot deletes a snapshot; the operation frees its data. A
// snapshot that another one names as parent cannot go (ErrConflict).
func (c *Client) DeleteSnapshot(ctx context.Context, id string) (Operation, error) {
	var res struct {
		Operation Operation `json:"operation"`
	}
	u, err := route(c.base, "/v1/snapshots/%s", id)
	if err != nil {
		return Operation{}, err
	}
	_, err = c.r.do(ctx, request{method: http.MethodDelete, url: u, out: &res})
	return res.Operation, err
}

// ForkSnapshot starts req.Count new sandboxes from a snapshot, each with its
// own operation and session. When only some could start, it returns those
// and an *APIError for the rest.
func (c *Client) ForkSnapshot(ctx context.Context, id string, req ForkRequest, idemKey string) ([]ForkResult, error) {
	var res struct {
		Sandboxes []ForkResult `json:"sandboxes"`
		Error     *OpError     `json:"error"`
	}
	u, err := route(c.base, "/v1/snapshots/%s/fork", id)
	if err != nil {
		return nil, err
	}
	if req.Count == 0 {
		req.Count = 1
	}
	_, err = c.r.do(ctx, request{method: http.MethodPost, url: u, header: idemHeader(idemKey), json: req, out: &res})
	for i := range res.Sandboxes {
		res.Sandboxes[i].Session.SandboxID = res.Sandboxes[i].Sandbox.ID
	}
	if err == nil && res.Error != nil {
		err = &APIError{Status: http.StatusAccepted, Code: res.Error.Code, Message: res.Error.Message}
	}
	return res.Sandboxes, err
}
