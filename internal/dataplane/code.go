package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/space-sandbox/space/internal/agent/client"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/node"
	"github.com/space-sandbox/space/internal/template"
)

// Bounds of a code run (POST /v1/sandboxes/{id}/code).
const (
	DefaultCodeTimeout = 5 * time.Minute
	MaxCodeTimeout     = time.Hour
	maxCodeBytes       = 512 << 10
	maxCodeEnvVars     = 256
	maxCodeNameBytes   = 128
	// maxCodeEventBytes bounds one event from the interpreter: a PNG of a
	// large figure or a big table is one event.
	maxCodeEventBytes = 32 << 20
	maxCodeErrorBytes = 64 << 10
	codeKeepAlive     = 15 * time.Second
)

// codeEventTypes are the interpreter's events the route passes on, named
// as in the @e2b/code-interpreter protocol; "keepalive" becomes an SSE
// comment and anything else is dropped.
var codeEventTypes = map[string]bool{
	"number_of_executions": true, "stdout": true, "stderr": true,
	"result": true, "error": true, "end_of_execution": true,
}

var codeEnvName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)

// CodeRequest is the body of POST /v1/sandboxes/{id}/code.
type CodeRequest struct {
	Code      string            `json:"code"`
	Language  string            `json:"language,omitempty"`
	ContextID string            `json:"context_id,omitempty"`
	EnvVars   map[string]string `json:"env_vars,omitempty"`
	TimeoutMs int64             `json:"timeout_ms,omitempty"`
}

// decodeCodeRequest strictly decodes and bounds a code request.
func decodeCodeRequest(body []byte) (CodeRequest, error) {
	var req CodeRequest
	if err := httpx.DecodeStrict(body, &req); err != nil {
		return req, err
	}
	switch {
	case len(req.Code) > maxCodeBytes:
		return req, httpx.Errorf(http.StatusRequestEntityTooLarge, "too_large", "code over %d bytes", maxCodeBytes)
	case req.Language != "" && req.ContextID != "":
		return req, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "give at most one of language and context_id")
	case len(req.Language) > maxCodeNameBytes || len(req.ContextID) > maxCodeNameBytes:
		return req, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "language and context_id are at most %d bytes", maxCodeNameBytes)
	case len(req.EnvVars) > maxCodeEnvVars:
		return req, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "more than %d env_vars", maxCodeEnvVars)
	case req.TimeoutMs < 0 || time.Duration(req.TimeoutMs)*time.Millisecond > MaxCodeTimeout:
		return req, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "timeout_ms must be 0-%d", MaxCodeTimeout.Milliseconds())
	}
	for k, v := range req.EnvVars {
		if !codeEnvName.MatchString(k) || bytes.IndexByte([]byte(v), 0) >= 0 {
			return req, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "env var %.64q: names are [A-Za-z_][A-Za-z0-9_]*, values without NUL", k)
		}
	}
	return req, nil
}

