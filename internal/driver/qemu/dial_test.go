package qemu

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/driver/qemu/vmux"
)

// fakeGuest serves vmux handshakes on a unix socket: the nth connection
// (from 1) gets the answer when answer(n) says so, else silence. It
// returns the socket path and the count of connections.
func fakeGuest(t *testing.T, answer func(n int32) bool) (string, *atomic.Int32) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns := new(atomic.Int32)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := conns.Add(1)
			go func() {
				defer c.Close()
				buf := make([]byte, len(vmux.Magic))
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if answer(n) {
					_, _ = c.Write(vmux.Magic)
				}
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	return sock, conns
}

// TestDialSessionRetriesSlowHandshake: a guest that does not answer the
// first handshake within its bound (CI: "vmux: handshake: ... i/o timeout"
// after a restore under TCG) is tried again with a longer bound instead
// of failing the caller's request.
func TestDialSessionRetriesSlowHandshake(t *testing.T) {
	sock, conns := fakeGuest(t, func(n int32) bool { return n > 1 })
	start := time.Now()
	s, err := dialSession(context.Background(), sock)
	if err != nil {
		t.Fatalf("dialSession: %v (after %d connections)", err, conns.Load())
	}
	defer s.Close()
	if got := conns.Load(); got != 2 {
		t.Errorf("%d connections, want 2 (one timed out, one answered)", got)
	}
	if d := time.Since(start); d < handshakeTimeout {
		t.Errorf("answered after %v, before the first bound (%v) ran out", d, handshakeTimeout)
	}
}

// TestDialSessionGivesUp: a guest that never answers fails after the
// attempts, within the caller's deadline when it is shorter.
func TestDialSessionGivesUp(t *testing.T) {
	sock, _ := fakeGuest(t, func(int32) bool { return false })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := dialSession(ctx, sock); err == nil || !isTimeout(err) {
		t.Fatalf("dialSession to a silent guest: %v, want a timeout", err)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("gave up after %v, past the caller's 3 s deadline", d)
	}
}
