package metrics

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/space-sandbox/space/internal/audit"
	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/store/sqlite"
)

func openStore(t testing.TB) core.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// value reads a counter's or gauge's value.
func value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// plainStore implements core.Store and nothing else.
type plainStore struct{ core.Store }

func TestStoreKeepsOptionalInterfaces(t *testing.T) {
	m := New(prometheus.NewRegistry())
	st := openStore(t)
	_, wantNS := st.(core.NodeStore)
	_, wantEW := st.(core.EventWatcher)
	w := m.Store(st)
	if _, ok := w.(core.NodeStore); ok != wantNS {
		t.Errorf("NodeStore kept: %v, inner has it: %v", ok, wantNS)
	}
	if _, ok := w.(core.EventWatcher); ok != wantEW {
		t.Errorf("EventWatcher kept: %v, inner has it: %v", ok, wantEW)
	}
	p := m.Store(plainStore{st})
	if _, ok := p.(core.NodeStore); ok {
		t.Error("a plain store gained NodeStore")
	}
	if _, ok := p.(core.OwnedOperations); ok {
		t.Error("a plain store gained OwnedOperations")
	}
}

func TestStoreCountsOperations(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	st := m.Store(openStore(t))
	ctx := context.Background()
	t0 := time.Now().UTC()
	op := core.Operation{ID: core.NewID("op-"), ProjectID: "p", Kind: "sandbox.create", Target: "sbx-1",
		State: core.OpPending, CreatedAt: t0, UpdatedAt: t0}
	if _, _, err := st.CreateOperation(ctx, op, ""); err != nil {
		t.Fatal(err)
	}
	op.State, op.UpdatedAt = core.OpRunning, t0.Add(time.Millisecond)
	if err := st.UpdateOperation(ctx, op); err != nil {
		t.Fatal(err)
	}
	if got := value(m.ops.WithLabelValues("sandbox.create", "succeeded")); got != 0 {
		t.Fatalf("a running operation was counted: %v", got)
	}
	op.State, op.UpdatedAt = core.OpSucceeded, t0.Add(40*time.Millisecond)
	if err := st.UpdateOperation(ctx, op); err != nil {
		t.Fatal(err)
	}
	// One interrupted by a restart: counted, its age not observed.
	op2 := op
	op2.ID, op2.State, op2.Error = core.NewID("op-"), core.OpFailed, &core.OpError{Code: "interrupted"}
	op2.UpdatedAt = t0.Add(time.Hour)
	if _, _, err := st.CreateOperation(ctx, op2, ""); err != nil {
		t.Fatal(err)
	}
	if err := st.UpdateOperation(ctx, op2); err != nil {
		t.Fatal(err)
	}
	if got := value(m.ops.WithLabelValues("sandbox.create", "succeeded")); got != 1 {
		t.Errorf("succeeded creates: %v, want 1", got)
	}
	if got := value(m.ops.WithLabelValues("sandbox.create", "failed")); got != 1 {
		t.Errorf("failed creates: %v, want 1", got)
	}
	h := histogram(t, reg, "space_operation_duration_seconds", map[string]string{"kind": "sandbox.create", "result": "succeeded"})
	if h.GetSampleCount() != 1 || h.GetSampleSum() < 0.039 || h.GetSampleSum() > 0.041 {
		t.Errorf("create histogram: count %d sum %v, want 1 and 0.04", h.GetSampleCount(), h.GetSampleSum())
	}
	if h := histogram(t, reg, "space_operation_duration_seconds", map[string]string{"kind": "sandbox.create", "result": "failed"}); h != nil {
		t.Errorf("an interrupted operation was observed: %v", h)
	}
	calls := histogram(t, reg, "space_store_duration_seconds", map[string]string{"method": "UpdateOperation"})
	if calls.GetSampleCount() != 3 {
		t.Errorf("UpdateOperation calls: %d, want 3", calls.GetSampleCount())
	}
	if _, err := st.GetSandbox(ctx, "", "sbx-none"); err == nil {
		t.Fatal("found a sandbox that does not exist")
	}
	if got := value(m.storeErrors.WithLabelValues("GetSandbox")); got != 0 {
		t.Errorf("not found counted as a store error: %v", got)
	}
}

func histogram(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Histogram {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue next
				}
			}
			return m.Histogram
		}
	}
	return nil
}

