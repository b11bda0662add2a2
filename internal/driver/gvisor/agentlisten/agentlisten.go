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
	"time"

	"github.com/space-sandbox/space/internal/driver/swaplisten"
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
	*swaplisten.Listener
	path string
}

// Listen listens on the unix socket at path.
func Listen(path string) (*Listener, error) {
	_ = os.Remove(path + MarkerSuffix)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	return &Listener{Listener: swaplisten.New(l, nil), path: path}, nil
}

// Release closes the listening socket and marks it released; a goroutine
// listens again once the marker is removed.
func (l *Listener) Release() error {
	err := l.Suspend(func() error {
		_ = os.Remove(l.path) // unix listeners unlink their socket file; make sure
		if err := os.WriteFile(l.path+MarkerSuffix, nil, 0o600); err != nil {
			return fmt.Errorf("agentlisten: %w", err)
		}
		return nil
	})
	switch {
	case errors.Is(err, swaplisten.ErrSuspended):
		return nil
	case errors.Is(err, net.ErrClosed):
		return err
	}
	// Also when the marker could not be written: with no marker the
	// listener comes back at the next poll, and the driver sees the error.
	go l.reacquire()
	return err
}

func (l *Listener) reacquire() {
	t := time.NewTicker(PollInterval)
	defer t.Stop()
	for {
		select {
		case <-l.Done():
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
		l.Resume(nl)
		return
	}
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
