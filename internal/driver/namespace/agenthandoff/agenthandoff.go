// Package agenthandoff is the agent's side of the namespace driver's CRIU
// checkpoint. The agent serves on a listening unix socket that the driver
// made in the host's network namespace; CRIU collects sockets per network
// namespace and cannot dump that one, nor any connection accepted from it.
// So before a dump the driver asks the agent to hand its listener off:
//
//	POST /v1/listener/handoff   the agent makes a socket pair (in its own
//	                            network namespace, which CRIU can dump),
//	                            answers {"fd": N} (N: one end's number),
//	                            then closes its listener and every
//	                            connection it accepted, this one last
//
// and waits on the pair's other end for a listener passed with
// SCM_RIGHTS. The driver takes end N out of the agent with pidfd_getfd
// (host root may) and sends a new listener through it: into the same
// agent once the dump is written, or into an agent restored from the
// image, which waits in the same place. Nothing from inside the sandbox
// can reach the pair: it is unnamed.
//
// Use New on the listener the driver passed and serve Handler(h).
package agenthandoff

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"

	"github.com/space-sandbox/space/internal/driver/swaplisten"
	"golang.org/x/sys/unix"
)

// Path is the HTTP route that hands the listener off.
const Path = "/v1/listener/handoff"

// FD is the descriptor number the agent puts its end of the pair at when
// that number is free (a high one, which the agent's own descriptors do
// not reach), so that a driver which lost the answer (a timeout, a
// connection reset) still knows where to send the next listener.
const FD = 1021

// Reply is the route's answer.
type Reply struct {
	// FD is the agent's descriptor of the socket pair end the driver
	// sends the next listener through.
	FD int `json:"fd"`
}

// Listener is a net.Listener whose socket can be handed off and replaced
// without its Accept callers noticing.
type Listener struct {
	*swaplisten.Listener
	// conns are the accepted connections still open, guarded by the
	// swaplisten lock (track and handoff's closer run under it) and by
	// mu (a connection's own Close runs outside it).
	mu    sync.Mutex
	conns map[*conn]struct{}
}

// New wraps l.
func New(l net.Listener) *Listener {
	hl := &Listener{conns: map[*conn]struct{}{}}
	hl.Listener = swaplisten.New(l, hl.track)
	return hl
}

// conn is an accepted connection the listener tracks, to close it on a
// handoff.
type conn struct {
	net.Conn
	l    *Listener
	once sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

func (l *Listener) track(c net.Conn) net.Conn {
	tc := &conn{Conn: c, l: l}
	l.mu.Lock()
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	return tc
}

// handoff closes the listener and every tracked connection (keep last)
// and starts waiting for the next listener on a new socket pair; it
// returns the number of the end the driver sends through.
func (l *Listener) handoff(keep net.Conn) (int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("agenthandoff: socketpair: %w", err)
	}
	err = l.Suspend(func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		for c := range l.conns {
			if net.Conn(c) == keep {
				continue // closed by the handler once the answer is out
			}
			_ = c.Conn.Close()
			delete(l.conns, c)
		}
		return nil
	})
	if err != nil {
		_ = unix.Close(fds[0])
		_ = unix.Close(fds[1])
		if errors.Is(err, swaplisten.ErrSuspended) {
			return 0, errors.New("agenthandoff: listener already handed off")
		}
		return 0, err
	}
	fds[0] = fixedFD(fds[0])
	go l.receive(fds[1], fds[0])
	return fds[0], nil
}

// fixedFD moves fd to FD if nothing is there (F_DUPFD from FD gives FD
// exactly when it is free) and returns where it is.
func fixedFD(fd int) int {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, FD)
	if err != nil {
		return fd
	}
	if nfd != FD {
		_ = unix.Close(nfd)
		return fd
	}
	_ = unix.Close(fd)
	return nfd
}

// receive waits on end for a listener descriptor, then serves on it and
// closes the pair.
func (l *Listener) receive(end, other int) {
	defer unix.Close(end)
	defer unix.Close(other)
	buf := make([]byte, 16)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		_, oobn, _, _, err := unix.Recvmsg(end, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue // a restore or a signal interrupted the wait
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "agent: handoff: %v\n", err)
			return
		}
		fd := -1
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil && len(msgs) == 1 {
			if rights, err := unix.ParseUnixRights(&msgs[0]); err == nil && len(rights) == 1 {
				fd = rights[0]
			}
		}
		if fd < 0 {
			continue // not a listener: keep waiting
		}
		f := os.NewFile(uintptr(fd), "listener")
		nl, err := net.FileListener(f)
		_ = f.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "agent: handoff: %v\n", err)
			continue
		}
		l.Resume(nl) // closes nl if the listener was closed meanwhile
		return
	}
}

// Handler serves Path and passes everything else to h.
func (l *Listener) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != Path {
			h.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		hj, ok := w.(http.Hijacker)
		if !ok {
			http.Error(w, "cannot hijack", http.StatusInternalServerError)
			return
		}
		c, bw, err := hj.Hijack()
		if err != nil {
			return
		}
		// Hijacked: the answer is written by hand, and this connection is
		// closed after every other, so that its EOF tells the driver the
		// agent holds no socket of the host's any more.
		fd, err := l.handoff(c)
		var body []byte
		status := "200 OK"
		if err != nil {
			status = "500 Internal Server Error"
			body, _ = json.Marshal(map[string]string{"error": err.Error()})
		} else {
			body, _ = json.Marshal(Reply{FD: fd})
		}
		_, _ = fmt.Fprintf(bw, "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", status, len(body), body)
		_ = bw.Flush()
		_ = c.Close()
	})
}
