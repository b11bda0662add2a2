package agent

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// TunnelProtocol is the Upgrade token of a port tunnel: after the agent's
// 101 answer the connection carries the bytes of one TCP connection to a
// port inside the sandbox. The host never dials into the sandbox's network;
// the agent dials loopback from inside it.
const TunnelProtocol = "space-tcp"

// Codes of the port routes.
const (
	// CodePortClosed: nothing accepts connections on the port.
	CodePortClosed = "port_closed"
)

const tunnelDialTimeout = 5 * time.Second

// ListeningPort is a TCP socket in LISTEN state inside the sandbox.
type ListeningPort struct {
	Port    int    `json:"port"`
	Address string `json:"address"` // the bound address: 0.0.0.0, ::, 127.0.0.1, ...
	Family  string `json:"family"`  // "ipv4" or "ipv6"
}

// PortList is the answer of GET /v1/ports.
type PortList struct {
	Ports []ListeningPort `json:"ports"`
}

// maxListeners bounds the list: a sandbox can open many sockets.
const maxListeners = 1024

// routePorts serves /v1/ports and /v1/ports/{port}/connect.
func (s *Server) routePorts(w http.ResponseWriter, r *http.Request, rest string) {
	if rest == "" {
		s.method(w, r, http.MethodGet, s.handleListPorts)
		return
	}
	p, tail, _ := strings.Cut(rest, "/")
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != p {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "port must be 1-65535")
		return
	}
	if tail != "connect" {
		writeError(w, http.StatusNotFound, CodeNotFound, "no such route")
		return
	}
	s.method(w, r, http.MethodGet, func(w http.ResponseWriter, r *http.Request) { s.handleConnect(w, r, port) })
}

func (s *Server) handleListPorts(w http.ResponseWriter, r *http.Request) {
	ports, err := listeningPorts(s.opts.procDir())
	if err != nil {
		writeError(w, http.StatusInternalServerError, CodeInternal, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, PortList{Ports: ports})
}

// procDir is where the listing reads /proc/net from (tests point it at a
// fixture).
func (o *Options) procDir() string {
	if o.procDirOverride != "" {
		return o.procDirOverride
	}
	return "/proc"
}

// listeningPorts reads the kernel's (or gVisor's) socket tables. One entry
// per port and family, so a server bound to both 0.0.0.0 and :: shows twice.
func listeningPorts(proc string) ([]ListeningPort, error) {
	var out []ListeningPort
	seen := map[string]bool{}
	for _, f := range []struct{ file, family string }{{"net/tcp", "ipv4"}, {"net/tcp6", "ipv6"}} {
		b, err := os.ReadFile(proc + "/" + f.file)
		if errors.Is(err, os.ErrNotExist) {
			continue // no IPv6 in this sandbox
		}
		if err != nil {
			return nil, fmt.Errorf("listening ports: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			lp, ok := parseTCPLine(line, f.family)
			if !ok {
				continue
			}
			key := f.family + "/" + strconv.Itoa(lp.Port)
			if seen[key] {
				continue
			}
			seen[key] = true
			out = append(out, lp)
			if len(out) >= maxListeners {
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Port != out[j].Port {
			return out[i].Port < out[j].Port
		}
		return out[i].Family < out[j].Family
	})
	if out == nil {
		out = []ListeningPort{}
	}
	return out, nil
}

// parseTCPLine parses one row of /proc/net/tcp{,6}:
// "sl local_address rem_address st ...", addresses as hex "ADDR:PORT" in
// host byte order per 32-bit word. Only LISTEN (0A) rows are kept.
func parseTCPLine(line, family string) (ListeningPort, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || f[3] != "0A" {
		return ListeningPort{}, false
	}
	ah, ph, ok := strings.Cut(f[1], ":")
	if !ok {
		return ListeningPort{}, false
	}
	port, err := strconv.ParseUint(ph, 16, 16)
	if err != nil || port == 0 {
		return ListeningPort{}, false
	}
	raw, err := hex.DecodeString(ah)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return ListeningPort{}, false
	}
	// Each 32-bit word is in the kernel's (little-endian) byte order.
	for i := 0; i+4 <= len(raw); i += 4 {
		raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	addr, _ := netip.AddrFromSlice(raw)
	return ListeningPort{Port: int(port), Address: addr.Unmap().String(), Family: family}, true
}

// handleConnect dials the port on loopback and, once connected, turns the
// agent connection into a byte pipe to it (HTTP Upgrade). A port nobody
// listens on is 502 port_closed, before any upgrade.
func (s *Server) handleConnect(w http.ResponseWriter, r *http.Request, port int) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), TunnelProtocol) {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "Upgrade: "+TunnelProtocol+" required")
		return
	}
	up, err := dialLoopback(r.Context(), port)
	if err != nil {
		writeError(w, http.StatusBadGateway, CodePortClosed, fmt.Sprintf("nothing accepts connections on port %d", port))
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		writeError(w, http.StatusInternalServerError, CodeInternal, "connection cannot be upgraded")
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	// The handshake must not wait on a stuck host; the pipe has no deadline.
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + TunnelProtocol + "\r\nConnection: Upgrade\r\n\r\n")
	if err == nil {
		err = brw.Flush()
	}
	if err != nil {
		conn.Close()
		up.Close()
		return
	}
	conn.SetDeadline(time.Time{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.pipe(conn, brw.Reader, up)
	}()
}

// dialLoopback connects to the port on 127.0.0.1, then on ::1 (a server
// bound to the IPv6 loopback only).
func dialLoopback(ctx context.Context, port int) (net.Conn, error) {
	d := net.Dialer{Timeout: tunnelDialTimeout}
	p := strconv.Itoa(port)
	c, err := d.DialContext(ctx, "tcp4", "127.0.0.1:"+p)
	if err == nil {
		return c, nil
	}
	if c6, err6 := d.DialContext(ctx, "tcp6", "[::1]:"+p); err6 == nil {
		return c6, nil
	}
	return nil, err
}

// pipe copies both ways until both directions ended, passing half-closes
// on, or the agent shuts down.
func (s *Server) pipe(host net.Conn, hostBuf *bufio.Reader, up net.Conn) {
	done := make(chan struct{}, 2)
	go func() {
		// Bytes the host sent after the request line are in hostBuf;
		// after those, copy from the connection itself, so that the
		// kernel can splice between the two sockets.
		var err error
		if n := hostBuf.Buffered(); n > 0 {
			_, err = io.CopyN(up, hostBuf, int64(n))
		}
		if err == nil {
			io.Copy(up, host)
		}
		closeWrite(up)
		done <- struct{}{}
	}()
	go func() {
		io.Copy(host, up)
		closeWrite(host)
		done <- struct{}{}
	}()
	n := 0
	for n < 2 {
		select {
		case <-done:
			n++
		case <-s.shutdown:
			host.Close()
			up.Close()
			for ; n < 2; n++ {
				<-done
			}
		}
	}
	host.Close()
	up.Close()
}

// closeWrite half-closes c where the transport can, else closes it.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}
