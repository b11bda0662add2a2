package cluster

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A replica's calls to a node reuse their TLS connections: after a burst
// of concurrent calls, the next burst of the same size opens none. With
// the transport's default of two idle connections per host, each burst
// closed all but two and paid a handshake on both ends for the others.
func TestNodeLinkKeepsConnections(t *testing.T) {
	const burst = 16
	ca := newTestCA(t)
	tc, err := ServerTLS(ca.issue(RoleNode, "n1"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int64
	var mu sync.Mutex
	inFlight, all := 0, make(chan struct{})
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		},
		// Each call waits until the whole burst is in flight (or 5 s),
		// so a burst needs burst connections at once.
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			if inFlight++; inFlight == burst {
				close(all)
			}
			ch := all
			mu.Unlock()
			select {
			case <-ch:
			case <-time.After(5 * time.Second):
			}
			w.Write([]byte("ok"))
		})}
	go srv.Serve(tls.NewListener(ln, tc))
	t.Cleanup(func() { srv.Close() })
	ct, err := LoadClientTLS(ca.issue(RoleServer, "srv-a"))
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + ln.Addr().String()
	hc, err := LinkOptions{TLS: ct, Timeout: 10 * time.Second}.HTTPClient("n1", url)
	if err != nil {
		t.Fatal(err)
	}
	run := func() {
		mu.Lock()
		inFlight, all = 0, make(chan struct{})
		mu.Unlock()
		var wg sync.WaitGroup
		errs := make(chan error, burst)
		for range burst {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- getAll(hc, url) }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	run()
	if n := conns.Load(); n != burst {
		t.Fatalf("first burst of %d calls opened %d connections", burst, n)
	}
	run()
	if n := conns.Load(); n != burst {
		t.Fatalf("a second burst of %d calls opened %d new connections (the idle ones were closed)", burst, n-burst)
	}
}

// getAll reads the answer to its end, as Client.call does: a connection
// whose body was not read is not reused.
func getAll(hc *http.Client, url string) error {
	resp, err := hc.Get(url + "/x")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != 200 {
		return fmt.Errorf("HTTP %s", resp.Status)
	}
	return nil
}
