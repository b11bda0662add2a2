package client

import (
	"bytes"
	"io"
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
	f.Fuzz(func(t *testing.T, data []byte, after uint64) {
		er := newEventReader(io.NopCloser(bytes.NewReader(data)), after)
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
