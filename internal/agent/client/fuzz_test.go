package client

import (
	"bytes"
	"io"
	"sync"
	"testing"

	"github.com/space-sandbox/space/internal/agent"
)

// FuzzEventReader feeds arbitrary bytes as an event stream: the reader must
// never panic, never return an event breaking the protocol, and stop at the
// first error.
func FuzzEventReader(f *testing.F) {
	f.Add(append(frame(1, agent.EventStdout, []byte("hi")), frame(2, agent.EventExit, []byte(`{"exit_code":0}`))...), uint64(0))
	f.Add(frame(5, agent.EventStderr, []byte("x")), uint64(4))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 1, 0xff, 0xff, 0xff, 0xff}, uint64(0))
	f.Add([]byte{}, uint64(0))
	var pool sync.Pool // shared across inputs: a reused buffer must not leak a stream into the next
	f.Fuzz(func(t *testing.T, data []byte, after uint64) {
		er := newEventReader(io.NopCloser(bytes.NewReader(data)), after, &pool)
		last := after
		for {
			ev, err := er.Next()
			if err != nil {
				if _, err2 := er.Next(); err2 != err {
					t.Fatalf("error not sticky: %v then %v", err, err2)
				}
				return
			}
			if ev.Seq != last+1 || len(ev.Data) > agent.MaxEventPayload || ev.Type < agent.EventStdout || ev.Type > agent.EventExit {
				t.Fatalf("bad event accepted: seq %d after %d, type %d, %d bytes", ev.Seq, last, ev.Type, len(ev.Data))
			}
			last = ev.Seq
			if ev.Type == agent.EventExit {
				ExitStatus(ev)
			}
		}
	})
}

// TestEventReaderPool: a reader handed back after its exit event serves
// the next stream from that stream's start, with nothing of the last.
func TestEventReaderPool(t *testing.T) {
	var pool sync.Pool
	stream := func(out string) []byte {
		return append(frame(1, agent.EventStdout, []byte(out)), frame(2, agent.EventExit, []byte(`{"exit_code":0}`))...)
	}
	var first *EventReader
	for i, out := range []string{"one", "two"} {
		// Trailing bytes after the exit event stay unread in a buffer
		// that goes back to the pool: they must not reach the next stream.
		er := newEventReader(io.NopCloser(bytes.NewReader(append(stream(out), "junk"...))), 0, &pool)
		if i == 0 {
			first = er
		}
		ev, err := er.Next()
		if err != nil || string(ev.Data) != out {
			t.Fatalf("stream %d: %q, %v; want %q", i, ev.Data, err, out)
		}
		if ev, err := er.Next(); err != nil || ev.Type != agent.EventExit {
			t.Fatalf("stream %d: exit: %v %v", i, ev, err)
		}
		if _, err := er.Next(); err != io.EOF {
			t.Fatalf("stream %d after exit: %v, want io.EOF", i, err)
		}
		if er.br != nil {
			t.Fatalf("stream %d: buffer kept after the exit event", i)
		}
		_ = er.Close()
	}
	if first.br != nil {
		t.Error("first reader still holds a buffer")
	}
}
