package agent_test

import (
	"io"
	"strconv"
	"testing"

	"github.com/space-sandbox/space/internal/agent"
)

// BenchmarkExecTrue measures one command's round trip: start `true`, read
// its events to the exit event.
func BenchmarkExecTrue(b *testing.B) {
	a := startAgent(b, agent.Options{})
	ctx := testCtx(b)
	b.ReportAllocs()
	for b.Loop() {
		info, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"true"}})
		if err != nil {
			b.Fatal(err)
		}
		er, err := a.Events(ctx, info.ID, 0)
		if err != nil {
			b.Fatal(err)
		}
		for {
			_, err := er.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		er.Close()
	}
}

// BenchmarkStdoutThroughput streams 64 MiB of stdout per iteration from
// head(1) through the agent and the client.
func BenchmarkStdoutThroughput(b *testing.B) {
	const size = 64 << 20
	a := startAgent(b, agent.Options{})
	ctx := testCtx(b)
	b.SetBytes(size)
	for b.Loop() {
		info, err := a.Start(ctx, agent.ProcessSpec{Argv: []string{"head", "-c", strconv.Itoa(size), "/dev/zero"}})
		if err != nil {
			b.Fatal(err)
		}
		er, err := a.Events(ctx, info.ID, 0)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for {
			ev, err := er.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			if ev.Type == agent.EventStdout {
				n += len(ev.Data)
			}
		}
		er.Close()
		if n != size {
			b.Fatalf("got %d bytes", n)
		}
	}
}
