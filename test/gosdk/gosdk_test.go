// Package gosdk runs the Go SDK (pkg/client) against a real `space server`:
// lifecycle, streaming exec, a cut stream resumed without loss, 50 MB files
// both ways, pause/resume/snapshot/fork/hibernate and typed errors. Needs
// root (the server makes namespaces); skips otherwise.
package gosdk

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/space-sandbox/space/pkg/client"
	"github.com/space-sandbox/space/test/testenv"
)

// suite is the one server all tests share.
type suite struct {
	srv *testenv.Server
	key string
}

var shared struct {
	once sync.Once
	s    *suite
	err  error
}

// TestMain stops the shared server after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if s := shared.s; s != nil {
		s.srv.Stop()
		s.srv.RemoveCgroupBase()
		s.srv.Remove()
	}
	os.Exit(code)
}

func start(t *testing.T) *suite {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces, cgroups, overlayfs) to run a real server")
	}
	shared.once.Do(func() {
		srv, err := testenv.New("space-gosdk-")
		if err != nil {
			shared.err = err
			return
		}
		shared.s = &suite{srv: srv}
		srv.Args = []string{"--builtins", "minimal"}
		if shared.err = srv.Start(); shared.err != nil {
			return
		}
		if shared.s.key, shared.err = srv.CreateKey("gosdk"); shared.err != nil {
			return
		}
		shared.err = srv.WaitTemplate(shared.s.key, "minimal", 2*time.Minute)
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.s
}

func (s *suite) client(opts ...client.Option) *client.Client {
	return client.New(s.srv.Ctrl, s.key, opts...)
}

// sandbox creates a running sandbox, deleted when the test ends.
func (s *suite) sandbox(t *testing.T, c *client.Client) (client.Sandbox, *client.SandboxConn) {
	t.Helper()
	ctx := context.Background()
	res, err := c.CreateSandbox(ctx, client.CreateRequest{Template: "minimal",
		Metadata: map[string]string{"test": t.Name()}}, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if op, err := c.DeleteSandbox(context.Background(), res.Sandbox.ID); err == nil {
			c.WaitOperation(context.Background(), op.ID)
		}
	})
	op, err := c.WaitOperation(ctx, res.Operation.ID)
	if err != nil {
		t.Fatalf("create: %v\n%s", err, s.srv.LogTail(4000))
	}
	var sb client.Sandbox
	if err := op.DecodeResult(&sb); err != nil {
		t.Fatal(err)
	}
	if sb.State != client.StateRunning {
		t.Fatalf("state %q after create", sb.State)
	}
	return sb, c.Sandbox(res.Session)
}

func run(t *testing.T, sc *client.SandboxConn, shell string) (string, client.Exit) {
	t.Helper()
	var out bytes.Buffer
	exit, err := sc.Run(context.Background(), client.ExecRequest{Shell: shell}, &out, &out)
	if err != nil {
		t.Fatalf("run %q: %v", shell, err)
	}
	return out.String(), exit
}

func TestCreateGetListDelete(t *testing.T) {
	s := start(t)
	c := s.client()
	ctx := context.Background()
	sb, _ := s.sandbox(t, c)
	got, err := c.GetSandbox(ctx, sb.ID)
	if err != nil || got.ID != sb.ID || got.Template != "minimal" || got.Metadata["test"] != t.Name() {
		t.Fatalf("get: %+v %v", got, err)
	}
	found := false
	for x, err := range c.AllSandboxes(ctx, client.ListOptions{Metadata: map[string]string{"test": t.Name()}}) {
		if err != nil {
			t.Fatal(err)
		}
		found = found || x.ID == sb.ID
	}
	if !found {
		t.Fatalf("%s not listed", sb.ID)
	}
	op, err := c.DeleteSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if op, err = c.WaitOperation(ctx, op.ID); err != nil || op.State != client.OpSucceeded {
		t.Fatalf("delete: %+v %v", op, err)
	}
	if got, err = c.GetSandbox(ctx, sb.ID); err == nil && got.State != client.StateDeleted {
		t.Fatalf("after delete: %+v", got)
	}
}

