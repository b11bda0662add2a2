// Package swaplisten is the agent-side listener both drivers' checkpoint
// protocols build on: a net.Listener whose socket can be taken away
// (Suspend) and later replaced by another (Resume) while the HTTP
// server's Accept loop waits across the gap instead of failing. The
// gvisor driver's agentlisten re-listens on the same path itself; the
// namespace driver's agenthandoff receives a new listener from the host.
package swaplisten

import (
	"errors"
	"net"
	"sync"
)

// ErrSuspended is Suspend's answer while the listener is suspended.
var ErrSuspended = errors.New("swaplisten: listener already suspended")

// Listener wraps the current socket. Its zero value is not usable: New.
type Listener struct {
	mu     sync.Mutex
	cur    net.Listener
	ready  chan struct{} // closed when cur serves again; nil while serving
	closed bool
	done   chan struct{}
	// track, if set, is called under mu with every connection Accept
	// hands out and returns what Accept returns (a wrapper that can be
	// closed at the next Suspend).
	track func(net.Conn) net.Conn
}

var _ net.Listener = (*Listener)(nil)

// New wraps l. track, if not nil, sees every accepted connection under
// the listener's lock (so a Suspend's fn sees it too) and returns what
// Accept hands out.
func New(l net.Listener, track func(net.Conn) net.Conn) *Listener {
	return &Listener{cur: l, done: make(chan struct{}), track: track}
}

// Accept implements net.Listener: it waits while suspended, and drops a
// connection that the old socket accepted as it was being suspended.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		cur, ready := l.cur, l.ready
		l.mu.Unlock()
		if ready != nil {
			select {
			case <-ready:
				continue
			case <-l.done:
				return nil, net.ErrClosed
			}
		}
		c, err := cur.Accept()
		l.mu.Lock()
		if err != nil {
			again := !l.closed && (l.ready != nil || l.cur != cur)
			l.mu.Unlock()
			if again {
				continue
			}
			return nil, err
		}
		if l.closed || l.ready != nil || l.cur != cur {
			// Accepted just as the socket was taken away: the
			// connection belongs to the old socket and goes with it.
			l.mu.Unlock()
			_ = c.Close()
			if l.isClosed() {
				return nil, net.ErrClosed
			}
			continue
		}
		if l.track != nil {
			c = l.track(c)
		}
		l.mu.Unlock()
		return c, nil
	}
}

func (l *Listener) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// Suspend closes the current socket and makes Accept wait for Resume.
// fn, if not nil, runs under the listener's lock after the socket is
// closed (to close tracked connections, to leave a marker); an error
// from it is returned, the listener stays suspended.
func (l *Listener) Suspend(fn func() error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return net.ErrClosed
	}
	if l.ready != nil {
		return ErrSuspended
	}
	l.ready = make(chan struct{})
	_ = l.cur.Close()
	if fn != nil {
		return fn()
	}
	return nil
}

// Suspended reports whether the listener waits for Resume.
func (l *Listener) Suspended() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ready != nil
}

// Resume serves on nl from now on. It reports false, and closes nl, if
// the listener was closed meanwhile or is not suspended.
func (l *Listener) Resume(nl net.Listener) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.ready == nil {
		_ = nl.Close()
		return false
	}
	l.cur = nl
	close(l.ready)
	l.ready = nil
	return true
}

// Done is closed once the listener is closed.
func (l *Listener) Done() <-chan struct{} { return l.done }

// Close implements net.Listener.
func (l *Listener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.done)
	if l.ready != nil {
		return nil // suspended: cur is closed already
	}
	return l.cur.Close()
}

// Addr implements net.Listener: the current socket's address (the
// closed one's while suspended).
func (l *Listener) Addr() net.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur.Addr()
}
