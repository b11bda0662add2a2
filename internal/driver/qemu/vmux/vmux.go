// Package vmux multiplexes many independent byte streams over one ordered,
// reliable byte stream: the single virtio-serial port between the qemu
// driver and the agent in the guest. The agent speaks HTTP/1.1, which needs
// independent connections; one virtio-serial port is one stream, so each
// Instance.Dial opens a new vmux stream instead of a new port.
//
// Wire format: every frame is a 9-byte header — type (1 byte), stream id
// (4 bytes, big endian), payload length (4 bytes, big endian) — followed by
// the payload. Types:
//
//	open   the client opens stream id (ids are chosen by the client only)
//	data   payload bytes for stream id
//	close  the sender closed stream id; the receiver reads EOF after the
//	       buffered data and its writes fail
//	window the receiver consumed payload-length bytes: the sender may send
//	       that many more (per-stream credit, so one slow reader never
//	       blocks the shared link)
//
// A session starts with a handshake: the client writes Magic and the
// server answers Magic. The server discards bytes until it sees Magic, so
// a client reconnecting after a broken session (a restarted node) resyncs
// past whatever half-frame the old one left in the port.
package vmux

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// Magic is the handshake both sides send at the start of a session.
var Magic = []byte("SPXMUX01")

const (
	frameOpen   = 1
	frameData   = 2
	frameClose  = 3
	frameWindow = 4

	headerLen = 9
	// Window is each stream's receive buffer: a sender never has more than
	// this many unconsumed bytes in flight on one stream.
	Window = 256 << 10
	// maxFrame bounds one data frame's payload.
	maxFrame = 32 << 10
	// acceptBacklog bounds streams opened but not yet accepted.
	acceptBacklog = 128
)

// ErrSessionClosed is returned by operations on a closed session.
var ErrSessionClosed = errors.New("vmux: session closed")

// Session is one multiplexed link. Client sessions Open streams; server
// sessions Accept them.
type Session struct {
	conn   io.ReadWriteCloser
	client bool

	wmu sync.Mutex // serializes whole frames on conn
	bw  *bufio.Writer

	mu      sync.Mutex
	streams map[uint32]*Stream
	nextID  uint32
	err     error

	accept    chan *Stream
	done      chan struct{}
	readDone  chan struct{} // closed when the reader goroutine returns
	closeOnce sync.Once
}

// Client performs the client handshake on conn (bounded by timeout) and
// starts a session.
func Client(conn io.ReadWriteCloser, timeout time.Duration) (*Session, error) {
	if dc, ok := conn.(interface{ SetDeadline(time.Time) error }); ok && timeout > 0 {
		_ = dc.SetDeadline(time.Now().Add(timeout))
		defer func() { _ = dc.SetDeadline(time.Time{}) }()
	}
	if _, err := conn.Write(Magic); err != nil {
		return nil, fmt.Errorf("vmux: handshake: %w", err)
	}
	// Skip whatever precedes the answer: frames the guest's previous
	// session sent after this connection replaced the old one. Byte by
	// byte, so nothing after the magic is consumed here.
	if err := skipToMagic(conn); err != nil {
		return nil, fmt.Errorf("vmux: handshake: %w", err)
	}
	return newSession(conn, true, nil), nil
}

func skipToMagic(r io.Reader) error {
	var window []byte
	b := make([]byte, 1)
	for skipped := 0; !bytes.Equal(window, Magic); skipped++ {
		if skipped > 16<<20 {
			return errors.New("no magic in 16 MiB")
		}
		if _, err := io.ReadFull(r, b); err != nil {
			return err
		}
		window = append(window, b[0])
		if len(window) > len(Magic) {
			window = window[1:]
		}
	}
	return nil
}

// Server waits for the client's Magic on conn (discarding anything before
// it), answers, and starts a session.
func Server(conn io.ReadWriteCloser) (*Session, error) {
	return serverOn(conn, bufio.NewReaderSize(conn, 64<<10))
}

// errResync ends a server session whose peer started a new one.
var errResync = errors.New("vmux: the client started a new session")

// serverOn runs the server handshake reading through br, which may hold
// bytes of an earlier session's stream.
func serverOn(conn io.ReadWriteCloser, br *bufio.Reader) (*Session, error) {
	if err := skipToMagic(br); err != nil {
		return nil, fmt.Errorf("vmux: waiting for handshake: %w", err)
	}
	if _, err := conn.Write(Magic); err != nil {
		return nil, fmt.Errorf("vmux: handshake: %w", err)
	}
	return newSession(conn, false, br), nil
}

func newSession(conn io.ReadWriteCloser, client bool, br *bufio.Reader) *Session {
	if br == nil {
		br = bufio.NewReaderSize(conn, 64<<10)
	}
	s := &Session{
		conn:     conn,
		client:   client,
		bw:       bufio.NewWriterSize(conn, maxFrame+headerLen),
		streams:  map[uint32]*Stream{},
		nextID:   1,
		accept:   make(chan *Stream, acceptBacklog),
		done:     make(chan struct{}),
		readDone: make(chan struct{}),
	}
	go func() {
		defer close(s.readDone)
		s.readLoop(br)
	}()
	return s
}

