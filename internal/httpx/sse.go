package httpx

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// SSE writes a server-sent-event stream.
type SSE struct {
	w   *bufio.Writer
	dst http.ResponseWriter
	big bool // w is the bulk-size buffer
	rc  *http.ResponseController
}

// Buffer sizes: most streams carry a few small events (a command's exit,
// an operation's states), for which a small buffer will do; the first
// large event moves the stream to a buffer that coalesces bulk output.
// A 64 KiB buffer for every stream was the largest allocation of an exec.
const (
	smallBuffer = 4 << 10
	bulkBuffer  = 64 << 10
	bulkEvent   = 1 << 10 // an event this large moves the stream to bulkBuffer
)

// StartSSE sends the stream headers. The write deadline is lifted because
// streams outlive the server's WriteTimeout.
func StartSSE(w http.ResponseWriter) *SSE { return StartSSEStatus(w, http.StatusOK) }

// StartSSEStatus is StartSSE answering status (e.g. 201 for a stream that
// follows what the request created).
func StartSSEStatus(w http.ResponseWriter, status int) *SSE {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	w.WriteHeader(status)
	s := &SSE{w: bufio.NewWriterSize(w, smallBuffer), dst: w, rc: rc}
	s.Flush()
	return s
}

// Event writes one event. data must not contain newlines (callers send JSON
// or base64). It buffers; call Flush to push.
func (s *SSE) Event(id, event string, data []byte) error {
	if !s.big && len(data) >= bulkEvent {
		// What the small buffer holds goes first, in order, into the
		// response (buffered there, not flushed to the client).
		if err := s.w.Flush(); err != nil {
			return err
		}
		s.w, s.big = bufio.NewWriterSize(s.dst, bulkBuffer), true
	}
	if id != "" {
		s.w.WriteString("id: ")
		s.w.WriteString(id)
		s.w.WriteByte('\n')
	}
	if event != "" {
		s.w.WriteString("event: ")
		s.w.WriteString(event)
		s.w.WriteByte('\n')
	}
	s.w.WriteString("data: ")
	s.w.Write(data)
	_, err := s.w.WriteString("\n\n")
	return err
}

// Comment writes a keep-alive comment line.
func (s *SSE) Comment(text string) error {
	_, err := s.w.WriteString(": " + text + "\n\n")
	return err
}

// Buffered reports how many bytes wait for Flush.
func (s *SSE) Buffered() int { return s.w.Buffered() }

// Flush pushes buffered events to the client.
func (s *SSE) Flush() error {
	if err := s.w.Flush(); err != nil {
		return err
	}
	return s.rc.Flush()
}

// LastEventID returns the resume position from the Last-Event-ID header or
// the ?last_event_id= / ?after= query parameter; ok is false if it is malformed.
func LastEventID(r *http.Request) (uint64, bool) {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = r.URL.Query().Get("last_event_id")
	}
	if v == "" {
		v = r.URL.Query().Get("after")
	}
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, true
	}
	n, err := strconv.ParseUint(v, 10, 64)
	return n, err == nil
}
