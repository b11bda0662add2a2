package vmux

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"
)

// pair returns a client session and a server listener over an in-memory
// pipe.
func pair(t *testing.T) (*Session, net.Listener) {
	t.Helper()
	c, s := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	opened := false
	l := Listen(ctx, func() (io.ReadWriteCloser, error) {
		if opened {
			return nil, errors.New("already open")
		}
		opened = true
		return s, nil
	}, t.Logf)
	cs, err := Client(c, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		cancel()
		l.Close()
	})
	return cs, l
}

func TestHTTPOverStreams(t *testing.T) {
	cs, l := pair(t)
	payload := make([]byte, 3<<20) // many windows
	_, _ = rand.Read(payload)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/echo" {
			_, _ = io.Copy(w, r.Body)
			return
		}
		_, _ = w.Write(payload)
	})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
		return cs.Open()
	}}}
	defer hc.CloseIdleConnections()
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := hc.Get("http://agent/big")
			if err != nil {
				t.Error(err)
				return
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !bytes.Equal(got, payload) {
				t.Errorf("big: %d bytes, %v", len(got), err)
			}
		}()
	}
	wg.Wait()
	resp, err := hc.Post("http://agent/echo", "application/octet-stream", bytes.NewReader(payload[:1<<20]))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Equal(got, payload[:1<<20]) {
		t.Errorf("echo: %d bytes", len(got))
	}
}

func TestDeadlinesAndClose(t *testing.T) {
	cs, l := pair(t)
	st, err := cs.Open()
	if err != nil {
		t.Fatal(err)
	}
	peer, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	_ = st.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := st.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past deadline: %v", err)
	}
	// A deadline set while a read waits wakes it (net/http does this).
	_ = st.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() { _, err := st.Read(make([]byte, 1)); done <- err }()
	time.Sleep(10 * time.Millisecond)
	_ = st.SetReadDeadline(time.Now())
	if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("woken read: %v", err)
	}
	_ = st.SetReadDeadline(time.Time{})
	if _, err := peer.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	peer.Close()
	got, err := io.ReadAll(st)
	if err != nil || string(got) != "hi" {
		t.Fatalf("after peer close: %q %v", got, err)
	}
	if _, err := st.Write([]byte("x")); err == nil {
		t.Error("write to a stream the peer closed succeeded")
	}
	st.Close()
}

// TestResync: a new client that takes over the port from one that died
// mid-session (QEMU's chardev switching clients) is recognised by its
// magic at a frame boundary, even though the server never saw the old
// client leave.
func TestResync(t *testing.T) {
	hostEnd, guestEnd := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := Listen(ctx, func() (io.ReadWriteCloser, error) { return guestEnd, nil }, t.Logf)
	defer l.Close()
	// The old client, by hand: handshake, open stream 1, then silence.
	if _, err := hostEnd.Write(Magic); err != nil {
		t.Fatal(err)
	}
	if err := skipToMagic(hostEnd); err != nil {
		t.Fatal(err)
	}
	if _, err := hostEnd.Write([]byte{frameOpen, 0, 0, 0, 1, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	// The new client on the same byte stream.
	cs, err := Client(hostEnd, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	st, err := cs.Open()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, buf); err == nil {
			if string(buf) != "ping" {
				t.Fatalf("got %q", buf)
			}
			return
		}
		c.Close() // the old session's stream: EOF
	}
}

// FuzzClientFrames feeds arbitrary bytes from a (hostile) guest to a host
// session: it must fail cleanly, never panic or grow without bound.
func FuzzClientFrames(f *testing.F) {
	f.Add([]byte{frameData, 0, 0, 0, 1, 0, 0, 0, 3, 'a', 'b', 'c'})
	f.Add([]byte{frameOpen, 0, 0, 0, 9, 0, 0, 0, 0})
	f.Add([]byte{frameWindow, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{frameData, 0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		c, g := net.Pipe()
		go func() {
			buf := make([]byte, len(Magic))
			_, _ = io.ReadFull(g, buf)
			_, _ = g.Write(Magic)
			_, _ = g.Write(data)
			g.Close()
		}()
		s, err := Client(c, time.Second)
		if err != nil {
			return
		}
		st, err := s.Open()
		if err == nil {
			_ = st.SetDeadline(time.Now().Add(50 * time.Millisecond))
			_, _ = io.ReadAll(st)
			st.Close()
		}
		<-s.Done()
	})
}
