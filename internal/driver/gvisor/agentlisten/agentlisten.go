// Package agentlisten is the agent's side of the gvisor driver's
// checkpoint protocol. gVisor cannot save a sandbox while a process holds a
// listening host unix socket (the agent's, with --host-uds=create), so
// before `runsc checkpoint` the driver asks the agent to release it:
//
//	POST /v1/listener/release   the agent closes its listening socket,
//	                            removes the socket file, creates
//	                            <socket>.released and answers 204
//
// While released, the agent polls for <socket>.released every
// PollInterval and listens again once it is gone. A sandbox restored from
// the checkpoint has a fresh, empty socket dir, so its agent listens again
// at once; after a failed checkpoint the driver removes the marker.
//
// Use Listen instead of net.Listen and serve Handler(h) instead of h.
package agentlisten

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// ReleasePath is the HTTP route that releases the listener.
const ReleasePath = "/v1/listener/release"

// MarkerSuffix is appended to the socket path to name the released marker.
const MarkerSuffix = ".released"

// PollInterval is how often a released listener looks for its marker.
const PollInterval = 10 * time.Millisecond

// Listener is a unix-socket listener that can be released and re-acquired
// without its Accept callers noticing.
type Listener struct {
	path string

	mu       sync.Mutex
	cur      net.Listener
	released bool
	ready    chan struct{} // closed when cur is listening again
	closed   bool
	done     chan struct{}
}

var _ net.Listener = (*Listener)(nil)

// Listen listens on the unix socket at path.
func Listen(path string) (*Listener, error) {
	_ = os.Remove(path + MarkerSuffix)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	return &Listener{path: path, cur: l, done: make(chan struct{})}, nil
}

// Accept implements net.Listener; it waits across a release.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		cur, released, ready := l.cur, l.released, l.ready
		l.mu.Unlock()
		if released {
			select {
			case <-ready:
				continue
			case <-l.done:
				return nil, net.ErrClosed
			}
		}
		c, err := cur.Accept()
		if err == nil {
			return c, nil
		}
		l.mu.Lock()
		again := l.released || l.cur != cur
		l.mu.Unlock()
		if !again {
			return nil, err
		}
	}
}

// Release closes the listening socket and marks it released; a goroutine
// listens again once the marker is removed.
func (l *Listener) Release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return net.ErrClosed
	}
	if l.released {
		return nil
	}
	l.released = true
	l.ready = make(chan struct{})
	_ = l.cur.Close() // unix listeners unlink their socket file
	_ = os.Remove(l.path)
	if err := os.WriteFile(l.path+MarkerSuffix, nil, 0o600); err != nil {
		return fmt.Errorf("agentlisten: %w", err)
	}
	go l.reacquire(l.ready)
	return nil
}

func (l *Listener) reacquire(ready chan struct{}) {
	t := time.NewTicker(PollInterval)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
		}
		if _, err := os.Stat(l.path + MarkerSuffix); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		_ = os.Remove(l.path)
		nl, err := net.Listen("unix", l.path)
		if err != nil {
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			nl.Close()
			return
		}
		l.cur, l.released = nl, false
		close(ready)
		l.mu.Unlock()
		return
	}
}

// Close implements net.Listener.
func (l *Listener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.done)
	return l.cur.Close()
}

// Addr implements net.Listener.
func (l *Listener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

// Handler serves ReleasePath and passes everything else to h.
func (l *Listener) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != ReleasePath {
			h.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		if err := l.Release(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}
