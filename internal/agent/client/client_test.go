package client

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeAgent serves h and returns a client for it.
func fakeAgent(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	c := New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	})
	t.Cleanup(func() {
		c.Close()
		srv.Close()
	})
	return c
}

func frame(seq uint64, typ byte, data []byte) []byte {
	b := make([]byte, agent.FrameHeaderSize, agent.FrameHeaderSize+len(data))
	binary.BigEndian.PutUint64(b, seq)
	b[8] = typ
	binary.BigEndian.PutUint32(b[9:], uint32(len(data)))
	return append(b, data...)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func streamOf(frames ...[]byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", agent.EventsContentType)
		for _, f := range frames {
			w.Write(f)
		}
	}
}

func readAll(er *EventReader) ([]agent.Event, error) {
	var evs []agent.Event
	for {
		ev, err := er.Next()
		if err == io.EOF {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
}

func TestEventsValid(t *testing.T) {
	var gotAfter string
	c := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		gotAfter = r.URL.Query().Get("after")
		if r.URL.Path != "/v1/processes/7/events" {
			http.NotFound(w, r)
			return
		}
		streamOf(frame(4, agent.EventStdout, []byte("a")), frame(5, agent.EventStderr, nil), frame(6, agent.EventExit, []byte(`{"exit_code":2}`)))(w, r)
	})
	er, err := c.Events(ctxT(t), "7", 3)
	if err != nil {
		t.Fatal(err)
	}
	defer er.Close()
	evs, err := readAll(er)
	if err != nil || len(evs) != 3 || gotAfter != "3" {
		t.Fatalf("events %v, %v, after %q", evs, err, gotAfter)
	}
	if e, err := ExitStatus(evs[2]); err != nil || e.Code != 2 {
		t.Errorf("exit %+v %v", e, err)
	}
	if _, err := ExitStatus(evs[0]); err == nil {
		t.Error("ExitStatus of a stdout event")
	}
	if _, err := er.Next(); err != io.EOF {
		t.Errorf("after exit: %v", err)
	}
}

func TestEventsMalformed(t *testing.T) {
	huge := make([]byte, agent.FrameHeaderSize)
	binary.BigEndian.PutUint64(huge, 1)
	huge[8] = agent.EventStdout
	binary.BigEndian.PutUint32(huge[9:], agent.MaxEventPayload+1)
	cases := map[string]struct {
		h    http.HandlerFunc
		want error
	}{
		"gap":           {streamOf(frame(1, 1, nil), frame(3, 1, nil)), ErrBadFrame},
		"repeat":        {streamOf(frame(1, 1, nil), frame(1, 1, nil)), ErrBadFrame},
		"not from 1":    {streamOf(frame(2, 1, nil)), ErrBadFrame},
		"zero seq":      {streamOf(frame(0, 1, nil)), ErrBadFrame},
		"bad type":      {streamOf(frame(1, 9, nil)), ErrBadFrame},
		"huge":          {streamOf(huge), ErrBadFrame},
		"truncated":     {streamOf(frame(1, 1, []byte("abcdef"))[:16]), io.ErrUnexpectedEOF},
		"short header":  {streamOf([]byte{0, 0, 0}), io.ErrUnexpectedEOF},
		"no exit event": {streamOf(frame(1, 1, []byte("x"))), io.ErrUnexpectedEOF},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := fakeAgent(t, tc.h)
			er, err := c.Events(ctxT(t), "1", 0)
			if err != nil {
				t.Fatal(err)
			}
			defer er.Close()
			_, err = readAll(er)
			if !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if _, err2 := er.Next(); err2 == nil || err2 == io.EOF {
				t.Errorf("Next after error = %v", err2)
			}
		})
	}
	c := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello")) })
	if _, err := c.Events(ctxT(t), "1", 0); !errors.Is(err, ErrBadFrame) {
		t.Errorf("wrong content type: %v", err)
	}
}

