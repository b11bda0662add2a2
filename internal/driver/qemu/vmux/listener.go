package vmux

import (
	"bufio"
	"context"
	"io"
	"net"
	"sync"
	"time"
)

// Listener is the server side over a port that outlives sessions: it runs
// one session after another on whatever open returns (the guest's
// virtio-serial port, reopened after the host side disconnects) and hands
// out their streams. A new session never ends the listener, so a restarted
// node reconnects without the agent noticing anything but new streams.
type Listener struct {
	streams chan net.Conn
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
}

var _ net.Listener = (*Listener)(nil)

// Listen starts serving sessions on the streams open returns. logf, if
// non-nil, reports session ends.
func Listen(ctx context.Context, open func() (io.ReadWriteCloser, error), logf func(string, ...any)) *Listener {
	ctx, cancel := context.WithCancel(ctx)
	l := &Listener{streams: make(chan net.Conn), cancel: cancel, done: make(chan struct{})}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	go l.run(ctx, open, logf)
	return l
}

func (l *Listener) run(ctx context.Context, open func() (io.ReadWriteCloser, error), logf func(string, ...any)) {
	defer close(l.done)
	var rw io.ReadWriteCloser
	for rw == nil {
		var err error
		if rw, err = open(); err != nil {
			logf("vmux: open: %v", err)
			sleep(ctx, 100*time.Millisecond)
			if ctx.Err() != nil {
				return
			}
		}
	}
	// The port stays open across sessions: closing a virtio-serial port
	// discards what the host already sent (the next session's handshake).
	stop := context.AfterFunc(ctx, func() { _ = rw.Close() })
	defer stop()
	br := bufio.NewReaderSize(rw, 64<<10)
	for ctx.Err() == nil {
		s, err := serverOn(keepOpen{rw}, br)
		if err != nil {
			// EOF while the host side is disconnected: poll again.
			sleep(ctx, 20*time.Millisecond)
			continue
		}
		for {
			st, err := s.Accept()
			if err != nil {
				break
			}
			select {
			case l.streams <- st:
			case <-s.Done(): // a new session took over: drop the old one's
				_ = st.Close()
			case <-ctx.Done():
				_ = st.Close()
			}
		}
		_ = s.Close()
		// One reader at a time on the port.
		select {
		case <-s.readDone:
		case <-ctx.Done():
		}
		logf("vmux: session ended: %v", s.Err())
	}
}

// keepOpen hides Close from a session, so a session's end leaves the port
// open for the next one.
type keepOpen struct{ io.ReadWriter }

func (keepOpen) Close() error { return nil }

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.streams:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (l *Listener) Close() error {
	l.once.Do(l.cancel)
	<-l.done
	return nil
}

// Addr implements net.Listener.
func (l *Listener) Addr() net.Addr { return addr("vmux") }
