package swaplisten

import (
	"errors"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

func listen(t *testing.T, path string) net.Listener {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// accepts runs Accept in a loop and sends what it returns.
func accepts(l net.Listener) (<-chan net.Conn, <-chan error) {
	conns, errs := make(chan net.Conn, 8), make(chan error, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				errs <- err
				return
			}
			conns <- c
		}
	}()
	return conns, errs
}

func dial(t *testing.T, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// acceptClosed waits for the Accept loop of accepts to end with
// net.ErrClosed.
func acceptClosed(t *testing.T, errs <-chan error) {
	t.Helper()
	select {
	case err := <-errs:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept still waits after Close")
	}
}

// TestSuspendResume: Accept serves, waits without failing while the
// socket is away, serves on the replacement, and fails once closed.
func TestSuspendResume(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	var tracked atomic.Int32
	l := New(listen(t, a), func(c net.Conn) net.Conn { tracked.Add(1); return c })
	conns, errs := accepts(l)

	dial(t, a)
	select {
	case <-conns:
	case <-time.After(5 * time.Second):
		t.Fatal("no connection accepted")
	}
	ran := false
	if err := l.Suspend(func() error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("Suspend: %v, fn ran %v", err, ran)
	}
	if err := l.Suspend(nil); !errors.Is(err, ErrSuspended) {
		t.Fatalf("second Suspend: %v, want ErrSuspended", err)
	}
	if !l.Suspended() {
		t.Fatal("not suspended")
	}
	if _, err := net.Dial("unix", a); err == nil {
		t.Fatal("the suspended socket still accepts connections")
	}
	select {
	case err := <-errs:
		t.Fatalf("Accept failed while suspended: %v", err)
	case c := <-conns:
		t.Fatalf("Accept returned %v while suspended", c)
	case <-time.After(50 * time.Millisecond):
	}
	if !l.Resume(listen(t, b)) {
		t.Fatal("Resume refused")
	}
	if l.Addr().String() != b {
		t.Errorf("Addr after Resume = %v, want %s", l.Addr(), b)
	}
	dial(t, b)
	select {
	case <-conns:
	case err := <-errs:
		t.Fatalf("Accept after Resume: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no connection accepted after Resume")
	}
	if n := tracked.Load(); n != 2 {
		t.Errorf("tracked %d connections, want 2", n)
	}
	if l.Resume(listen(t, filepath.Join(dir, "c"))) {
		t.Error("Resume of a listener that serves was accepted")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	acceptClosed(t, errs)
}

// TestCloseWhileSuspended: a suspended listener's Accept ends at Close,
// and a later Resume closes the listener it was given.
func TestCloseWhileSuspended(t *testing.T) {
	dir := t.TempDir()
	l := New(listen(t, filepath.Join(dir, "a")), nil)
	_, errs := accepts(l)
	if err := l.Suspend(nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	acceptClosed(t, errs)
	b := filepath.Join(dir, "b")
	if l.Resume(listen(t, b)) {
		t.Fatal("Resume after Close accepted")
	}
	if _, err := net.Dial("unix", b); err == nil {
		t.Error("the listener given to a closed Resume still listens")
	}
	if err := l.Suspend(nil); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Suspend after Close: %v", err)
	}
}
