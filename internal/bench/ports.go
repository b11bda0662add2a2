package bench

import (
	"bufio"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The port benchmark's HTTP server: the same binary serves inside a
// sandbox (forwarded) and on the host's loopback (direct).
const (
	portServerPort = 8080
	// SmallBody is what GET /small answers.
	SmallBody = "hello from the port benchmark\n"
	// LargeBytes is the size of GET /1mib's answer.
	LargeBytes = 1 << 20
)

// ServePorts runs the port benchmark's HTTP server on addr ("127.0.0.1:0"
// picks a port) and prints "listening ADDR" once it accepts connections:
// GET /small answers SmallBody, GET /1mib LargeBytes bytes. It is `space
// bench serve-http ADDR`, what the port benchmark runs in the sandbox and
// on the host; it returns when ctx ends.
func ServePorts(ctx context.Context, addr string, out io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	large := make([]byte, LargeBytes)
	for i := range large {
		large[i] = byte('a' + i%26)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /small", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", strconv.Itoa(len(SmallBody)))
		io.WriteString(w, SmallBody)
	})
	mux.HandleFunc("GET /1mib", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(large)))
		w.Write(large)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	fmt.Fprintf(out, "listening %s\n", ln.Addr())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// PortLoad is one response size over one path.
type PortLoad struct {
	// Sequential: one keep-alive client, one request at a time
	// (request sent → whole body read).
	Sequential Summary `json:"sequential"`
	// Concurrent: Clients keep-alive clients at once.
	Concurrent  Summary `json:"concurrent"`
	RequestsPS  float64 `json:"concurrent_requests_per_s"`
	MBps        float64 `json:"concurrent_mb_per_s,omitempty"`
	HostCPUUs   float64 `json:"bench_process_cpu_us_per_request"` // client (+ server, data plane, forwarder when forwarded), concurrent phase
	AgentCPUUs  float64 `json:"agent_cpu_us_per_request,omitempty"`
	ServerCPUUs float64 `json:"http_server_cpu_us_per_request,omitempty"` // the HTTP server's own process (in the sandbox when forwarded)
}

// PortPath is both sizes over one path.
type PortPath struct {
	URL   string   `json:"url"`
	Small PortLoad `json:"small"`
	Large PortLoad `json:"1mib"`
}

// PortsResult compares a forwarded port with the same server reached
// directly on the host's loopback.
type PortsResult struct {
	Requests      int      `json:"requests"`     // small requests per phase; 1 MiB: a tenth, at least 50
	Clients       int      `json:"clients"`      // concurrent keep-alive clients
	SandboxCPUs   float64  `json:"sandbox_cpus"` // the sandbox's CPU limit (the direct server has none)
	Direct        PortPath `json:"direct"`       // host loopback, separate process
	Forwarded     PortPath `json:"forwarded"`    // data listener, host form, session token
	AddedP50Small float64  `json:"added_p50_ms_small"`
	AddedP50Large float64  `json:"added_p50_ms_1mib"`
	Notes         string   `json:"notes"`
}

// portRequests: small requests per phase unless configured.
const defaultPortRequests = 2000

// portTargets is the port benchmark's two servers and a keep-alive
// client for each.
type portTargets struct {
	Direct, Forwarded     *http.Client
	DirectURL, ForwardURL string // base URLs, no trailing slash
	agentPID, boxPID      int    // the sandbox's agent and HTTP server
	directPID             int
	close                 func() error
}

