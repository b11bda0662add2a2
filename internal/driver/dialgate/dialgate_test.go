package dialgate

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func okConn() net.Conn {
	a, b := net.Pipe()
	b.Close()
	return a
}

// TestWaitsWhileClosed: a dial at a closed gate waits for Open and then
// dials; none is made before.
func TestWaitsWhileClosed(t *testing.T) {
	var g Gate
	g.Close()
	var calls atomic.Int32
	dial := func(context.Context) (net.Conn, error) { calls.Add(1); return okConn(), nil }
	done := make(chan error, 1)
	go func() {
		c, err := g.Dial(context.Background(), dial, time.Millisecond, time.Second)
		if c != nil {
			c.Close()
		}
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if calls.Load() != 0 {
		t.Fatalf("%d dials at a closed gate", calls.Load())
	}
	g.Open()
	if err := <-done; err != nil || calls.Load() != 1 {
		t.Fatalf("after Open: %v, %d dials", err, calls.Load())
	}
}

// TestRetriesAfterOpen: right after the gate opens, a dial that finds no
// listener yet is tried again until one listens.
func TestRetriesAfterOpen(t *testing.T) {
	var g Gate
	g.Close()
	g.Open()
	var calls atomic.Int32
	dial := func(context.Context) (net.Conn, error) {
		if calls.Add(1) < 3 {
			return nil, &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}
		}
		return okConn(), nil
	}
	c, err := g.Dial(context.Background(), dial, time.Millisecond, time.Second)
	if err != nil || calls.Load() != 3 {
		t.Fatalf("%v after %d dials, want a connection at the third", err, calls.Load())
	}
	c.Close()
}

// TestNoRetryWithoutCheckpoint: with no checkpoint, a refused dial fails
// at once, and other errors are never retried.
func TestNoRetryWithoutCheckpoint(t *testing.T) {
	var g Gate
	var calls atomic.Int32
	refused := func(context.Context) (net.Conn, error) {
		calls.Add(1)
		return nil, &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}
	}
	if _, err := g.Dial(context.Background(), refused, time.Millisecond, time.Second); !errors.Is(err, syscall.ECONNREFUSED) || calls.Load() != 1 {
		t.Fatalf("%v after %d dials, want ECONNREFUSED after one", err, calls.Load())
	}
	g.Close()
	g.Open()
	calls.Store(0)
	other := func(context.Context) (net.Conn, error) { calls.Add(1); return nil, syscall.EACCES }
	if _, err := g.Dial(context.Background(), other, time.Millisecond, time.Second); !errors.Is(err, syscall.EACCES) || calls.Load() != 1 {
		t.Fatalf("%v after %d dials, want EACCES after one", err, calls.Load())
	}
	// Past relisten, refused fails again.
	calls.Store(0)
	if _, err := g.Dial(context.Background(), refused, time.Millisecond, 0); err == nil || calls.Load() != 1 {
		t.Fatalf("past relisten: %v after %d dials", err, calls.Load())
	}
}

// TestDeadlineWhileClosed: the caller's deadline ends the wait.
func TestDeadlineWhileClosed(t *testing.T) {
	var g Gate
	g.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err := g.Dial(ctx, func(context.Context) (net.Conn, error) { return okConn(), nil }, time.Millisecond, time.Second)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v, want the deadline", err)
	}
}
