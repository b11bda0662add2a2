package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/space-sandbox/space/internal/agent"
)

// ErrBadFrame means the agent sent an event stream that breaks the protocol.
var ErrBadFrame = errors.New("agent: malformed event stream")

// EventReader reads one process's events. It is not safe for concurrent use.
type EventReader struct {
	body io.ReadCloser
	br   *bufio.Reader
	last uint64 // seq of the last event returned (or the after value)
	done bool
	err  error
	hdr  [agent.FrameHeaderSize]byte

	shared bool       // the current read may reuse buf
	buf    []byte     // payload buffer reused by NextShared
	pool   *sync.Pool // where br goes once the exit event is read
	cancel func()     // ends the request (StartEvents); nil for Events
}

// Events follows a process's events after seq after (0: from the start).
// It fails with an *Error with Code "events_gone" (IsGone) when the agent no
// longer holds them.
func (c *Client) Events(ctx context.Context, id string, after uint64) (*EventReader, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatUint(after, 10))
	}
	resp, err := c.do(ctx, http.MethodGet, processPath(id, "/events"), q, nil, "", http.StatusOK)
	if err != nil {
		return nil, err
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, agent.EventsContentType) {
		resp.Body.Close()
		return nil, fmt.Errorf("%w: content type %q", ErrBadFrame, sanitize(ct, 64))
	}
	r := newEventReader(resp.Body, after, c.readers)
	return r, nil
}

// StartEvents starts a command and follows its events on the same request,
// one round trip fewer than Start and then Events. ctx bounds the start
// only; the stream lives until streamCtx ends or the reader is closed. An
// agent that predates the combined call answers as Start does: then the
// reader is nil and the caller follows with Events.
func (c *Client) StartEvents(ctx, streamCtx context.Context, spec agent.ProcessSpec) (agent.ProcessInfo, *EventReader, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return agent.ProcessInfo{}, nil, fmt.Errorf("agent: encoding POST /v1/processes: %w", err)
	}
	rctx, cancel := context.WithCancel(streamCtx)
	stop := context.AfterFunc(ctx, cancel)
	resp, err := c.send(rctx, http.MethodPost, "/v1/processes", nil, bytes.NewReader(b), "application/json", agent.EventsContentType, http.StatusCreated)
	if err != nil {
		stop()
		cancel()
		return agent.ProcessInfo{}, nil, err
	}
	info, r, err := c.startedFrame(resp)
	// ctx no longer applies once the started frame is read: the process
	// runs and is the caller's to follow. (Had ctx ended just before, the
	// stream is cut and the caller resumes it with Events.)
	stop()
	if err != nil {
		resp.Body.Close()
		cancel()
		return info, nil, err
	}
	if r == nil {
		resp.Body.Close()
		cancel()
		return info, nil, nil
	}
	r.cancel = cancel
	return info, r, nil
}

// startedFrame reads a combined start's answer up to its started frame: a
// reader for the rest, or a nil one with the info where the agent answered
// JSON.
func (c *Client) startedFrame(resp *http.Response) (agent.ProcessInfo, *EventReader, error) {
	var info agent.ProcessInfo
	ct := resp.Header.Get("Content-Type")
	if strings.HasPrefix(ct, "application/json") {
		data, err := io.ReadAll(io.LimitReader(resp.Body, maxJSONResponse+1))
		if err != nil {
			return info, nil, fmt.Errorf("agent: reading POST /v1/processes: %w", err)
		}
		if len(data) > maxJSONResponse {
			return info, nil, fmt.Errorf("agent: POST /v1/processes: response larger than %d bytes", maxJSONResponse)
		}
		if err := json.Unmarshal(data, &info); err != nil {
			return info, nil, fmt.Errorf("agent: decoding POST /v1/processes: %w", err)
		}
		return info, nil, nil
	}
	if !strings.HasPrefix(ct, agent.EventsContentType) {
		return info, nil, fmt.Errorf("%w: content type %q", ErrBadFrame, sanitize(ct, 64))
	}
	r := newEventReader(resp.Body, 0, c.readers)
	if _, err := io.ReadFull(r.br, r.hdr[:]); err != nil {
		r.release()
		return info, nil, fmt.Errorf("agent: started frame: %w", err)
	}
	seq := binary.BigEndian.Uint64(r.hdr[0:8])
	n := binary.BigEndian.Uint32(r.hdr[9:13])
	if r.hdr[8] != agent.EventStarted || seq != 0 || n > maxJSONResponse {
		r.release()
		return info, nil, fmt.Errorf("%w: started frame: type %d, seq %d, %d bytes", ErrBadFrame, r.hdr[8], seq, n)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r.br, data); err != nil {
		r.release()
		return info, nil, fmt.Errorf("agent: started frame: %w", err)
	}
	if err := json.Unmarshal(data, &info); err != nil {
		r.release()
		return info, nil, fmt.Errorf("%w: started frame: %v", ErrBadFrame, err)
	}
	return info, r, nil
}

