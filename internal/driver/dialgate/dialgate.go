// Package dialgate holds a sandbox's agent dials back while a checkpoint
// has taken the agent's listener away. Both drivers' checkpoints close the
// agent's listening socket for the dump (gVisor cannot save a host socket,
// CRIU cannot dump one of the host's network namespace), so a command
// started meanwhile (a periodic checkpoint beside a command) would be
// refused. The driver closes the gate before the listener goes and opens
// it once the sandbox runs again; Dial waits at a closed gate, and for a
// while after it opens retries a dial that finds no listener yet (the
// agent may need a moment to listen again).
package dialgate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"sync"
	"syscall"
	"time"
)

// Gate is one sandbox's gate. Its zero value is open.
type Gate struct {
	mu       sync.Mutex
	ch       chan struct{} // nil while open
	gen      uint64        // bumped at every Close
	reopened time.Time     // when the gate last opened after a Close
}

// Close makes Dial wait until Open.
func (g *Gate) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	g.gen++
}

// Open lets Dial through again. Harmless when open.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
		g.reopened = time.Now()
	}
}

func (g *Gate) state() (chan struct{}, uint64, time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ch, g.gen, g.reopened
}

// Dial calls dial once the gate is open. A dial that finds no listener
// (connection refused, no socket file) is tried again every poll while a
// Close came during it or the gate opened less than relisten ago; any
// other error, or one past that, is returned as is.
func (g *Gate) Dial(ctx context.Context, dial func(context.Context) (net.Conn, error), poll, relisten time.Duration) (net.Conn, error) {
	for {
		ch, gen, reopened := g.state()
		if ch != nil {
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, fmt.Errorf("waiting for a checkpoint to end: %w", ctx.Err())
			}
			continue
		}
		c, err := dial(ctx)
		if err == nil {
			return c, nil
		}
		if !noListener(err) {
			return nil, err
		}
		_, now, _ := g.state()
		if now == gen && (reopened.IsZero() || time.Since(reopened) >= relisten) {
			return nil, err
		}
		t := time.NewTimer(poll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
	}
}

func noListener(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, fs.ErrNotExist)
}