// runCode runs code in one of the sandbox's interpreter contexts (the
// code-interpreter-v1 server on port 49999, reached through the agent's
// port tunnel like any forwarded port) and streams the interpreter's
// events as SSE: each event's name is its type and its data the event's
// JSON as the interpreter sent it. A timeout ends the stream with an
// error event named TimeoutError; a client that leaves, or a timeout,
// closes the interpreter connection, which interrupts the running code.
func (s *Server) runCode(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, httpx.MaxJSONBody))
	if err != nil {
		return err
	}
	req, err := decodeCodeRequest(body)
	if err != nil {
		return err
	}
	timeout := DefaultCodeTimeout
	if req.TimeoutMs > 0 {
		timeout = time.Duration(req.TimeoutMs) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	// The connection the last run left parked, if it is still open: a new
	// tunnel per run cost an agent connection, its handshake and the
	// interpreter's accept.
	conn, reused, err := sb.TakePort(ctx, template.InterpreterPort)
	if err != nil {
		return interpreterDialError(err)
	}
	parked := false
	defer func() {
		if !parked && conn != nil {
			conn.Close()
		}
	}()
	// Closing the connection is how the interpreter learns that the run
	// is abandoned: it interrupts the kernel.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	br := bufio.NewReader(conn)
	resp, err := postExecute(ctx, conn, br, req)
	if err != nil && reused && ctx.Err() == nil && noAnswer(err) {
		// The kept connection was closed by the interpreter since (an idle
		// close): nothing of an answer came, so nothing ran. (The
		// interpreter holds its answer's head until the first events, so
		// one that died mid-run also ends this way; its replacement is not
		// up yet to run it again.) Once more on a new connection.
		stop()
		conn.Close()
		if conn, err = sb.DialPort(ctx, template.InterpreterPort); err != nil {
			return interpreterDialError(err)
		}
		stop = context.AfterFunc(ctx, func() { conn.Close() })
		br = bufio.NewReader(conn)
		resp, err = postExecute(ctx, conn, br, req)
	}
	defer stop()
	if err != nil {
		if ctx.Err() != nil && r.Context().Err() == nil {
			return httpx.Errorf(http.StatusGatewayTimeout, "deadline_exceeded", "the interpreter did not answer within %s", timeout)
		}
		return httpx.Errorf(http.StatusBadGateway, "interpreter_error", "the code interpreter did not answer: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return interpreterHTTPError(resp)
	}
	if streamCodeEvents(ctx, r.Context(), w, bufio.NewReaderSize(resp.Body, 64<<10), timeout) &&
		!resp.Close && br.Buffered() == 0 && stop() {
		// Read to its end, and the run's deadline can no longer close it.
		sb.ParkPort(template.InterpreterPort, conn)
		parked = true
	}
	return nil
}

// postExecute sends the interpreter's /execute request on conn and reads
// the answer's head through br (conn's reader).
func postExecute(ctx context.Context, conn net.Conn, br *bufio.Reader, req CodeRequest) (*http.Response, error) {
	payload, err := json.Marshal(map[string]any{
		"code": req.Code, "language": nilIfEmpty(req.Language), "context_id": nilIfEmpty(req.ContextID), "env_vars": req.EnvVars,
	})
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:"+strconv.Itoa(template.InterpreterPort)+"/execute", bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	if err := hreq.Write(conn); err != nil {
		return nil, fmt.Errorf("send: %w", err)
	}
	return http.ReadResponse(br, hreq)
}

// noAnswer reports whether err means that the connection was closed
// before any byte of an answer came.
func noAnswer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func interpreterDialError(err error) error {
	switch {
	case client.IsPortClosed(err):
		return httpx.Errorf(http.StatusConflict, "no_interpreter",
			"nothing listens on port %d in the sandbox: its template has no code interpreter (use %s)", template.InterpreterPort, template.BuiltinCodeInterpreter)
	case errors.Is(err, core.ErrConflict):
		return httpx.Errorf(http.StatusConflict, "sandbox_paused", "the sandbox is paused; resume it through the control API")
	case errors.Is(err, core.ErrNotFound):
		return httpx.Errorf(http.StatusNotFound, "not_found", "sandbox not found or not running")
	}
	return httpx.Errorf(http.StatusBadGateway, "interpreter_error", "could not reach the code interpreter")
}

// interpreterHTTPError passes the interpreter's client errors on
// (unknown context, unsupported language, too many contexts); it runs
// inside the sandbox, so any other answer is a bad gateway.
func interpreterHTTPError(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxCodeErrorBytes))
	code, msg := httpx.ErrorEnvelope(raw)
	msg = truncate(msg, 512)
	switch resp.StatusCode {
	case http.StatusBadRequest:
		if code == "unsupported_language" {
			return httpx.Errorf(http.StatusBadRequest, "unsupported_language", "%s", msg)
		}
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "%s", msg)
	case http.StatusNotFound:
		return httpx.Errorf(http.StatusNotFound, "not_found", "%s", msg)
	case http.StatusTooManyRequests:
		return httpx.Errorf(http.StatusTooManyRequests, "too_many_contexts", "%s", msg)
	case http.StatusServiceUnavailable:
		return httpx.Errorf(http.StatusServiceUnavailable, "unavailable", "%s", msg)
	}
	return httpx.Errorf(http.StatusBadGateway, "interpreter_error", "the code interpreter answered %d", resp.StatusCode)
}

// codeLine is a line of the interpreter's answer; more says that more of
// the answer was already read (it arrived in the same piece).
type codeLine struct {
	b    []byte
	more bool
}