// newEventReader reads body through a 64 KiB buffer (bulk output comes
// in large reads) from pool, if not nil: a command's stream is usually a
// few small frames, and a new buffer per command was the largest
// allocation of an exec on the node.
func newEventReader(body io.ReadCloser, after uint64, pool *sync.Pool) *EventReader {
	r := &EventReader{body: body, last: after, pool: pool}
	if pool != nil {
		if br, ok := pool.Get().(*bufio.Reader); ok {
			br.Reset(body)
			r.br = br
		}
	}
	if r.br == nil {
		r.br = bufio.NewReaderSize(body, 64<<10)
	}
	return r
}

// Next returns the next event. After the exit event it returns io.EOF. The
// returned event's Data is owned by the caller. A stream that ends before
// the exit event fails with io.ErrUnexpectedEOF; a malformed one with
// ErrBadFrame.
func (r *EventReader) Next() (agent.Event, error) {
	return r.read(false)
}

// NextShared is Next for a caller that is done with each event before it
// asks for the next: the returned Data is only valid until the next call,
// and its buffer is reused, which spares a large allocation per event on
// bulk output.
func (r *EventReader) NextShared() (agent.Event, error) {
	return r.read(true)
}

func (r *EventReader) read(shared bool) (agent.Event, error) {
	if r.err != nil {
		return agent.Event{}, r.err
	}
	r.shared = shared
	ev, err := r.next()
	if err != nil {
		r.err = err
		return agent.Event{}, err
	}
	return ev, nil
}

func (r *EventReader) next() (agent.Event, error) {
	if r.done {
		return agent.Event{}, io.EOF
	}
	if _, err := io.ReadFull(r.br, r.hdr[:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return agent.Event{}, fmt.Errorf("agent: event stream: %w", err)
	}
	seq := binary.BigEndian.Uint64(r.hdr[0:8])
	typ := r.hdr[8]
	n := binary.BigEndian.Uint32(r.hdr[9:13])
	switch {
	case typ != agent.EventStdout && typ != agent.EventStderr && typ != agent.EventExit:
		return agent.Event{}, fmt.Errorf("%w: unknown event type %d", ErrBadFrame, typ)
	case n > agent.MaxEventPayload:
		return agent.Event{}, fmt.Errorf("%w: event of %d bytes", ErrBadFrame, n)
	case seq != r.last+1:
		// The agent answers 410 rather than skip events, so the first
		// event follows `after` directly and each next one its
		// predecessor.
		return agent.Event{}, fmt.Errorf("%w: seq %d after %d", ErrBadFrame, seq, r.last)
	}
	var data []byte
	if r.shared {
		if cap(r.buf) < int(n) {
			r.buf = make([]byte, n)
		}
		data = r.buf[:n]
	} else {
		data = make([]byte, n)
	}
	if _, err := io.ReadFull(r.br, data); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return agent.Event{}, fmt.Errorf("agent: event stream: %w", err)
	}
	r.last = seq
	if typ == agent.EventExit {
		r.done = true
		// The agent ends the body right after the exit event. Reading up
		// to that end hands the connection back to the pool; it blocks no
		// longer than any Next does (the request's ctx bounds it).
		r.br.Peek(1)
		if r.cancel != nil {
			r.cancel() // the body is read to its end: the connection is back
		}
		// Nothing reads br after the exit event (next returns io.EOF
		// first), so it can serve the next command's stream. Only here,
		// in the reading goroutine: a Close from another one may race a
		// read.
		if r.pool != nil {
			r.br.Reset(nil)
			r.pool.Put(r.br)
			r.br = nil
		}
	}
	return agent.Event{Seq: seq, Type: typ, Data: data}, nil
}

// ExitStatus decodes an exit event's payload.
func ExitStatus(ev agent.Event) (agent.Exit, error) {
	var e agent.Exit
	if ev.Type != agent.EventExit {
		return e, fmt.Errorf("agent: event %d is not an exit event", ev.Seq)
	}
	if err := json.Unmarshal(ev.Data, &e); err != nil {
		return e, fmt.Errorf("%w: exit payload: %v", ErrBadFrame, err)
	}
	return e, nil
}

// Close releases the stream. It is safe to call more than once.
func (r *EventReader) Close() error {
	if r.err == nil {
		r.err = errors.New("agent: event reader closed")
	}
	err := r.body.Close()
	if r.cancel != nil {
		r.cancel()
	}
	return err
}

// release hands an unused reader's buffer back to the pool (a reader that
// failed before anything read from it).
func (r *EventReader) release() {
	if r.pool != nil && r.br != nil {
		r.br.Reset(nil)
		r.pool.Put(r.br)
		r.br = nil
	}
}