func TestControlAPIAdminOnly(t *testing.T) {
	m := New(prometheus.NewRegistry())
	st := openStore(t)
	keys := auth.NewKeys(st, time.Now)
	ctx := context.Background()
	_, adminKey, err := keys.CreateKey(ctx, "ops", "", true)
	if err != nil {
		t.Fatal(err)
	}
	_, projectKey, err := keys.CreateKey(ctx, "p1", "", false)
	if err != nil {
		t.Fatal(err)
	}
	var auditLog bytes.Buffer
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "next") })
	srv := httptest.NewServer(m.ControlAPI(next, keys, audit.New(&auditLog)))
	defer srv.Close()
	do := func(method, path, key string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		method, path, key string
		status            int
		body              string
	}{
		{"GET", "/metrics", "", 401, `"unauthorized"`},
		{"GET", "/metrics", "space_nope", 401, "invalid API key"},
		{"GET", "/metrics", projectKey, 403, `"forbidden"`},
		{"POST", "/metrics", adminKey, 405, `"method_not_allowed"`},
		{"GET", "/metrics", adminKey, 200, "go_goroutines"},
		{"GET", "/v1/info", "", 200, "next"},
	} {
		st, body := do(c.method, c.path, c.key)
		if st != c.status || !strings.Contains(body, c.body) {
			t.Errorf("%s %s: %d %.200s, want %d with %s", c.method, c.path, st, body, c.status, c.body)
		}
	}
	if !strings.Contains(auditLog.String(), `"action":"GET /metrics","outcome":"denied","project":"p1"`) {
		t.Errorf("the refusal is not audited: %s", auditLog.String())
	}
}

func TestDataPlaneCountsBytesAndStreams(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	release := make(chan struct{})
	streaming := make(chan struct{})
	h := m.DataPlane(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			io.WriteString(w, "data: hello\n\n")
			if err := http.NewResponseController(w).Flush(); err != nil {
				t.Errorf("flush through the wrapper: %v", err)
			}
			close(streaming)
			<-release
			return
		}
		if r.URL.Path == "/missing" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte("12345"))
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/plain", "application/octet-stream", strings.NewReader("abcdefgh"))
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp, err = http.Get(srv.URL + "/missing"); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Get(srv.URL + "/stream")
		if err != nil {
			t.Error(err)
			return
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
	}()
	<-streaming
	if got := value(m.dpStreamsOpen); got != 1 {
		t.Errorf("open streams while streaming: %v, want 1", got)
	}
	close(release)
	<-done
	// The handler has returned once the client saw the end of the body.
	deadline := time.Now().Add(2 * time.Second)
	for value(m.dpStreamsOpen) != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"open streams after", value(m.dpStreamsOpen), 0},
		{"streams", value(m.dpStreams), 1},
		{"bytes in", value(m.dpBytes.WithLabelValues("in")), 8},
		{"bytes out", value(m.dpBytes.WithLabelValues("out")), float64(5 + len("data: hello\n\n") + len("404 page not found\n"))},
		{"2xx", value(m.dpRequests.WithLabelValues("2xx")), 2},
		{"4xx", value(m.dpRequests.WithLabelValues("4xx")), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
}

// The bridged egress counters have the names and values the gateway's own
// --egress-metrics endpoint serves.
func TestEgressBridgeMatchesGateway(t *testing.T) {
	gw, err := egress.New(egress.Config{Upstream: netip.MustParseAddrPort("127.0.0.1:53")})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	reg := prometheus.NewRegistry()
	New(reg).WatchEgress(gw)
	var own bytes.Buffer
	if err := gw.WriteMetrics(&own); err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	want, err := p.TextToMetricFamilies(&own)
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "space_egress_") {
			got[mf.GetName()] = mf
		}
	}
	for name, w := range want {
		g := got[name]
		switch {
		case g == nil && len(w.Metric) > 0:
			t.Errorf("%s: not bridged", name)
		case g != nil && g.GetType() != w.GetType():
			t.Errorf("%s: type %v, gateway says %v", name, g.GetType(), w.GetType())
		}
	}
	for name := range got {
		if want[name] == nil {
			t.Errorf("%s: bridged but not served by the gateway", name)
		}
	}
}

func TestServe(t *testing.T) {
	m := New(prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	addr, err := m.Serve(ctx, &wg, "127.0.0.1:0", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "go_goroutines") {
		t.Errorf("GET /metrics: %d %.200s", resp.StatusCode, b)
	}
	cancel()
	wg.Wait()
	if _, err := http.Get("http://" + addr + "/metrics"); err == nil {
		t.Error("the listener still serves after its context ended")
	}
}

func TestSnapshotBytes(t *testing.T) {
	m := New(prometheus.NewRegistry())
	o := m.Node()
	// 10 MiB of files read, 3 MiB of them new chunks; a 4 MiB process
	// image with 1 MiB new; 3+1 MiB chunks and a 2 KiB manifest stored.
	o.SnapshotCaptured("gvisor", core.SnapshotStats{BytesRead: 10 << 20, ChunkBytes: 3 << 20, ProcessImageBytes: 4 << 20,
		ProcessChunkBytes: 1 << 20, ManifestBytes: 2048, BytesStored: 4<<20 + 2048}, 30*time.Millisecond, nil)
	o.SnapshotCaptured("gvisor", core.SnapshotStats{}, time.Millisecond, io.ErrUnexpectedEOF)
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"read", value(m.snapshotBytes.WithLabelValues("read")), 14 << 20},
		{"written", value(m.snapshotBytes.WithLabelValues("written")), 4<<20 + 2048},
		{"deduplicated", value(m.snapshotBytes.WithLabelValues("deduplicated")), 10 << 20},
		{"ok captures", value(m.snapshots.WithLabelValues("gvisor", "ok")), 1},
		{"failed captures", value(m.snapshots.WithLabelValues("gvisor", "error")), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
}