// streamCodeEvents copies the interpreter's newline-delimited JSON events
// to SSE until end_of_execution. Each line is compacted (so it cannot
// break the SSE framing) and must be a JSON object with a known type. It
// reports whether the interpreter's answer was read to its end, so that
// its connection can carry the next run.
func streamCodeEvents(ctx, clientCtx context.Context, w http.ResponseWriter, rd *bufio.Reader, timeout time.Duration) (complete bool) {
	sse := httpx.StartSSE(w)
	lines := make(chan codeLine)
	readErr := make(chan error, 1)
	go func() {
		defer close(lines)
		for {
			line, err := readLine(rd, maxCodeEventBytes)
			if err != nil {
				readErr <- err
				return
			}
			select {
			case lines <- codeLine{b: line, more: rd.Buffered() > 0}:
			case <-ctx.Done():
				return
			}
		}
	}()
	keepAlive := time.NewTicker(codeKeepAlive)
	defer keepAlive.Stop()
	var buf bytes.Buffer
	for {
		select {
		case <-keepAlive.C:
			if sse.Comment("keepalive") != nil || sse.Flush() != nil {
				return false
			}
			continue
		case cl, ok := <-lines:
			line := cl.b
			if !ok {
				var err error
				select {
				case err = <-readErr:
				default:
				}
				switch {
				case clientCtx.Err() != nil:
					return false // the client left: the interpreter interrupts
				case ctx.Err() != nil:
					endCode(sse, "TimeoutError", fmt.Sprintf("the execution did not finish within %s; it was interrupted", timeout))
				case errors.Is(err, errLineTooLong):
					endCode(sse, "OutputTooLarge", fmt.Sprintf("an event of the interpreter was over %d bytes", maxCodeEventBytes))
				default:
					endCode(sse, "InterpreterError", "the code interpreter closed the stream before the end of the execution")
				}
				return false
			}
			// A line skipped at the end of a piece still sends the
			// events before it.
			skip := func() bool { return cl.more || sse.Flush() == nil }
			buf.Reset()
			if len(bytes.TrimSpace(line)) == 0 || json.Compact(&buf, line) != nil {
				if !skip() {
					return false
				}
				continue
			}
			var head struct {
				Type string `json:"type"`
			}
			if json.Unmarshal(buf.Bytes(), &head) != nil {
				if !skip() {
					return false
				}
				continue
			}
			if head.Type == "keepalive" {
				if sse.Comment("keepalive") != nil || sse.Flush() != nil {
					return false
				}
				continue
			}
			if !codeEventTypes[head.Type] {
				if !skip() {
					return false
				}
				continue
			}
			if sse.Event("", head.Type, buf.Bytes()) != nil {
				return false
			}
			// Events that came in one piece leave in one write: each
			// write is a wake-up of the client.
			if (!cl.more || head.Type == "end_of_execution") && sse.Flush() != nil {
				return false
			}
			if head.Type == "end_of_execution" {
				return answerEnded(lines, readErr)
			}
		}
	}
}

// answerEndWait bounds the wait for the end of the interpreter's chunked
// answer after end_of_execution (it sends both in one write).
const answerEndWait = 100 * time.Millisecond

// answerEnded reports whether the interpreter's answer ends right after
// end_of_execution: no further line, then EOF of the chunked body.
func answerEnded(lines <-chan codeLine, readErr <-chan error) bool {
	t := time.NewTimer(answerEndWait)
	defer t.Stop()
	select {
	case _, ok := <-lines:
		if ok {
			return false
		}
		select {
		case err := <-readErr:
			return errors.Is(err, io.EOF)
		default:
			return false
		}
	case <-t.C:
		return false
	}
}

// endCode ends a stream the interpreter did not end: an error event, then
// end_of_execution, as the interpreter's own would.
func endCode(sse *httpx.SSE, name, value string) {
	ev, _ := json.Marshal(map[string]string{"type": "error", "name": name, "value": value, "traceback": ""})
	sse.Event("", "error", ev)
	sse.Event("", "end_of_execution", []byte(`{"type":"end_of_execution"}`))
	sse.Flush()
}

var errLineTooLong = errors.New("line too long")

// readLine reads one '\n'-terminated line of at most max bytes.
func readLine(rd *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := rd.ReadSlice('\n')
		if len(line)+len(chunk) > max {
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		if err == nil {
			return line, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if err == io.EOF && len(line) > 0 {
				return line, nil
			}
			return nil, err
		}
	}
}
