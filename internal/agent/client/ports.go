package client

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/agent"
)

// ListPorts returns the TCP ports something listens on inside the sandbox.
func (c *Client) ListPorts(ctx context.Context) ([]agent.ListeningPort, error) {
	var out agent.PortList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/ports", nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	if len(out.Ports) > 4096 {
		return nil, fmt.Errorf("agent: %d ports listed", len(out.Ports))
	}
	return out.Ports, nil
}

// IsPortClosed reports whether DialPort failed because nothing listens on
// the port.
func IsPortClosed(err error) bool { return HasCode(err, agent.CodePortClosed) }

// tunnelHandshake bounds the agent's answer to a tunnel request.
const tunnelHandshake = 15 * time.Second

// DialPort opens a TCP connection to port on the sandbox's loopback,
// carried over a new agent connection (HTTP Upgrade to agent.TunnelProtocol).
// The returned conn is the raw stream; closing it closes the tunnel.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("agent: port %d out of range", port)
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("agent: dial for port %d: %w", port, err)
	}
	deadline := time.Now().Add(tunnelHandshake)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn.SetDeadline(deadline)
	// A cancelled ctx interrupts the handshake.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	nc, err := handshake(conn, port)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	return nc, nil
}

func handshake(conn net.Conn, port int) (net.Conn, error) {
	req := "GET /v1/ports/" + strconv.Itoa(port) + "/connect HTTP/1.1\r\nHost: agent\r\n" +
		"Connection: Upgrade\r\nUpgrade: " + agent.TunnelProtocol + "\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		return nil, fmt.Errorf("agent: port %d: %w", port, err)
	}
	br := bufio.NewReaderSize(conn, 32<<10)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, fmt.Errorf("agent: port %d: %w", port, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	if !strings.EqualFold(resp.Header.Get("Upgrade"), agent.TunnelProtocol) {
		return nil, fmt.Errorf("agent: port %d: upgraded to %.32q", port, resp.Header.Get("Upgrade"))
	}
	return &tunnelConn{Conn: conn, r: br}, nil
}

// tunnelConn reads first what the handshake's reader buffered.
type tunnelConn struct {
	net.Conn
	r *bufio.Reader
}

func (t *tunnelConn) Read(p []byte) (int, error) { return t.r.Read(p) }

// CloseWrite half-closes the tunnel where the agent transport can.
func (t *tunnelConn) CloseWrite() error {
	if cw, ok := t.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return t.Conn.Close()
}
