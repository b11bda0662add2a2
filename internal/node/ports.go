package node

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/core"
)

// PublicPorts reports whether the sandbox's forwarded ports open without a
// token (core.Sandbox.PublicPorts).
func (s *Sandbox) PublicPorts() bool { return s.publicPorts }

// ListPorts returns the TCP ports something listens on inside the sandbox.
func (s *Sandbox) ListPorts(ctx context.Context) ([]agent.ListeningPort, error) {
	return s.Agent.ListPorts(ctx)
}

// DialPort opens a TCP connection to port on the sandbox's loopback. The
// agent dials from inside the sandbox, so this works the same for every
// driver and the host never joins the sandbox's network. While the
// connection is open the sandbox counts as active (auto-pause).
func (s *Sandbox) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if s.gone.Load() {
		return nil, fmt.Errorf("sandbox %s is being deleted: %w", s.ID, core.ErrNotFound)
	}
	if s.paused.Load() {
		return nil, fmt.Errorf("sandbox %s is paused: %w", s.ID, core.ErrConflict)
	}
	epoch := s.parkEpoch.Load()
	c, err := s.Agent.DialPort(ctx, port)
	if err != nil {
		return nil, err
	}
	s.lastActive.Store(time.Now().UnixNano())
	s.openTunnels.Add(1)
	return &countedConn{Conn: c, sb: s, epoch: epoch}, nil
}

// countedConn keeps Sandbox.openTunnels right however often it is closed.
type countedConn struct {
	net.Conn
	sb       *Sandbox
	epoch    uint64 // s.parkEpoch when it was opened or taken
	once     sync.Once
	detached atomic.Bool // parked (ParkPort): Close leaves the connection open
}

func (c *countedConn) Close() error {
	if !c.uncount() && c.detached.Load() {
		return nil // parked: the connection is no longer c's
	}
	return c.Conn.Close()
}

func (c *countedConn) uncount() bool {
	done := false
	c.once.Do(func() {
		c.sb.openTunnels.Add(-1)
		c.sb.lastActive.Store(time.Now().UnixNano())
		done = true
	})
	return done
}

// detach uncounts c and returns its connection, still open, for parking;
// nil when c was closed before.
func (c *countedConn) detach() net.Conn {
	c.detached.Store(true)
	if !c.uncount() {
		c.Conn.Close() // a Close raced with the parking: it wins
		return nil
	}
	return c.Conn
}

func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// maxParkedIdle is how long a parked connection may wait for its next
// request; an older one is closed rather than reused.
const maxParkedIdle = time.Minute

// parkedConn is a forwarded connection kept between requests
// (TakePort, ParkPort).
type parkedConn struct {
	conn  net.Conn // the agent's tunnel, not counted in openTunnels
	since time.Time
	epoch uint64
}

// TakePort is DialPort for a request/response protocol: it returns the
// connection to port that the last ParkPort kept, or a new one, and
// whether it was kept. Reusing it saves a new agent connection, its
// tunnel handshake and the server's accept for every request (the data
// plane's code route on the interpreter's port). A kept connection may
// have been closed by its server since: a caller whose request then gets
// no answer at all may retry it on a new one.
func (s *Sandbox) TakePort(ctx context.Context, port int) (conn net.Conn, reused bool, err error) {
	if !s.gone.Load() && !s.paused.Load() {
		s.parkMu.Lock()
		p, ok := s.parked[port]
		delete(s.parked, port)
		s.parkMu.Unlock()
		if ok {
			if p.epoch == s.parkEpoch.Load() && time.Since(p.since) < maxParkedIdle {
				s.lastActive.Store(time.Now().UnixNano())
				s.openTunnels.Add(1)
				return &countedConn{Conn: p.conn, sb: s, epoch: p.epoch}, true, nil
			}
			p.conn.Close()
		}
	}
	conn, err = s.DialPort(ctx, port) // or refuses with the reason
	return conn, false, err
}

// ParkPort keeps conn, a connection from TakePort or DialPort whose last
// answer was read to its end, for the next TakePort of port; it closes the
// one parked before. An idle parked connection is no activity (auto-pause)
// and is closed when the sandbox pauses or is captured.
func (s *Sandbox) ParkPort(port int, conn net.Conn) {
	cc, ok := conn.(*countedConn)
	if !ok || cc.sb != s || s.gone.Load() || s.paused.Load() || cc.epoch != s.parkEpoch.Load() {
		conn.Close()
		return
	}
	raw := cc.detach()
	if raw == nil {
		return // closed already
	}
	s.parkMu.Lock()
	old, had := s.parked[port]
	if s.parked == nil {
		s.parked = make(map[int]parkedConn)
	}
	s.parked[port] = parkedConn{conn: raw, since: time.Now(), epoch: cc.epoch}
	s.parkMu.Unlock()
	if had {
		old.conn.Close()
	}
}

// dropParked closes the parked connections: the sandbox is being frozen,
// captured or destroyed, and a tunnel across that may hang or be dead.
// Connections in use when it runs are not parked afterwards (epoch).
func (s *Sandbox) dropParked() {
	s.parkEpoch.Add(1)
	s.parkMu.Lock()
	parked := s.parked
	s.parked = nil
	s.parkMu.Unlock()
	for _, p := range parked {
		p.conn.Close()
	}
}