// startPortTargets creates a sandbox running serverBin's `bench serve-http`
// on port 8080 and starts the same binary on the host's loopback. The
// caller must call close.
func startPortTargets(ctx context.Context, env *Env, serverBin string, clients int) (_ *portTargets, err error) {
	if ef, err := elf.Open(serverBin); err == nil {
		for _, p := range ef.Progs {
			if p.Type == elf.PT_INTERP {
				ef.Close()
				return nil, fmt.Errorf("%s is dynamically linked and cannot run in the sandbox: build it with CGO_ENABLED=0", serverBin)
			}
		}
		ef.Close()
	}
	var closers []func() error
	pt := &portTargets{close: func() error {
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			errs = append(errs, closers[i]())
		}
		return errors.Join(errs...)
	}}
	defer func() {
		if err != nil {
			pt.close()
		}
	}()
	// The sandbox gets every CPU so its server is not throttled below the
	// direct one's.
	sb, err := env.Client.CreateWith(ctx, map[string]any{"template": ColdTemplate,
		"limits": map[string]any{"cpu_millis": runtime.NumCPU() * 1000}})
	if sb.ID != "" {
		closers = append(closers, func() error { return env.Client.Delete(context.WithoutCancel(ctx), sb.ID) })
	}
	if err != nil {
		return nil, err
	}
	f, err := os.Open(serverBin)
	if err != nil {
		return nil, err
	}
	err = env.Client.Upload(ctx, sb, "/tmp/portbench", 0o755, f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("upload the server: %w", err)
	}
	if _, err := env.Client.StartCommand(ctx, sb, []string{"/tmp/portbench", "bench", "serve-http", "127.0.0.1:" + strconv.Itoa(portServerPort)}); err != nil {
		return nil, err
	}
	if err := env.Client.WaitPort(ctx, sb, portServerPort, 30*time.Second); err != nil {
		return nil, err
	}

	// The direct server: the same binary, a process of its own on the host.
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	cmd := exec.CommandContext(sctx, serverBin, "bench", "serve-http", "127.0.0.1:0")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		stop()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		stop()
		return nil, err
	}
	closers = append(closers, func() error {
		stop() // kills it
		cmd.Wait()
		return nil
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		return nil, fmt.Errorf("direct server: %q %v", line, err)
	}
	du, err := url.Parse(sb.DataURL)
	if err != nil {
		return nil, err
	}
	pt.Direct = newPortClient(addr, clients, "")
	pt.Forwarded = newPortClient(du.Host, clients, sb.Token)
	closers = append(closers, func() error {
		pt.Direct.CloseIdleConnections()
		pt.Forwarded.CloseIdleConnections()
		return nil
	})
	pt.DirectURL = "http://" + addr
	pt.ForwardURL = fmt.Sprintf("http://%d-%s.localhost:%s", portServerPort, sb.ID, du.Port())
	pt.agentPID, pt.boxPID, pt.directPID = env.AgentPID(sb.ID), env.sandboxProc(sb.ID, "portbench"), cmd.Process.Pid
	return pt, nil
}

// RunPorts measures a forwarded port against the direct path. serverBin
// is a static `space` binary (it runs `bench serve-http`); requests and
// clients size the phases.
func RunPorts(ctx context.Context, env *Env, serverBin string, requests, clients int) (_ *PortsResult, err error) {
	if requests <= 0 {
		requests = defaultPortRequests
	}
	clients = max(clients, 1)
	res := &PortsResult{Requests: requests, Clients: clients, SandboxCPUs: float64(runtime.NumCPU()),
		Notes: "direct: the same binary on the host loopback (no cgroup limit); forwarded: client → data listener (HTTP/1.1 keep-alive) → reverse proxy → one agent stream per upstream connection (unix socket, HTTP Upgrade) → agent dials 127.0.0.1:8080 in the sandbox. Bench process = client + server + data plane in one process."}
	pt, err := startPortTargets(ctx, env, serverBin, clients)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := pt.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	res.Direct.URL, res.Forwarded.URL = pt.DirectURL, pt.ForwardURL
	large := max(requests/10, 50)
	type phase struct {
		path    string
		c       *http.Client
		base    string
		out     *PortLoad
		n       int
		want    int64
		agent   int
		process int
	}
	for _, p := range []phase{
		{"direct small", pt.Direct, pt.DirectURL + "/small", &res.Direct.Small, requests, int64(len(SmallBody)), 0, pt.directPID},
		{"forwarded small", pt.Forwarded, pt.ForwardURL + "/small", &res.Forwarded.Small, requests, int64(len(SmallBody)), pt.agentPID, pt.boxPID},
		{"direct 1mib", pt.Direct, pt.DirectURL + "/1mib", &res.Direct.Large, large, LargeBytes, 0, pt.directPID},
		{"forwarded 1mib", pt.Forwarded, pt.ForwardURL + "/1mib", &res.Forwarded.Large, large, LargeBytes, pt.agentPID, pt.boxPID},
	} {
		if err := measurePort(ctx, p.c, p.base, p.n, clients, p.want, p.agent, p.process, p.out); err != nil {
			return res, fmt.Errorf("%s: %w", p.path, err)
		}
	}
	res.AddedP50Small = round3(res.Forwarded.Small.Sequential.P50 - res.Direct.Small.Sequential.P50)
	res.AddedP50Large = round3(res.Forwarded.Large.Sequential.P50 - res.Direct.Large.Sequential.P50)
	return res, nil
}

func round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }

// newPortClient is a keep-alive client that dials addr whatever the URL's
// host (as wildcard DNS for the sandbox domain would) and sends token in
// X-Access-Token when set.
func newPortClient(addr string, conns int, token string) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		DisableCompression:  true,
		IdleConnTimeout:     time.Minute,
	}
	var rt http.RoundTripper = tr
	if token != "" {
		rt = tokenTransport{tr, token}
	}
	return &http.Client{Transport: rt, Timeout: time.Minute}
}