// Done is closed when the session ends.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is why the session ended (nil while it runs).
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close ends the session and every stream on it.
func (s *Session) Close() error {
	s.fail(ErrSessionClosed)
	return nil
}

func (s *Session) fail(err error) {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.err = err
		streams := s.streams
		s.streams = map[uint32]*Stream{}
		s.mu.Unlock()
		close(s.done)
		_ = s.conn.Close()
		for _, st := range streams {
			st.wake()
		}
	})
}

// Open opens a new stream (client sessions only).
func (s *Session) Open() (*Stream, error) {
	if !s.client {
		return nil, errors.New("vmux: only the client opens streams")
	}
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.err
	}
	id := s.nextID
	s.nextID++
	st := newStream(s, id)
	s.streams[id] = st
	s.mu.Unlock()
	if err := s.writeFrame(frameOpen, id, nil); err != nil {
		return nil, err
	}
	return st, nil
}

// Accept waits for the next stream the client opens.
func (s *Session) Accept() (*Stream, error) {
	select {
	case st := <-s.accept:
		return st, nil
	case <-s.done:
		return nil, s.Err()
	}
}

func (s *Session) writeFrame(typ byte, id uint32, p []byte) error {
	return s.writeHeader(typ, id, uint32(len(p)), p)
}

// writeHeader writes a frame whose length field is n; p is its payload
// (nil for window frames, whose length field is the credit).
func (s *Session) writeHeader(typ byte, id, n uint32, p []byte) error {
	var h [headerLen]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], id)
	binary.BigEndian.PutUint32(h[5:], n)
	s.wmu.Lock()
	defer s.wmu.Unlock()
	select {
	case <-s.done:
		return s.Err()
	default:
	}
	_, err := s.bw.Write(h[:])
	if err == nil && len(p) > 0 {
		_, err = s.bw.Write(p)
	}
	if err == nil {
		err = s.bw.Flush()
	}
	if err != nil {
		s.fail(fmt.Errorf("vmux: write: %w", err))
		return s.Err()
	}
	return nil
}

func (s *Session) readLoop(br *bufio.Reader) {
	var h [headerLen]byte
	for {
		// A new client that took over the port (QEMU lets one client in at
		// a time and may switch before this side saw the old one leave)
		// starts with Magic, which no frame does: leave it in br for the
		// next session's handshake.
		if !s.client {
			if p, err := br.Peek(len(Magic)); err == nil && bytes.Equal(p, Magic) {
				s.fail(errResync)
				return
			}
		}
		if _, err := io.ReadFull(br, h[:]); err != nil {
			s.fail(fmt.Errorf("vmux: read: %w", err))
			return
		}
		typ, id, n := h[0], binary.BigEndian.Uint32(h[1:]), binary.BigEndian.Uint32(h[5:])
		if (typ == frameData && n > maxFrame) || (typ != frameData && typ != frameWindow && n != 0) {
			s.fail(fmt.Errorf("vmux: bad frame type %d length %d", typ, n))
			return
		}
		var p []byte
		if typ == frameData {
			p = make([]byte, n)
			if _, err := io.ReadFull(br, p); err != nil {
				s.fail(fmt.Errorf("vmux: read: %w", err))
				return
			}
		}
		s.mu.Lock()
		st := s.streams[id]
		s.mu.Unlock()
		switch typ {
		case frameOpen:
			if s.client || st != nil {
				s.fail(fmt.Errorf("vmux: unexpected open of stream %d", id))
				return
			}
			st = newStream(s, id)
			s.mu.Lock()
			s.streams[id] = st
			s.mu.Unlock()
			select {
			case s.accept <- st:
			default: // backlog full: refuse
				st.remoteClosed()
				_ = st.Close()
			}
		case frameData:
			if st != nil && !st.push(p) {
				s.fail(fmt.Errorf("vmux: stream %d overran its window", id))
				return
			}
		case frameClose:
			if st != nil {
				st.remoteClosed()
			}
		case frameWindow:
			if st != nil {
				st.credit(int(n))
			}
		default:
			s.fail(fmt.Errorf("vmux: unknown frame type %d", typ))
			return
		}
	}
}

func (s *Session) forget(id uint32) {
	s.mu.Lock()
	delete(s.streams, id)
	s.mu.Unlock()
}

// Stream is one multiplexed connection. It implements net.Conn, deadlines
// included (net/http relies on read deadlines to abort background reads).
type Stream struct {
	s  *Session
	id uint32

	mu        sync.Mutex
	buf       []byte
	consumed  int  // bytes read but not yet acknowledged with a window frame
	sendWin   int  // bytes we may still send
	rclosed   bool // peer sent close
	lclosed   bool // Close was called
	rdeadline time.Time
	wdeadline time.Time
	rnotify   chan struct{} // wakes a waiting reader
	wnotify   chan struct{} // wakes a waiting writer
}

var _ net.Conn = (*Stream)(nil)