func TestErrors(t *testing.T) {
	c := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("path") {
		case "/404":
			w.WriteHeader(404)
			w.Write([]byte(`{"error":{"code":"not_found","message":"no\nsuch file"}}`))
		case "/410":
			w.WriteHeader(410)
			w.Write([]byte(`{"error":{"code":"events_gone","message":"gone"}}`))
		case "/html":
			w.WriteHeader(502)
			w.Write([]byte("<html>bad gateway</html>"))
		case "/huge":
			w.WriteHeader(400)
			w.Write([]byte(`{"error":{"code":"bad_request","message":"` + strings.Repeat("x", 10<<20) + `"}}`))
		case "/bigjson":
			w.Write([]byte(`{"name":"` + strings.Repeat("x", 5<<20) + `"}`))
		}
	})
	ctx := ctxT(t)
	_, err := c.Stat(ctx, "/404")
	var e *Error
	if !errors.As(err, &e) || !IsNotFound(err) || e.Code != "not_found" || e.Message != "no such file" {
		t.Errorf("404: %#v", err)
	}
	if _, err := c.Stat(ctx, "/410"); !IsGone(err) || !HasCode(err, "events_gone") || IsNotFound(err) {
		t.Errorf("410: %v", err)
	}
	if _, err := c.Stat(ctx, "/html"); !errors.As(err, &e) || e.Code != "http_502" || e.Status != 502 {
		t.Errorf("html: %v", err)
	}
	if _, err := c.Stat(ctx, "/huge"); !IsBadRequest(err) || !errors.As(err, &e) || len(e.Message) > maxErrorMessage {
		t.Errorf("huge error: %v", err)
	}
	if _, err := c.Stat(ctx, "/bigjson"); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("big JSON: %v", err)
	}
	if IsNotFound(errors.New("x")) || IsConflict(nil) {
		t.Error("helpers match non-agent errors")
	}
}

func TestRequests(t *testing.T) {
	type seen struct{ method, path, query, body, ctype string }
	got := make(chan seen, 10)
	c := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.Path, r.URL.RawQuery, string(b), r.Header.Get("Content-Type")}
		if r.Method == http.MethodPost && r.URL.Path == "/v1/processes" {
			w.WriteHeader(201)
			w.Write([]byte(`{"id":"1","pid":5,"argv":["true"],"running":true}`))
			return
		}
		w.WriteHeader(204)
	})
	ctx := ctxT(t)
	info, err := c.Start(ctx, agent.ProcessSpec{Argv: []string{"true"}})
	if err != nil || info.ID != "1" || info.PID != 5 {
		t.Fatalf("Start = %+v, %v", info, err)
	}
	if s := <-got; s.body != `{"argv":["true"]}` || s.ctype != "application/json" {
		t.Errorf("start request %+v", s)
	}
	c.Signal(ctx, "1", "SIGTERM")
	if s := <-got; s.path != "/v1/processes/1/signal" || s.body != `{"signal":"SIGTERM"}` {
		t.Errorf("signal request %+v", s)
	}
	c.Upload(ctx, "/a b", 0o4755, strings.NewReader("data"))
	if s := <-got; s.method != "PUT" || s.query != "mode=4755&path=%2Fa+b" || s.body != "data" {
		t.Errorf("upload request %+v", s)
	}
	c.Remove(ctx, "/x", true)
	if s := <-got; s.method != "DELETE" || s.query != "path=%2Fx&recursive=true" {
		t.Errorf("remove request %+v", s)
	}
	c.Resize(ctx, "../1", 80, 24) // ids are escaped into one path segment
	if s := <-got; s.path != "/v1/processes/../1/resize" && s.path != "/v1/processes/..%2F1/resize" {
		t.Errorf("resize request %+v", s)
	}
	// Stdin larger than one request's limit is split.
	if err := c.WriteStdin(ctx, "1", make([]byte, agent.MaxStdinChunk+10)); err != nil {
		t.Fatal(err)
	}
	if a, b := <-got, <-got; len(a.body) != agent.MaxStdinChunk || len(b.body) != 10 {
		t.Errorf("stdin chunks %d, %d", len(a.body), len(b.body))
	}
}