type tokenTransport struct {
	*http.Transport
	token string
}

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Access-Token", t.token)
	return t.Transport.RoundTrip(r)
}

// getBody GETs u and reads the whole body, checking its size.
func getBody(ctx context.Context, c *http.Client, u string, want int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || n != want {
		return fmt.Errorf("GET %s: %d with %d bytes, want 200 with %d", u, resp.StatusCode, n, want)
	}
	return nil
}

// measurePort runs n sequential requests, then n split over clients
// concurrent keep-alive clients, recording CPU of this process, the
// sandbox's agent (agentPID) and the HTTP server (serverPID).
func measurePort(ctx context.Context, c *http.Client, u string, n, clients int, want int64, agentPID, serverPID int, out *PortLoad) error {
	for i := 0; i < 20; i++ { // connections, the agent's tunnel, caches
		if err := getBody(ctx, c, u, want); err != nil {
			return err
		}
	}
	seq := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if err := getBody(ctx, c, u, want); err != nil {
			return err
		}
		seq = append(seq, time.Since(t0))
	}
	out.Sequential = Summarize(seq)
	var (
		mu   sync.Mutex
		lat  = make([]time.Duration, 0, n)
		next = make(chan struct{}, n)
	)
	for i := 0; i < n; i++ {
		next <- struct{}{}
	}
	close(next)
	a0, _ := procCPU(agentPID)
	s0, _ := procCPU(serverPID)
	h0 := selfCPU()
	t0 := time.Now()
	errs := forEach(ctx, clients, clients, func(ctx context.Context, _ int) error {
		var mine []time.Duration
		for range next {
			t := time.Now()
			if err := getBody(ctx, c, u, want); err != nil {
				return err
			}
			mine = append(mine, time.Since(t))
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
		return nil
	})
	wall := time.Since(t0)
	if len(errs) > 0 {
		return errs[0]
	}
	h1 := selfCPU()
	a1, _ := procCPU(agentPID)
	s1, _ := procCPU(serverPID)
	out.Concurrent = Summarize(lat)
	out.RequestsPS = round1(float64(n) / wall.Seconds())
	if want >= LargeBytes {
		out.MBps = round1(float64(int64(n)*want) / 1e6 / wall.Seconds())
	}
	perReq := func(d float64) float64 { return round1(d * 1e6 / float64(n)) }
	out.HostCPUUs = perReq(h1 - h0)
	if agentPID > 0 {
		out.AgentCPUUs = perReq(a1 - a0)
	}
	if serverPID > 0 {
		out.ServerCPUUs = perReq(s1 - s0)
	}
	return nil
}

// CreateWith creates a sandbox from a full create body and waits until it
// runs.
func (c *Client) CreateWith(ctx context.Context, body map[string]any) (Sandbox, error) {
	sb, id, err := c.startCreate(ctx, body)
	if err != nil {
		return sb, err
	}
	_, err = c.waitOp(ctx, id)
	return sb, err
}

// Upload writes r to path in the sandbox with mode.
func (c *Client) Upload(ctx context.Context, sb Sandbox, path string, mode os.FileMode, r io.Reader) error {
	u := sb.DataURL + "/v1/sandboxes/" + url.PathEscape(sb.ID) + "/files?" +
		url.Values{"path": {path}, "mode": {strconv.FormatUint(uint64(mode.Perm()), 8)}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("PUT %s: %d %s", path, resp.StatusCode, msg)
	}
	return nil
}

// WaitPort waits (GET /ports?wait=) until something listens on port.
func (c *Client) WaitPort(ctx context.Context, sb Sandbox, port int, timeout time.Duration) error {
	u := fmt.Sprintf("%s/v1/sandboxes/%s/ports?wait=%d&timeout_ms=%d", sb.DataURL, url.PathEscape(sb.ID), port, timeout.Milliseconds())
	return c.do(ctx, http.MethodGet, u, sb.Token, nil, http.StatusOK, nil)
}

// sandboxProc is the host pid of the process named comm in a sandbox's
// cgroup (0 if none).
func (e *Env) sandboxProc(id, comm string) int {
	for _, p := range e.scope.dirs {
		for _, base := range e.scope.bases() {
			data, err := os.ReadFile(filepath.Join(p.dir, base, id, "cgroup.procs"))
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(data)) {
				if c, err := os.ReadFile("/proc/" + f + "/comm"); err == nil && strings.TrimSpace(string(c)) == comm {
					pid, _ := strconv.Atoi(f)
					return pid
				}
			}
		}
	}
	return 0
}
