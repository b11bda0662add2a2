package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// maxCodeEvent bounds one event of a code run: the server sends events of
// up to 32 MiB (a large PNG), as JSON.
const maxCodeEvent = 33 << 20

// Code event types (CodeEvent.Type), as the interpreter names them.
const (
	CodeEventExecutionCount = "number_of_executions"
	CodeEventStdout         = "stdout"
	CodeEventStderr         = "stderr"
	CodeEventResult         = "result"
	CodeEventError          = "error"
	CodeEventEnd            = "end_of_execution"
)

// CodeRequest runs code in a code-interpreter-v1 sandbox. Language picks
// that language's default context (python when empty; javascript, r,
// bash); ContextID a context made with the E2B SDK's createCodeContext.
// EnvVars apply to this run only. Timeout interrupts the run (0: the
// server's default, 5 minutes; at most an hour).
type CodeRequest struct {
	Code      string
	Language  string
	ContextID string
	EnvVars   map[string]string
	Timeout   time.Duration
}

// CodeResult is one rich result: a value's representations by format.
// PNG, JPEG and PDF are base64; JSON, Data and Chart are raw JSON;
// formats without a field of their own are in Extra by MIME type.
type CodeResult struct {
	IsMainResult bool                       `json:"is_main_result"`
	Text         string                     `json:"text,omitempty"`
	HTML         string                     `json:"html,omitempty"`
	Markdown     string                     `json:"markdown,omitempty"`
	SVG          string                     `json:"svg,omitempty"`
	PNG          string                     `json:"png,omitempty"`
	JPEG         string                     `json:"jpeg,omitempty"`
	PDF          string                     `json:"pdf,omitempty"`
	LaTeX        string                     `json:"latex,omitempty"`
	JavaScript   string                     `json:"javascript,omitempty"`
	JSON         json.RawMessage            `json:"json,omitempty"`
	Data         json.RawMessage            `json:"data,omitempty"`
	Chart        json.RawMessage            `json:"chart,omitempty"`
	Extra        map[string]json.RawMessage `json:"extra,omitempty"`
}

// CodeError is the error a run raised: Name is the exception's type
// (ZeroDivisionError, TypeError, ExitCode for bash), or TimeoutError when
// the run was interrupted at its timeout.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

func (e *CodeError) Error() string { return e.Name + ": " + e.Value }

// CodeEvent is one event of a run, in the order the interpreter sent it.
type CodeEvent struct {
	Type           string      // a CodeEvent* constant
	Text           string      // stdout, stderr
	Timestamp      string      // stdout, stderr
	ExecutionCount int         // number_of_executions
	Result         *CodeResult // result
	Error          *CodeError  // error
}

// Execution is what a run produced. A run whose code raised is not an
// error of RunCode: Error says so.
type Execution struct {
	Results        []CodeResult
	Stdout, Stderr []string
	Error          *CodeError
	ExecutionCount int
}

// Text is the main result's text ("" when the code had no value).
func (e *Execution) Text() string {
	for _, r := range e.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

// RunCode runs code in the sandbox's code interpreter (template
// code-interpreter-v1) and returns once it has finished. Contexts keep
// their state (variables, imports) from one run to the next. fn, if not
// nil, sees each event as it arrives (stdout while the code still runs);
// an error from fn ends the run (the server interrupts the code). The
// stream is not resumed: a cut connection is an error, and the code was
// interrupted.
func (c *SandboxConn) RunCode(ctx context.Context, req CodeRequest, fn func(CodeEvent) error) (*Execution, error) {
	u, err := c.url("/code")
	if err != nil {
		return nil, err
	}
	body := map[string]any{"code": req.Code}
	if req.Language != "" {
		body["language"] = req.Language
	}
	if req.ContextID != "" {
		body["context_id"] = req.ContextID
	}
	if len(req.EnvVars) > 0 {
		body["env_vars"] = req.EnvVars
	}
	if req.Timeout > 0 {
		body["timeout_ms"] = max(req.Timeout.Milliseconds(), 1)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h := http.Header{"Accept": {"text/event-stream"}}
	resp, err := c.r.do(ctx, request{method: http.MethodPost, url: u, json: body, header: h, stream: true})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		return nil, fmt.Errorf("POST %s: expected text/event-stream, got %q", redact(u), ct)
	}
	ex := &Execution{}
	p := newSSEParser(resp.Body, maxCodeEvent)
	for {
		sev, err := p.next()
		if err != nil {
			if ctx.Err() != nil {
				return ex, ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return ex, fmt.Errorf("code run: stream ended before end_of_execution: %w", err)
		}
		ev, err := decodeCodeEvent(sev)
		if err != nil {
			return ex, err
		}
		switch ev.Type {
		case CodeEventExecutionCount:
			ex.ExecutionCount = ev.ExecutionCount
		case CodeEventStdout:
			ex.Stdout = append(ex.Stdout, ev.Text)
		case CodeEventStderr:
			ex.Stderr = append(ex.Stderr, ev.Text)
		case CodeEventResult:
			ex.Results = append(ex.Results, *ev.Result)
		case CodeEventError:
			ex.Error = ev.Error
		}
		if fn != nil {
			if err := fn(ev); err != nil {
				return ex, err
			}
		}
		if ev.Type == CodeEventEnd {
			return ex, nil
		}
	}
}

func decodeCodeEvent(sev sseEvent) (CodeEvent, error) {
	ev := CodeEvent{Type: sev.Type}
	var err error
	switch sev.Type {
	case CodeEventExecutionCount:
		var v struct {
			N int `json:"execution_count"`
		}
		err = json.Unmarshal(sev.Data, &v)
		ev.ExecutionCount = v.N
	case CodeEventStdout, CodeEventStderr:
		var v struct{ Text, Timestamp string }
		err = json.Unmarshal(sev.Data, &v)
		ev.Text, ev.Timestamp = v.Text, v.Timestamp
	case CodeEventResult:
		ev.Result = &CodeResult{}
		err = json.Unmarshal(sev.Data, ev.Result)
	case CodeEventError:
		ev.Error = &CodeError{}
		err = json.Unmarshal(sev.Data, ev.Error)
	}
	if err != nil {
		return ev, fmt.Errorf("code run: decode %s event: %w", sev.Type, err)
	}
	return ev, nil
}
