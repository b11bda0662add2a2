package dataplane

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/httpx"
)

func TestDecodeCodeRequest(t *testing.T) {
	for body, want := range map[string]int{
		`{"code":"1"}`: 0,
		`{"code":"1","language":"r","env_vars":{"A":"b"},"timeout_ms":1000}`: 0,
		`{"code":"1","language":"python","context_id":"c"}`:                  400,
		`{"code":"1","env_vars":{"A=B":"x"}}`:                                400,
		`{"code":"1","env_vars":{"A":"x\u0000"}}`:                            400,
		`{"code":"1","timeout_ms":-1}`:                                       400,
		`{"code":"1","timeout_ms":3600001}`:                                  400,
		`{"code":"1","bogus":1}`:                                             400,
		`{"code":"` + strings.Repeat("x", maxCodeBytes+1) + `"}`:             413,
	} {
		_, err := decodeCodeRequest([]byte(body))
		st := 0
		if err != nil {
			st, _, _ = httpx.StatusOf(err)
		}
		if st != want {
			t.Errorf("%.80s: status %d (%v), want %d", body, st, err, want)
		}
	}
}

// The interpreter runs inside the sandbox: what it streams is checked
// before it reaches SSE (JSON objects of known types, compacted, so no
// line of it can end an SSE event early).
func TestStreamCodeEvents(t *testing.T) {
	in := strings.Join([]string{
		`{"type": "stdout", "text": "a\nb", "timestamp": "t"}`,
		`not json`,
		`{"type":"keepalive"}`,
		"{\"type\":\r\"result\",\"is_main_result\":true,\"text\":\"2\"}",
		`{"type":"injected\n\nevent: x"}`,
		`{"type":"surprise"}`,
		`{"type":"end_of_execution"}`,
		`{"type":"stdout","text":"after the end"}`,
	}, "\n") + "\n"
	w := httptest.NewRecorder()
	ctx := context.Background()
	// A line after end_of_execution: the connection is out of step.
	if streamCodeEvents(ctx, ctx, w, bufio.NewReader(strings.NewReader(in)), time.Second) {
		t.Error("an answer with a line after end_of_execution was reported complete")
	}
	want := "event: stdout\ndata: {\"type\":\"stdout\",\"text\":\"a\\nb\",\"timestamp\":\"t\"}\n\n" +
		": keepalive\n\n" +
		"event: result\ndata: {\"type\":\"result\",\"is_main_result\":true,\"text\":\"2\"}\n\n" +
		"event: end_of_execution\ndata: {\"type\":\"end_of_execution\"}\n\n"
	if got := w.Body.String(); got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "text/event-stream" {
		t.Errorf("%d %q", w.Code, w.Header().Get("Content-Type"))
	}
}

func TestStreamCodeEventsEnds(t *testing.T) {
	for name, tc := range map[string]struct {
		in      string
		timeout bool
		want    string
	}{
		"cut":      {in: `{"type":"stdout","text":"x"}` + "\n", want: "InterpreterError"},
		"too long": {in: `{"type":"stdout","text":"` + strings.Repeat("x", maxCodeEventBytes) + `"}` + "\n", want: "OutputTooLarge"},
		"timeout":  {timeout: true, want: "TimeoutError"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		var rd *bufio.Reader
		if tc.timeout {
			cancel()
			rd = bufio.NewReader(blockingReader{})
		} else {
			rd = bufio.NewReader(strings.NewReader(tc.in))
		}
		w := httptest.NewRecorder()
		if streamCodeEvents(ctx, context.Background(), w, rd, time.Second) {
			t.Errorf("%s: reported complete", name)
		}
		cancel()
		body := w.Body.String()
		if !strings.Contains(body, `"name":"`+tc.want+`"`) || !strings.HasSuffix(body, "event: end_of_execution\ndata: {\"type\":\"end_of_execution\"}\n\n") {
			t.Errorf("%s: %.300q", name, body)
		}
	}
}

// An answer that ends right after end_of_execution leaves its connection
// reusable (the data plane parks it for the next run); one whose end does
// not follow does not.
func TestStreamCodeEventsComplete(t *testing.T) {
	ctx := context.Background()
	in := `{"type":"number_of_executions","execution_count":1}` + "\n" + `{"type":"end_of_execution"}` + "\n"
	if !streamCodeEvents(ctx, ctx, httptest.NewRecorder(), bufio.NewReader(strings.NewReader(in)), time.Second) {
		t.Error("a complete answer was not reported complete")
	}
	pr, pw := io.Pipe()
	defer pw.Close()
	go io.WriteString(pw, in) // then nothing: the body's end never comes
	start := time.Now()
	if streamCodeEvents(ctx, ctx, httptest.NewRecorder(), bufio.NewReader(pr), time.Second) {
		t.Error("an answer without its end was reported complete")
	}
	if d := time.Since(start); d > 10*answerEndWait {
		t.Errorf("waited %s for the end of the answer", d)
	}
}

// blockingReader returns nothing, as an interpreter still running code.
type blockingReader struct{}

func (blockingReader) Read([]byte) (int, error) {
	time.Sleep(10 * time.Millisecond)
	return 0, nil
}
