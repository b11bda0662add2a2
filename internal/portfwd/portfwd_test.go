package portfwd

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// writeCounter counts the writes on the connections a listener accepts.
type writeCounter struct {
	net.Listener
	mu     sync.Mutex
	writes int
}

func (l *writeCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, l: l}, nil
}

type countingConn struct {
	net.Conn
	l *writeCounter
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.l.mu.Lock()
	c.l.writes++
	c.l.mu.Unlock()
	return c.Conn.Write(p)
}

func (l *writeCounter) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writes
}

// TestStreamEndsInOneWrite: a streamed answer (chunked, no length) that
// the sandbox's server sends in one write, its end included, reaches the
// client in one write too: the proxy's flush after the last piece used to
// send the header and the end of the body on their own (two more
// wake-ups of the client per code-interpreter run).
func TestStreamEndsInOneWrite(t *testing.T) {
	const answer = "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"6\r\n{\"a\"}\n\r\n6\r\n{\"b\"}\n\r\n0\r\n\r\n"
	release := make(chan struct{})
	backend, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					if req.URL.Path == "/slow" {
						// The header now, the body once the client has the header.
						head, body, _ := strings.Cut(answer, "\r\n\r\n")
						io.WriteString(c, head+"\r\n\r\n")
						<-release
						io.WriteString(c, body)
						continue
					}
					if _, err := io.WriteString(c, answer); err != nil { // one write, end included
						return
					}
				}
			}(c)
		}
	}()

	f := New(Options{})
	defer f.Close()
	f.tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", backend.Addr().String())
	}
	front, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lc := &writeCounter{Listener: front}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fw := &forward{t: Target{SandboxID: "sbx-test", Port: 49999}}
		ctx := context.WithValue(r.Context(), targetKey{}, fw)
		ew := &endWriter{ResponseWriter: w, fw: fw}
		defer ew.finish()
		f.proxy.ServeHTTP(ew, r.WithContext(ctx))
	})}
	go srv.Serve(lc)
	defer srv.Close()

	c, err := net.Dial("tcp", front.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	ones := 0
	for i := 0; i < 5; i++ {
		before := lc.count()
		if _, err := io.WriteString(c, "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil || string(body) != "{\"a\"}\n{\"b\"}\n" {
			t.Fatalf("body %q, %v", body, err)
		}
		if !strings.EqualFold(resp.Header.Get("Content-Type"), "application/x-ndjson") {
			t.Fatalf("header %v", resp.Header)
		}
		// 2 only where the header's delayed flush ran before the body's
		// copy (a host too busy to run it within headerFlushDelay).
		switch n := lc.count() - before; n {
		case 1:
			ones++
		case 2:
		default:
			t.Fatalf("answer %d came in %d writes, want 1", i, n)
		}
	}
	if ones == 0 {
		t.Fatal("no answer came in one write")
	}

	// A stream whose body is slow to come still gets its header.
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, "POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	close(release)
	if err != nil {
		t.Fatalf("header of a slow stream: %v", err)
	}
	if body, err := io.ReadAll(resp.Body); err != nil || string(body) != "{\"a\"}\n{\"b\"}\n" {
		t.Fatalf("slow body %q, %v", body, err)
	}
}
