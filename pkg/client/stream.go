package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

var (
	errIdle     = errors.New("event stream silent for too long")
	errStreamUp = errors.New("event stream ended before its last event")
)

// sseHandler receives one event; stop ends the stream successfully, an
// error ends it with that error and no reconnection.
type sseHandler func(ev sseEvent) (stop bool, err error)

// followState survives reconnections.
type followState struct {
	lastID string
	retry  time.Duration
}

// follow reads the event stream at u until handle stops it, reconnecting
// with Last-Event-ID after a dropped or silent connection. atEOF, if not
// nil, is asked when the server ends the stream cleanly before handle
// stopped: it reports whether the end was final (the thing followed has
// finished) or the stream should be reopened.
func (r *requester) follow(ctx context.Context, u, lastID string, handle sseHandler, atEOF func(context.Context) (bool, error)) error {
	st := followState{lastID: lastID}
	failures := 0
	for {
		progressed, done, retryable, err := r.followOnce(ctx, u, &st, handle)
		if done {
			return nil
		}
		if errors.Is(err, errStreamUp) && atEOF != nil {
			stop, aerr := atEOF(ctx)
			if aerr != nil && !transient(ctx, aerr) {
				return aerr
			}
			if stop {
				return nil
			}
		}
		if !retryable {
			return err
		}
		if progressed {
			failures = 0
		}
		failures++
		if failures > r.retries {
			return fmt.Errorf("event stream %s: gave up after %d attempts: %w", redact(u), failures, err)
		}
		if berr := backoff(ctx, failures, st.retry); berr != nil {
			return berr
		}
	}
}

// followOnce reads one connection of the stream.
func (r *requester) followOnce(ctx context.Context, u string, st *followState, handle sseHandler) (progressed, done, retryable bool, err error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	h := http.Header{"Accept": {"text/event-stream"}, "Cache-Control": {"no-cache"}}
	if st.lastID != "" {
		h.Set("Last-Event-ID", st.lastID)
	}
	resp, err := r.do(actx, request{method: http.MethodGet, url: u, header: h, stream: true})
	if err != nil {
		return false, false, transient(ctx, err), err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		return false, false, false, fmt.Errorf("GET %s: expected text/event-stream, got %q", redact(u), ct)
	}
	var body io.Reader = resp.Body
	if r.idle > 0 {
		t := time.AfterFunc(r.idle, func() { cancel(errIdle) })
		defer t.Stop()
		body = &idleReader{r: resp.Body, t: t, d: r.idle}
	}
	p := newSSEParser(body, maxSSEEvent)
	p.lastID, p.retry = st.lastID, st.retry
	for {
		ev, err := p.next()
		st.retry = p.retry
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return progressed, false, false, ctx.Err()
			case errors.Is(err, ErrEventTooLarge):
				return progressed, false, false, err
			case err == io.EOF:
				return progressed, false, true, errStreamUp
			case context.Cause(actx) == errIdle:
				return progressed, false, true, errIdle
			}
			return progressed, false, true, fmt.Errorf("read event stream: %w", err)
		}
		progressed = true
		st.lastID = ev.ID
		stop, herr := handle(ev)
		if herr != nil {
			return progressed, false, false, herr
		}
		if stop {
			return progressed, true, false, nil
		}
	}
}

// idleReader pushes back a deadline timer on every read that returns data.
type idleReader struct {
	r io.Reader
	t *time.Timer
	d time.Duration
}

func (ir *idleReader) Read(p []byte) (int, error) {
	n, err := ir.r.Read(p)
	if n > 0 {
		ir.t.Reset(ir.d)
	}
	return n, err
}