func TestStartEvents(t *testing.T) {
	info := []byte(`{"id":"4","pid":9,"argv":["true"],"pty":false,"running":true}`)
	var accept string
	c := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		accept = r.Header.Get("Accept")
		if r.Method != http.MethodPost || r.URL.Path != "/v1/processes" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", agent.EventsContentType)
		w.WriteHeader(http.StatusCreated)
		w.Write(frame(0, agent.EventStarted, info))
		w.(http.Flusher).Flush()
		time.Sleep(50 * time.Millisecond) // the start's ctx ends meanwhile
		w.Write(frame(1, agent.EventStdout, []byte("hi")))
		w.Write(frame(2, agent.EventExit, []byte(`{"exit_code":0}`)))
	})
	// The start's ctx ends once the process runs: the stream lives on in
	// the stream's ctx.
	ctx, cancel := context.WithCancel(ctxT(t))
	got, er, err := c.StartEvents(ctx, ctxT(t), agent.ProcessSpec{Argv: []string{"true"}})
	cancel()
	if err != nil || er == nil {
		t.Fatalf("StartEvents: %v, reader %v", err, er)
	}
	defer er.Close()
	if accept != agent.EventsContentType || got.ID != "4" || got.PID != 9 {
		t.Fatalf("info %+v, Accept %q", got, accept)
	}
	evs, err := readAll(er)
	if err != nil || len(evs) != 2 || string(evs[0].Data) != "hi" || evs[1].Type != agent.EventExit {
		t.Fatalf("events %v, %v", evs, err)
	}
}

// An agent from before the combined call answers JSON: the caller gets
// the info and no reader, and follows with Events.
func TestStartEventsOldAgent(t *testing.T) {
	c := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":"2","pid":5,"argv":["true"],"running":true}`))
	})
	got, er, err := c.StartEvents(ctxT(t), ctxT(t), agent.ProcessSpec{Argv: []string{"true"}})
	if err != nil || er != nil || got.ID != "2" {
		t.Fatalf("info %+v, reader %v, %v", got, er, err)
	}
}

func TestStartEventsMalformed(t *testing.T) {
	info := []byte(`{"id":"1"}`)
	cases := map[string]struct {
		h    http.HandlerFunc
		want error
	}{
		"no started frame": {startedWith(frame(1, agent.EventStdout, nil)), ErrBadFrame},
		"started seq 1":    {startedWith(frame(1, agent.EventStarted, info)), ErrBadFrame},
		"not json":         {startedWith(frame(0, agent.EventStarted, []byte("{"))), ErrBadFrame},
		"truncated":        {startedWith(frame(0, agent.EventStarted, info)[:15]), io.ErrUnexpectedEOF},
		"started twice":    {startedWith(frame(0, agent.EventStarted, info), frame(0, agent.EventStarted, info)), ErrBadFrame},
		"wrong type":       {func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated); w.Write([]byte("x")) }, ErrBadFrame},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := fakeAgent(t, tc.h)
			_, er, err := c.StartEvents(ctxT(t), ctxT(t), agent.ProcessSpec{Argv: []string{"true"}})
			if err == nil {
				defer er.Close()
				_, err = readAll(er)
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
	// An error answer is the agent's error, as for Start.
	c := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"error":{"code":"invalid_cwd","message":"no"}}`))
	})
	if _, _, err := c.StartEvents(ctxT(t), ctxT(t), agent.ProcessSpec{Argv: []string{"true"}}); !IsBadRequest(err) {
		t.Errorf("400: %v", err)
	}
}

func startedWith(frames ...[]byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", agent.EventsContentType)
		w.WriteHeader(http.StatusCreated)
		for _, f := range frames {
			w.Write(f)
		}
	}
}