func newStream(s *Session, id uint32) *Stream {
	return &Stream{s: s, id: id, sendWin: Window, rnotify: make(chan struct{}, 1), wnotify: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (st *Stream) wake() {
	signal(st.rnotify)
	signal(st.wnotify)
}

func (st *Stream) push(p []byte) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.lclosed {
		return true // dropped: nobody reads it any more
	}
	if len(st.buf)+len(p) > Window {
		return false
	}
	st.buf = append(st.buf, p...)
	signal(st.rnotify)
	return true
}

func (st *Stream) credit(n int) {
	st.mu.Lock()
	st.sendWin += n
	st.mu.Unlock()
	signal(st.wnotify)
}

func (st *Stream) remoteClosed() {
	st.mu.Lock()
	st.rclosed = true
	st.mu.Unlock()
	st.wake()
}

// wait blocks until woken, the deadline passes or the session ends.
func (st *Stream) wait(notify <-chan struct{}, deadline time.Time) error {
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return os.ErrDeadlineExceeded
		}
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-notify:
		return nil
	case <-timeout:
		return os.ErrDeadlineExceeded
	case <-st.s.done:
		return nil
	}
}

// Read implements net.Conn.
func (st *Stream) Read(p []byte) (int, error) {
	for {
		st.mu.Lock()
		if st.lclosed {
			st.mu.Unlock()
			return 0, net.ErrClosed
		}
		if len(st.buf) > 0 {
			n := copy(p, st.buf)
			st.buf = st.buf[n:]
			if len(st.buf) == 0 {
				st.buf = nil
			}
			st.consumed += n
			ack := 0
			if st.consumed >= Window/4 || len(st.buf) == 0 {
				ack, st.consumed = st.consumed, 0
			}
			rclosed := st.rclosed
			st.mu.Unlock()
			if ack > 0 && !rclosed {
				_ = st.s.writeHeader(frameWindow, st.id, uint32(ack), nil)
			}
			return n, nil
		}
		if st.rclosed {
			st.mu.Unlock()
			return 0, io.EOF
		}
		dl := st.rdeadline
		st.mu.Unlock()
		select {
		case <-st.s.done:
			return 0, io.EOF
		default:
		}
		if !dl.IsZero() && !time.Now().Before(dl) {
			return 0, os.ErrDeadlineExceeded
		}
		if err := st.wait(st.rnotify, dl); err != nil {
			return 0, err
		}
	}
}

// Write implements net.Conn.
func (st *Stream) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		st.mu.Lock()
		if st.lclosed {
			st.mu.Unlock()
			return written, net.ErrClosed
		}
		if st.rclosed {
			st.mu.Unlock()
			return written, fmt.Errorf("vmux: stream %d: %w", st.id, io.ErrClosedPipe)
		}
		select {
		case <-st.s.done:
			st.mu.Unlock()
			return written, st.s.Err()
		default:
		}
		dl := st.wdeadline
		if st.sendWin == 0 {
			st.mu.Unlock()
			if err := st.wait(st.wnotify, dl); err != nil {
				return written, err
			}
			continue
		}
		if !dl.IsZero() && !time.Now().Before(dl) {
			st.mu.Unlock()
			return written, os.ErrDeadlineExceeded
		}
		n := min(len(p)-written, st.sendWin, maxFrame)
		st.sendWin -= n
		st.mu.Unlock()
		if err := st.s.writeFrame(frameData, st.id, p[written:written+n]); err != nil {
			return written, err
		}
		written += n
	}
	return written, nil
}

// Close implements net.Conn: it closes both directions.
func (st *Stream) Close() error {
	st.mu.Lock()
	if st.lclosed {
		st.mu.Unlock()
		return nil
	}
	st.lclosed = true
	st.buf = nil
	st.mu.Unlock()
	st.wake()
	st.s.forget(st.id)
	err := st.s.writeFrame(frameClose, st.id, nil)
	if errors.Is(err, ErrSessionClosed) {
		err = nil
	}
	return err
}

// LocalAddr implements net.Conn.
func (st *Stream) LocalAddr() net.Addr { return addr(fmt.Sprintf("vmux:%d", st.id)) }

// RemoteAddr implements net.Conn.
func (st *Stream) RemoteAddr() net.Addr { return addr(fmt.Sprintf("vmux:%d", st.id)) }

// SetDeadline implements net.Conn.
func (st *Stream) SetDeadline(t time.Time) error {
	st.mu.Lock()
	st.rdeadline, st.wdeadline = t, t
	st.mu.Unlock()
	st.wake()
	return nil
}

// SetReadDeadline implements net.Conn.
func (st *Stream) SetReadDeadline(t time.Time) error {
	st.mu.Lock()
	st.rdeadline = t
	st.mu.Unlock()
	signal(st.rnotify)
	return nil
}

// SetWriteDeadline implements net.Conn.
func (st *Stream) SetWriteDeadline(t time.Time) error {
	st.mu.Lock()
	st.wdeadline = t
	st.mu.Unlock()
	signal(st.wnotify)
	return nil
}

type addr string

func (a addr) Network() string { return "vmux" }
func (a addr) String() string  { return string(a) }