func TestExecStreaming(t *testing.T) {
	s := start(t)
	c := s.client()
	_, sc := s.sandbox(t, c)
	ctx := context.Background()
	// Each line is printed 300 ms apart: the first must arrive well before
	// the command ends, or the output is not streamed.
	cmd, err := sc.Exec(ctx, client.ExecRequest{Shell: "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three; exit 7"})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	var firstAt time.Duration
	var stdout, stderr strings.Builder
	var last uint64
	exit, err := sc.Stream(ctx, cmd.ID, 0, func(ev client.Event) error {
		if firstAt == 0 {
			firstAt = time.Since(began)
		}
		if ev.Seq <= last {
			return fmt.Errorf("event %d after %d", ev.Seq, last)
		}
		last = ev.Seq
		if ev.Type == client.EventStderr {
			stderr.Write(ev.Data)
		} else {
			stdout.Write(ev.Data)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if stdout.String() != "one\nthree\n" || stderr.String() != "two\n" || exit.Code != 7 {
		t.Fatalf("stdout %q stderr %q exit %+v", stdout.String(), stderr.String(), exit)
	}
	if total := time.Since(began); firstAt > total-400*time.Millisecond {
		t.Fatalf("first output after %v of %v: not streamed", firstAt, total)
	}
	// A second stream after event 1 yields exactly the rest.
	var rest strings.Builder
	if _, err := sc.Stream(ctx, cmd.ID, 1, func(ev client.Event) error { rest.Write(ev.Data); return nil }); err != nil {
		t.Fatal(err)
	}
	if rest.String() != "two\nthree\n" {
		t.Fatalf("resume after 1: %q", rest.String())
	}
	// Argv, env, cwd and stdin.
	cmd, err = sc.Exec(ctx, client.ExecRequest{Argv: []string{"sh", "-c", `echo "$X $(pwd)"; cat`},
		Env: map[string]string{"X": "x1"}, Cwd: "/tmp", Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	w := sc.StdinWriter(ctx, cmd.ID)
	io.WriteString(w, "from stdin\n")
	w.Close()
	var out strings.Builder
	if exit, err = sc.Stream(ctx, cmd.ID, 0, func(ev client.Event) error { out.Write(ev.Data); return nil }); err != nil || exit.Code != 0 {
		t.Fatalf("stdin: %+v %v", exit, err)
	}
	if out.String() != "x1 /tmp\nfrom stdin\n" {
		t.Fatalf("argv/env/cwd/stdin: %q", out.String())
	}
}

// cuttingTransport fails the body of the first cuts event streams after a
// few kilobytes, in the middle of an event, as a broken network would.
type cuttingTransport struct {
	base    http.RoundTripper
	cuts    atomic.Int32 // event-stream requests
	resumed atomic.Int32 // those that carried Last-Event-ID
	after   []int
}

func (ct *cuttingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := ct.base.RoundTrip(r)
	if err != nil || !strings.HasSuffix(r.URL.Path, "/events") {
		return resp, err
	}
	if r.Header.Get("Last-Event-ID") != "" {
		ct.resumed.Add(1)
	}
	if n := int(ct.cuts.Add(1)) - 1; n < len(ct.after) {
		resp.Body = &cutBody{ReadCloser: resp.Body, left: ct.after[n]}
	}
	return resp, nil
}

type cutBody struct {
	io.ReadCloser
	left int
}

func (b *cutBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	if len(p) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= n
	return n, err
}

func TestDroppedStreamResumesWithoutLoss(t *testing.T) {
	s := start(t)
	// No goroutine of the cut and resumed streams may outlive the test.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	ct := &cuttingTransport{base: tr, after: []int{700, 5000, 12345}}
	c := s.client(client.WithHTTPClient(&http.Client{Transport: ct}))
	_, sc := s.sandbox(t, c)
	ctx := context.Background()
	// Output in bursts while the command runs, so cuts happen mid-run.
	cmd, err := sc.Exec(ctx, client.ExecRequest{Shell: `i=0; while [ $i -lt 30 ]; do j=0; while [ $j -lt 200 ]; do echo "line $i.$j"; j=$((j+1)); done; i=$((i+1)); sleep 0.05; done`})
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := range 30 {
		for j := range 200 {
			fmt.Fprintf(&want, "line %d.%d\n", i, j)
		}
	}
	var got bytes.Buffer
	var last uint64
	exit, err := sc.Stream(ctx, cmd.ID, 0, func(ev client.Event) error {
		if ev.Seq != last+1 {
			return fmt.Errorf("event %d after %d: lost or repeated", ev.Seq, last)
		}
		last = ev.Seq
		got.Write(ev.Data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if exit.Code != 0 || got.String() != want.String() {
		t.Fatalf("exit %+v; got %d bytes, want %d", exit, got.Len(), want.Len())
	}
	// Every cut forced a new request; those after a whole event had arrived
	// resumed with Last-Event-ID (a cut inside the first event starts over).
	if ct.cuts.Load() < 4 || ct.resumed.Load() < 1 {
		t.Fatalf("%d event requests, %d with Last-Event-ID; want ≥ 4 and ≥ 1", ct.cuts.Load(), ct.resumed.Load())
	}
}

func TestFiles50MB(t *testing.T) {
	s := start(t)
	c := s.client()
	_, sc := s.sandbox(t, c)
	ctx := context.Background()
	const size = 50 << 20
	src := make([]byte, size)
	rand.Read(src)
	want := sha256.Sum256(src)
	if err := sc.Upload(ctx, "/tmp/big.bin", 0o600, bytes.NewReader(src)); err != nil {
		t.Fatal(err)
	}
	st, err := sc.Stat(ctx, "/tmp/big.bin")
	if err != nil || st.Size != size {
		t.Fatalf("stat: %+v %v", st, err)
	}
	out, _ := run(t, sc, "sha256sum /tmp/big.bin")
	if !strings.HasPrefix(out, fmt.Sprintf("%x", want)) {
		t.Fatalf("sha256 in the sandbox: %q, want %x", out, want)
	}
	rc, err := sc.Download(ctx, "/tmp/big.bin")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, rc)
	rc.Close()
	if err != nil || n != size {
		t.Fatalf("download: %d bytes, %v", n, err)
	}
	if got := h.Sum(nil); !bytes.Equal(got, want[:]) {
		t.Fatalf("downloaded sha256 %x, want %x", got, want)
	}
	if err := sc.Remove(ctx, "/tmp/big.bin", false); err != nil {
		t.Fatal(err)
	}
}

func TestTypedErrors(t *testing.T) {
	s := start(t)
	c := s.client()
	ctx := context.Background()
	_, err := c.GetSandbox(ctx, "sbx-0000000000000000")
	if !errors.Is(err, client.ErrNotFound) || !client.IsNotFound(err) {
		t.Fatalf("missing sandbox: %v", err)
	}
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 404 || ae.Code == "" {
		t.Fatalf("not an *APIError with code: %#v", err)
	}
	if _, err := client.New(s.srv.Ctrl, "sk-wrong").GetSandbox(ctx, "sbx-0000000000000000"); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("wrong key: %v", err)
	}
	if _, err := c.CreateSandbox(ctx, client.CreateRequest{Template: "no-such-template"}, ""); !errors.Is(err, client.ErrNotFound) && !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("unknown template: %v", err)
	}
	if _, err := c.ListSandboxes(ctx, client.ListOptions{State: []string{"bogus"}}); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("bad state filter: %v", err)
	}
	_, sc := s.sandbox(t, c)
	if _, err := sc.Stat(ctx, "/no/such/file"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("missing file: %v", err)
	}
	// A session token of another sandbox is refused.
	other := c.Sandbox(client.Session{SandboxID: "sbx-0000000000000000", Token: sc.Session().Token, DataURL: sc.Session().DataURL})
	if _, err := other.ListCommands(ctx); !errors.Is(err, client.ErrUnauthorized) && !errors.Is(err, client.ErrNotFound) && !errors.Is(err, client.ErrForbidden) {
		t.Fatalf("token for another sandbox: %v", err)
	}
	// No server at all: a plain network error, not an *APIError.
	_, err = client.New("http://127.0.0.1:9", s.key, client.WithRequestTimeout(5*time.Second)).GetSandbox(ctx, "sbx-0000000000000000")
	if err == nil || errors.As(err, &ae) {
		t.Fatalf("no server: %v", err)
	}
}

func TestPauseResumeSnapshotFork(t *testing.T) {
	s := start(t)
	c := s.client()
	sb, sc := s.sandbox(t, c)
	ctx := context.Background()
	if err := sc.Mkdir(ctx, "/home/user/data"); err != nil { // not /tmp (a driver may mount a tmpfs there); files act as the default user
		t.Fatal(err)
	}
	if err := sc.Upload(ctx, "/home/user/data/note.txt", 0, strings.NewReader("kept")); err != nil {
		t.Fatal(err)
	}
	op, err := c.PauseSandbox(ctx, sb.ID, "")
	if err == nil {
		op, err = c.WaitOperation(ctx, op.ID)
	}
	if errors.Is(err, client.ErrUnavailable) {
		t.Skipf("pause not available on this server: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := c.GetSandbox(ctx, sb.ID); got.State != client.StatePaused {
		t.Fatalf("state %q after pause", got.State)
	}
	if _, err := sc.Exec(ctx, client.ExecRequest{Shell: "true"}); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("exec while paused: %v, want ErrConflict (ErrSandboxPaused)", err)
	}
	if op, err = c.ResumeSandbox(ctx, sb.ID, ""); err == nil {
		_, err = c.WaitOperation(ctx, op.ID)
	}
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := run(t, sc, "cat /home/user/data/note.txt"); out != "kept" {
		t.Fatalf("after resume: %q", out)
	}
	snap, op, err := c.CreateSnapshot(ctx, sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitOperation(ctx, op.ID); err != nil {
		t.Fatal(err)
	}
	if snap, err = c.GetSnapshot(ctx, snap.ID); err != nil || snap.State != "ready" || snap.SandboxID != sb.ID || snap.Kind == "" {
		t.Fatalf("snapshot: %+v %v", snap, err)
	}
	list, err := c.ListSnapshots(ctx, sb.ID)
	if err != nil || len(list) == 0 || list[len(list)-1].ID != snap.ID {
		t.Fatalf("list snapshots: %+v %v", list, err)
	}
	forks, err := c.ForkSnapshot(ctx, snap.ID, client.ForkRequest{Count: 2}, "")
	if err != nil || len(forks) != 2 {
		t.Fatalf("fork: %+v %v", forks, err)
	}
	for _, f := range forks {
		t.Cleanup(func() {
			if op, err := c.DeleteSandbox(context.Background(), f.Sandbox.ID); err == nil {
				c.WaitOperation(context.Background(), op.ID)
			}
		})
	}
	for _, f := range forks {
		if _, err := c.WaitOperation(ctx, f.Operation.ID); err != nil {
			t.Fatal(err)
		}
		if out, _ := run(t, c.Sandbox(f.Session), "cat /home/user/data/note.txt"); out != "kept" || f.Sandbox.ID == sb.ID {
			t.Fatalf("fork %s: %q", f.Sandbox.ID, out)
		}
	}
	// A snapshot that forks' sandboxes came from may be deleted; its chunks go.
	if op, err = c.DeleteSnapshot(ctx, snap.ID); err == nil {
		_, err = c.WaitOperation(ctx, op.ID)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSnapshot(ctx, snap.ID); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("deleted snapshot: %v", err)
	}
}

func TestHibernateResume(t *testing.T) {
	s := start(t)
	c := s.client()
	sb, sc := s.sandbox(t, c)
	ctx := context.Background()
	if err := sc.Mkdir(ctx, "/home/user/data"); err != nil {
		t.Fatal(err)
	}
	if err := sc.Upload(ctx, "/home/user/data/h.txt", 0, strings.NewReader("slept")); err != nil {
		t.Fatal(err)
	}
	op, err := c.HibernateSandbox(ctx, sb.ID, "")
	if err == nil {
		_, err = c.WaitOperation(ctx, op.ID)
	}
	if errors.Is(err, client.ErrUnavailable) {
		t.Skipf("hibernate not available on this server: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := c.GetSandbox(ctx, sb.ID); got.State != client.StateHibernated {
		t.Fatalf("state %q after hibernate", got.State)
	}
	if op, err = c.ResumeSandbox(ctx, sb.ID, ""); err == nil {
		_, err = c.WaitOperation(ctx, op.ID)
	}
	if err != nil {
		t.Fatal(err)
	}
	// The session survives: tokens name the sandbox id, not the instance.
	if out, _ := run(t, sc, "cat /home/user/data/h.txt"); out != "slept" {
		t.Fatalf("after hibernate and resume: %q", out)
	}
}

// dataDialer sends every request to the data listener whatever the URL's
// host says, as wildcard DNS for the sandbox domain would; it adds no
// credential.
func dataDialer(dataURL string) *http.Client {
	u, _ := url.Parse(dataURL)
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, u.Host)
	}}, Timeout: 30 * time.Second}
}

func fetch(t *testing.T, hc *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := hc.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// startHTTPD serves dir's index.html with busybox httpd on port inside
// the sandbox and waits for it with WaitForPort.
func startHTTPD(t *testing.T, sc *client.SandboxConn, port int, page string) client.Port {
	t.Helper()
	ctx := context.Background()
	if err := sc.Mkdir(ctx, "/tmp/www"); err != nil {
		t.Fatal(err)
	}
	if err := sc.Upload(ctx, "/tmp/www/index.html", 0o644, strings.NewReader(page)); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Exec(ctx, client.ExecRequest{Argv: []string{"httpd", "-f", "-p", fmt.Sprint(port), "-h", "/tmp/www"}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	p, err := sc.WaitForPort(wctx, port)
	if err != nil || p.Port != port {
		t.Fatalf("WaitForPort(%d): %+v %v", port, p, err)
	}
	return p
}

func TestPortForwarding(t *testing.T) {
	s := start(t)
	c := s.client()
	sb, sc := s.sandbox(t, c)
	ctx := context.Background()
	if sc.Session().Domain == "" {
		t.Fatalf("session without a domain: %+v", sc.Session())
	}
	// Nothing listens yet: a bounded wait ends with the context.
	wctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	_, err := sc.WaitForPort(wctx, 8000)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitForPort before the server starts: %v", err)
	}
	p := startHTTPD(t, sc, 8000, "hello from the sandbox\n")
	hostURL, err := sc.PortURL(8000)
	if err != nil {
		t.Fatal(err)
	}
	pathURL, _ := sc.PortPathURL(8000)
	if p.URL != hostURL || p.PathURL != pathURL {
		t.Fatalf("server URLs %q %q, SDK's %q %q", p.URL, p.PathURL, hostURL, pathURL)
	}
	ports, err := sc.ListPorts(ctx)
	if err != nil || len(ports) == 0 {
		t.Fatalf("ListPorts: %+v %v", ports, err)
	}
	hc, err := sc.PortHTTPClient()
	if err != nil {
		t.Fatal(err)
	}
	defer hc.CloseIdleConnections()
	for _, u := range []string{hostURL, pathURL} {
		if st, body := fetch(t, hc, u); st != 200 || body != "hello from the sandbox\n" {
			t.Fatalf("GET %s with the SDK's client: %d %q", u, st, body)
		}
	}
	plain := dataDialer(sc.Session().DataURL)
	defer plain.CloseIdleConnections()
	if st, body := fetch(t, plain, hostURL); st != 401 || !strings.Contains(body, "unauthorized") {
		t.Fatalf("private port without a token: %d %s", st, body)
	}
	signed, err := c.SignedPortURL(ctx, sb.ID, 8000, time.Minute)
	if err != nil || !strings.HasPrefix(signed.URL, hostURL) || signed.ExpiresAt.Before(time.Now()) {
		t.Fatalf("SignedPortURL: %+v %v", signed, err)
	}
	for _, u := range []string{signed.URL, signed.PathURL} {
		if st, body := fetch(t, plain, u); st != 200 || body != "hello from the sandbox\n" {
			t.Fatalf("signed URL %s: %d %q", u, st, body)
		}
	}
	if _, err := c.SignedPortURL(ctx, "sbx-0000000000000000", 8000, 0); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("signed URL of no sandbox: %v", err)
	}
}

func TestPublicPorts(t *testing.T) {
	s := start(t)
	c := s.client()
	ctx := context.Background()
	res, err := c.CreateSandbox(ctx, client.CreateRequest{Template: "minimal", PublicPorts: true}, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if op, err := c.DeleteSandbox(context.Background(), res.Sandbox.ID); err == nil {
			c.WaitOperation(context.Background(), op.ID)
		}
	})
	if _, err := c.WaitOperation(ctx, res.Operation.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetSandbox(ctx, res.Sandbox.ID); err != nil || !got.PublicPorts {
		t.Fatalf("public_ports not kept: %+v %v", got, err)
	}
	sc := c.Sandbox(res.Session)
	startHTTPD(t, sc, 8080, "public\n")
	u, _ := sc.PortURL(8080)
	plain := dataDialer(sc.Session().DataURL)
	defer plain.CloseIdleConnections()
	if st, body := fetch(t, plain, u); st != 200 || body != "public\n" {
		t.Fatalf("public port without a token: %d %q", st, body)
	}
}
