// Package metrics scrapes a real `space server`'s Prometheus metrics (on
// the control API with an admin key, and on the --metrics-listen operator
// listener) around a workload: sandboxes created, a command run, sandboxes
// deleted. It parses every scrape with the Prometheus text parser and
// checks that the counters, histograms and gauges moved by what the
// workload did. It needs root (namespace driver).
package metrics

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/space-sandbox/space/test/testenv"
)

// scrape is one parsed exposition.
type scrape map[string]*dto.MetricFamily

func get(t *testing.T, url, key string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := testenv.HTTP.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func parse(t *testing.T, body []byte) scrape {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse metrics: %v\n%.2000s", err, body)
	}
	return mf
}

// matches reports whether m carries every label in labels.
func matches(m *dto.Metric, labels map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.Label {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range labels {
		if have[k] != v {
			return false
		}
	}
	return true
}

func (s scrape) find(name string, labels map[string]string) *dto.Metric {
	if mf := s[name]; mf != nil {
		for _, m := range mf.Metric {
			if matches(m, labels) {
				return m
			}
		}
	}
	return nil
}

// value is a counter's or gauge's value, or a histogram's sample count (0
// when the series does not exist yet).
func (s scrape) value(name string, labels map[string]string) float64 {
	if m := s.find(name, labels); m != nil {
		return number(m)
	}
	return 0
}

func number(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return math.NaN()
}

// sum adds value over every series of name that matches labels.
func (s scrape) sum(name string, labels map[string]string) float64 {
	total := 0.0
	if mf := s[name]; mf != nil {
		for _, m := range mf.Metric {
			if matches(m, labels) {
				total += number(m)
			}
		}
	}
	return total
}

type sandbox struct{ ID, Token, Data string }

func TestMetricsDuringWorkload(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces, cgroups, overlayfs)")
	}
	srv, err := testenv.New("space-metrics-")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Remove()
	metricsAddr := testenv.FreeAddr(t)
	srv.Args = []string{"--builtins", "minimal", "--warm-templates", "minimal", "--warm-pool", "1",
		"--metrics-listen", metricsAddr}
	defer srv.RemoveCgroupBase() // after Stop: only empty groups go
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	defer func() {
		if t.Failed() {
			t.Logf("server log:\n%s", srv.LogTail(8000))
		}
	}()
	admin, err := srv.CreateKey("ops", "--admin")
	if err != nil {
		t.Fatal(err)
	}
	key, err := srv.CreateKey("p1")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitTemplate(key, "minimal", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	ctrlMetrics := srv.Ctrl + "/metrics"

	// Only admin keys read /metrics on the control API.
	if st, b := get(t, ctrlMetrics, ""); st != 401 {
		t.Fatalf("no key: %d %s", st, b)
	}
	if st, b := get(t, ctrlMetrics, "space_not-a-key"); st != 401 {
		t.Fatalf("bad key: %d %s", st, b)
	}
	if st, b := get(t, ctrlMetrics, key); st != 403 || !strings.Contains(string(b), `"forbidden"`) {
		t.Fatalf("project key: %d %s", st, b)
	}
	scrapeCtrl := func() scrape {
		t.Helper()
		st, b := get(t, ctrlMetrics, admin)
		if st != 200 {
			t.Fatalf("admin scrape: %d %.500s", st, b)
		}
		return parse(t, b)
	}
	// Wait for the warm pool to hold its instance, so the first create hits it.
	deadline := time.Now().Add(60 * time.Second)
	for scrapeCtrl().value("space_warm_pool_ready", map[string]string{"template": "minimal"}) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("warm pool never filled")
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := scrapeCtrl()
	t.Logf("metric families at start: %d", len(before))

	const n = 3
	var sbs []sandbox
	for i := 0; i < n; i++ {
		st, m, err := testenv.DoJSON("POST", srv.Ctrl+"/v1/sandboxes", map[string]string{"X-API-Key": key},
			map[string]any{"template": "minimal", "timeout_seconds": 300})
		if err != nil || st != 202 {
			t.Fatalf("create: %d %v %v", st, m, err)
		}
		sess := m["session"].(map[string]any)
		sb := sandbox{ID: m["sandbox"].(map[string]any)["id"].(string), Token: sess["token"].(string), Data: sess["data_url"].(string)}
		waitOp(t, srv.Ctrl, key, m["operation"].(map[string]any)["id"].(string))
		sbs = append(sbs, sb)
	}
	during := scrapeCtrl()
	running := map[string]string{"state": "running", "driver": "namespace"}
	if got, want := during.value("space_sandboxes", running)-before.value("space_sandboxes", running), float64(n); got != want {
		t.Errorf("space_sandboxes{state=running} grew by %v, want %v", got, want)
	}
	nodeRunning := map[string]string{"state": "running", "driver": "namespace"}
	if got := during.value("space_node_sandboxes", nodeRunning) - before.value("space_node_sandboxes", nodeRunning); got != n {
		t.Errorf("space_node_sandboxes{state=running} grew by %v, want %d", got, n)
	}

	// One command through the data plane, its output followed over SSE.
	out := runCommand(t, sbs[0], "echo metrics-test; head -c 100000 /dev/zero | tr '\\0' x")
	if !strings.HasPrefix(out, "metrics-test\n") || len(out) != len("metrics-test\n")+100000 {
		t.Fatalf("command output: %d bytes, %.40q", len(out), out)
	}
	for _, sb := range sbs {
		st, m, err := testenv.DoJSON("DELETE", srv.Ctrl+"/v1/sandboxes/"+sb.ID, map[string]string{"X-API-Key": key}, nil)
		if err != nil || st != 202 {
			t.Fatalf("delete: %d %v %v", st, m, err)
		}
		waitOp(t, srv.Ctrl, key, m["operation"].(map[string]any)["id"].(string))
	}
	// The command's pump and the stream's accounting finish just after
	// the client has the exit event; give them a moment.
	var after scrape
	for i := 0; i < 50; i++ {
		after = scrapeCtrl()
		if after.value("space_dataplane_streams_open", nil) == before.value("space_dataplane_streams_open", nil) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	delta := func(name string, labels map[string]string) float64 {
		return after.value(name, labels) - before.value(name, labels)
	}
	storeCalls := func(methods ...string) float64 {
		var sum float64
		for _, m := range methods {
			sum += delta("space_store_duration_seconds", map[string]string{"method": m})
		}
		return sum
	}
	created := map[string]string{"kind": "sandbox.create", "result": "succeeded"}
	deleted := map[string]string{"kind": "sandbox.delete", "result": "succeeded"}
	checks := []struct {
		what      string
		got, want float64
		atLeast   bool
	}{
		{"space_operations_total{sandbox.create,succeeded}", delta("space_operations_total", created), n, false},
		{"space_operations_total{sandbox.delete,succeeded}", delta("space_operations_total", deleted), n, false},
		{"space_operation_duration_seconds{sandbox.create} count", delta("space_operation_duration_seconds", created), n, false},
		{"space_operation_duration_seconds{sandbox.delete} count", delta("space_operation_duration_seconds", deleted), n, false},
		{"space_sandbox_start_duration_seconds{ok} count", after.sum("space_sandbox_start_duration_seconds", map[string]string{"result": "ok"}) -
			before.sum("space_sandbox_start_duration_seconds", map[string]string{"result": "ok"}), n, false},
		{"space_sandbox_stop_duration_seconds{ok} count", delta("space_sandbox_stop_duration_seconds", map[string]string{"driver": "namespace", "result": "ok"}), n, false},
		{"space_warm_pool_claims_total{hit}", delta("space_warm_pool_claims_total", map[string]string{"template": "minimal", "result": "hit"}), 1, true},
		{"space_warm_pool_claims_total{hit+miss}", after.sum("space_warm_pool_claims_total", nil) - before.sum("space_warm_pool_claims_total", nil), n, false},
		{"space_exec_start_duration_seconds{ok} count", delta("space_exec_start_duration_seconds", map[string]string{"driver": "namespace", "result": "ok"}), 1, false},
		{"space_command_exits_total{exit_zero}", delta("space_command_exits_total", map[string]string{"reason": "exit_zero"}), 1, false},
		{"space_dataplane_streams_total", delta("space_dataplane_streams_total", nil), 1, true},
		{"space_dataplane_bytes_total{out}", delta("space_dataplane_bytes_total", map[string]string{"direction": "out"}), 100000, true},
		{"space_dataplane_bytes_total{in}", delta("space_dataplane_bytes_total", map[string]string{"direction": "in"}), 1, true},
		{"space_dataplane_requests_total{2xx}", delta("space_dataplane_requests_total", map[string]string{"code": "2xx"}), 2, true},
		// A store that writes a record with its events in one transaction
		// (core.RecordEvents, core.OperationEvents: SQLite) is timed under
		// those calls' names.
		{"space_store_duration_seconds{CreateSandboxOp+CreateSandboxOpEvents} count", storeCalls("CreateSandboxOp", "CreateSandboxOpEvents"), n, false},
		{"space_store_duration_seconds{UpdateOperation+UpdateOperationEvent} count", storeCalls("UpdateOperation", "UpdateOperationEvent"), 4 * n, true},
		{"space_sandboxes{running} back to where it was", after.value("space_sandboxes", running) - before.value("space_sandboxes", running), 0, false},
		{"space_node_sandboxes{running} back", after.value("space_node_sandboxes", nodeRunning) - before.value("space_node_sandboxes", nodeRunning), 0, false},
		{"space_dataplane_streams_open back", delta("space_dataplane_streams_open", nil), 0, false},
		{"process_resident_memory_bytes", after.value("process_resident_memory_bytes", nil), 1 << 20, true},
	}
	for _, c := range checks {
		if c.atLeast && c.got < c.want || !c.atLeast && c.got != c.want {
			op := "=="
			if c.atLeast {
				op = ">="
			}
			t.Errorf("%s: moved by %v, want %s %v", c.what, c.got, op, c.want)
		} else {
			t.Logf("%s: %v", c.what, c.got)
		}
	}
	// The histogram's sum is the time the creates took: positive, and under
	// a minute each on any host that passes the rest.
	if mm := after.find("space_operation_duration_seconds", created); mm == nil {
		t.Error("no create histogram")
	} else if s := mm.Histogram.GetSampleSum() - before.find("space_operation_duration_seconds", created).GetHistogram().GetSampleSum(); s <= 0 || s > 60*n {
		t.Errorf("create histogram sum moved by %v s", s)
	} else {
		t.Logf("mean create (operation) latency: %.1f ms", 1000*s/n)
	}

	// The operator listener serves the same registry without a key.
	st, b := get(t, "http://"+metricsAddr+"/metrics", "")
	if st != 200 {
		t.Fatalf("operator listener: %d %.300s", st, b)
	}
	op := parse(t, b)
	if got := op.value("space_operations_total", created); got != after.value("space_operations_total", created) {
		t.Errorf("operator listener: creates %v, control API %v", got, after.value("space_operations_total", created))
	}
	if st, _ := get(t, "http://"+metricsAddr+"/", ""); st != 404 {
		t.Errorf("operator listener /: %d, want 404", st)
	}
	t.Logf("families on the operator listener: %d, bytes: %d", len(op), len(b))
}

func waitOp(t *testing.T, ctrl, key, id string) {
	t.Helper()
	for i := 0; i < 20; i++ {
		st, m, err := testenv.DoJSON("GET", ctrl+"/v1/operations/"+id+"?wait=30s", map[string]string{"X-API-Key": key}, nil)
		if err != nil || st != 200 {
			t.Fatalf("get operation: %d %v %v", st, m, err)
		}
		switch m["state"] {
		case "succeeded":
			return
		case "failed", "cancelled":
			t.Fatalf("operation %s: %v", id, m)
		}
	}
	t.Fatalf("operation %s not done", id)
}

// runCommand starts shell in sb and follows its SSE stream to the exit
// event, returning stdout.
func runCommand(t *testing.T, sb sandbox, shell string) string {
	t.Helper()
	st, m, err := testenv.DoJSON("POST", sb.Data+"/v1/sandboxes/"+sb.ID+"/commands",
		map[string]string{"Authorization": "Bearer " + sb.Token}, map[string]any{"shell": shell})
	if err != nil || st != 201 {
		t.Fatalf("start command: %d %v %v", st, m, err)
	}
	req, _ := http.NewRequest("GET", fmt.Sprintf("%s/v1/sandboxes/%s/commands/%s/events", sb.Data, sb.ID, m["id"]), nil)
	req.Header.Set("Authorization", "Bearer "+sb.Token)
	resp, err := testenv.HTTP.Do(req)
	if err != nil {
		t.Fatalf("events: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("events: %d", resp.StatusCode)
	}
	var out bytes.Buffer
	typ := ""
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			typ = line[7:]
		case strings.HasPrefix(line, "data: ") && typ == "stdout":
			raw, err := base64.StdEncoding.DecodeString(line[6:])
			if err != nil {
				t.Fatalf("stdout data: %v", err)
			}
			out.Write(raw)
		case strings.HasPrefix(line, "data: ") && typ == "exit":
			if !strings.Contains(line, `"exit_code":0`) {
				t.Fatalf("exit: %s", line)
			}
			return out.String()
		}
	}
	t.Fatalf("stream ended without an exit event: %v", sc.Err())
	return ""
}
