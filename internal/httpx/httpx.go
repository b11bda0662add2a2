// Package httpx holds the HTTP plumbing shared by the control API and the
// data plane: the JSON error envelope, bounded strict JSON decoding, panic
// recovery and server-sent events.
package httpx

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/space-sandbox/space/internal/core"
)

// MaxJSONBody bounds every JSON request body.
const MaxJSONBody = 1 << 20

// Error is an API error with its HTTP status.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// ErrorEnvelope reads the code and message of an error answer's body, the
// envelope WriteError writes; both are "" when raw is not one (a proxy's
// page, say).
func ErrorEnvelope(raw []byte) (code, message string) {
	var env struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &env) != nil {
		return "", ""
	}
	return env.Error.Code, env.Error.Message
}

// Errorf builds an *Error.
func Errorf(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// StatusOf maps an error to status, code and message.
func StatusOf(err error) (int, string, string) {
	var he *Error
	if errors.As(err, &he) {
		return he.Status, he.Code, he.Message
	}
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("request body larger than %d bytes", mbe.Limit)
	case errors.Is(err, core.ErrNotFound):
		return http.StatusNotFound, "not_found", err.Error()
	case errors.Is(err, core.ErrEgressDisabled):
		return http.StatusBadRequest, "egress_disabled", err.Error()
	case errors.Is(err, core.ErrIdempotencyReused):
		return http.StatusUnprocessableEntity, "idempotency_key_reused", err.Error()
	case errors.Is(err, core.ErrInvalid):
		return http.StatusBadRequest, "invalid_argument", err.Error()
	case errors.Is(err, core.ErrConflict):
		return http.StatusConflict, "conflict", err.Error()
	case errors.Is(err, core.ErrUnauthorized):
		return http.StatusUnauthorized, "unauthorized", err.Error()
	case errors.Is(err, core.ErrExhausted):
		return http.StatusTooManyRequests, "resource_exhausted", err.Error()
	case errors.Is(err, core.ErrUnavailable):
		return http.StatusServiceUnavailable, "unavailable", err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "deadline_exceeded", err.Error()
	case errors.Is(err, context.Canceled):
		return 499, "cancelled", err.Error()
	}
	return http.StatusInternalServerError, "internal", "internal error"
}

// WriteError writes the JSON error envelope {"error":{"code","message"}}.
// An internal error's cause is not sent (the client may be hostile and it
// can name host paths), so it is handed to the access log instead, when
// the writer or one it wraps takes it (logx.Access's recorder).
func WriteError(w http.ResponseWriter, err error) {
	status, code, msg := StatusOf(err)
	if status == 499 {
		return // the client is gone
	}
	if status == http.StatusInternalServerError && err != nil {
		noteError(w, err)
	}
	WriteJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// ErrorNoter is a response writer that records the cause of an internal
// error for the request's log line.
type ErrorNoter interface{ NoteError(error) }

func noteError(w http.ResponseWriter, err error) {
	for w != nil {
		if n, ok := w.(ErrorNoter); ok {
			n.NoteError(err)
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// WriteJSON writes v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	buf, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		buf = []byte(`{"error":{"code":"internal","message":"encode response"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(buf, '\n'))
}

// DecodeJSON strictly decodes a bounded JSON body into v: unknown fields,
// trailing data and bodies over MaxJSONBody are client errors.
func DecodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return Errorf(http.StatusBadRequest, "invalid_body", "read body: %v", err)
	}
	return DecodeStrict(body, v)
}

// DecodeStrict decodes one JSON value from body into v, rejecting unknown
// fields and trailing data.
func DecodeStrict(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return Errorf(http.StatusBadRequest, "invalid_json", "empty body; a JSON object is required")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var ute *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &se):
			return Errorf(http.StatusBadRequest, "invalid_json", "malformed JSON at offset %d", se.Offset)
		case errors.As(err, &ute):
			return Errorf(http.StatusBadRequest, "invalid_json", "field %q: expected %s", ute.Field, ute.Type)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return Errorf(http.StatusBadRequest, "unknown_field", "%s", strings.TrimPrefix(err.Error(), "json: "))
		default:
			return Errorf(http.StatusBadRequest, "invalid_json", "%v", err)
		}
	}
	if dec.More() {
		return Errorf(http.StatusBadRequest, "invalid_json", "trailing data after the JSON value")
	}
	if _, err := dec.Token(); err != io.EOF {
		return Errorf(http.StatusBadRequest, "invalid_json", "trailing data after the JSON value")
	}
	return nil
}

// Recover turns a handler panic into a 500 JSON error instead of a dropped
// connection, and logs it.
func Recover(next http.Handler, logf func(string, ...any)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				logf("panic in %s %s: %v", r.Method, r.URL.Path, v)
				WriteError(w, Errorf(http.StatusInternalServerError, "internal", "internal error"))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// NotFound is the JSON 404 for unknown routes.
func NotFound(w http.ResponseWriter, r *http.Request) {
	WriteError(w, Errorf(http.StatusNotFound, "route_not_found", "no route for %s %s", r.Method, r.URL.Path))
}
