package server

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/cluster"
)

// TestPeerProxyFullDuplex: a request forwarded to a peer node keeps its
// body and its answer when the peer answers before it has read the whole
// body (a process Start answers its header at once). Without full duplex
// net/http closes the client's request body as the proxy writes the
// header, the transport's next read of it fails, and the transport closes
// the connection to the peer under the answer: the client got "terminated"
// from the E2B SDK (TestE2BAnyNode in CI, with "ReverseProxy read error
// during body copy: use of closed network connection" in the node's log).
func TestPeerProxyFullDuplex(t *testing.T) {
	const size = 64 << 10
	peerNode := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != PathData+"/process.Process/Start" || r.Header.Get(forwardedHeader) != "d1" {
			http.Error(w, "bad forward "+r.URL.Path, http.StatusBadRequest)
			return
		}
		rc := http.NewResponseController(w)
		rc.EnableFullDuplex() // this test server's own net/http would close the body too
		io.WriteString(w, "started\n")
		rc.Flush() // the first event before the body is read
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "read %d %v", n, err)
	}))
	defer peerNode.Close()
	d := &dataRouter{self: "d1", link: cluster.LinkOptions{Plaintext: true}, logf: t.Logf}
	p, err := d.newPeer("d2", peerNode.URL)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(http.HandlerFunc(p.serve))
	defer front.Close()

	// The client sends a piece of the body, then the rest in pieces once
	// the peer's first event is on its way back: the proxy writes its
	// header while its transport still reads the body.
	pr, pw := io.Pipe()
	go func() {
		piece := strings.Repeat("x", size/8)
		io.WriteString(pw, piece)
		time.Sleep(200 * time.Millisecond)
		for range 7 { // each gap is a chance for the header to be written
			io.WriteString(pw, piece)
			time.Sleep(20 * time.Millisecond)
		}
		pw.Close()
	}()
	req, err := http.NewRequest("POST", front.URL+"/process.Process/Start", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = -1 // chunked: the proxy's transport reads until the client's last chunk
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || string(body) != fmt.Sprintf("started\nread %d <nil>", size) {
		t.Fatalf("forwarded answer: status %d, body %q, err %v", resp.StatusCode, body, err)
	}
}
