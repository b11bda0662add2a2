package node

import (
	"context"
	"fmt"
	"net"
	"sync"
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
	c, err := s.Agent.DialPort(ctx, port)
	if err != nil {
		return nil, err
	}
	s.lastActive.Store(time.Now().UnixNano())
	s.openTunnels.Add(1)
	return &countedConn{Conn: c, sb: s}, nil
}

// countedConn keeps Sandbox.openTunnels right however often it is closed.
type countedConn struct {
	net.Conn
	sb   *Sandbox
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.sb.openTunnels.Add(-1)
		c.sb.lastActive.Store(time.Now().UnixNano())
	})
	return c.Conn.Close()
}

func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}
