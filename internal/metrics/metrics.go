// Package metrics is SPACE's Prometheus instrumentation: one Metrics per
// process, on a *prometheus.Registry its caller passes in (there is no
// global registry). It instruments at the edges: a core.Store decorator
// (store latency, and operations as the engine stores their outcome), a
// node.Observer (sandbox start and stop, warm pool, commands, snapshots),
// an HTTP middleware for the data plane (bytes, open streams), and
// collectors that read state at scrape time (sandboxes by state and
// driver, the node's instances, the egress gateway's counters).
//
// Labels are bounded: kinds, states, drivers, results, store methods and
// operator-configured warm templates; never sandbox, project or key ids.
package metrics

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/node"
)

// Buckets (seconds).
var (
	// opBuckets spans a warm create (a few ms) to a template build (minutes).
	opBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900}
	// fastBuckets is for store calls, command starts and instance starts.
	fastBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
)

// Metrics holds every metric of a process. Its methods are safe for
// concurrent use; a nil *Metrics is not (callers always make one).
type Metrics struct {
	reg *prometheus.Registry

	ops       *prometheus.CounterVec
	opSeconds *prometheus.HistogramVec

	storeSeconds *prometheus.HistogramVec
	storeErrors  *prometheus.CounterVec

	startSeconds    *prometheus.HistogramVec
	stopSeconds     *prometheus.HistogramVec
	execSeconds     *prometheus.HistogramVec
	commandExits    *prometheus.CounterVec
	warmClaims      *prometheus.CounterVec
	snapshots       *prometheus.CounterVec
	snapshotSeconds *prometheus.HistogramVec
	snapshotBytes   *prometheus.CounterVec

	templateBuilds  *prometheus.CounterVec
	templateSeconds *prometheus.HistogramVec

	dpRequests    *prometheus.CounterVec
	dpBytes       *prometheus.CounterVec
	dpStreams     prometheus.Counter
	dpStreamsOpen prometheus.Gauge
}

// New registers SPACE's metrics, the Go runtime's and the process's
// (memory, CPU, file descriptors) on reg.
func New(reg *prometheus.Registry) *Metrics {
	m := &Metrics{reg: reg}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(c)
		return c
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
		reg.MustRegister(h)
		return h
	}
	m.ops = counter("space_operations_total", "Operations finished, by kind (sandbox.create, …) and result (succeeded, failed, cancelled).", "kind", "result")
	m.opSeconds = histogram("space_operation_duration_seconds", "Time from an operation's creation to its end, by kind and result (operations a restart interrupted are not observed).", opBuckets, "kind", "result")
	m.storeSeconds = histogram("space_store_duration_seconds", "Latency of store calls, by method.", fastBuckets, "method")
	m.storeErrors = counter("space_store_errors_total", "Store calls that failed, by method (not found and conflicts are answers, not errors).", "method")
	m.startSeconds = histogram("space_sandbox_start_duration_seconds", "Time the node took to start a sandbox's instance, by driver, source (warm, cold, restore) and result (ok, error).", fastBuckets, "driver", "source", "result")
	m.stopSeconds = histogram("space_sandbox_stop_duration_seconds", "Time the node took to destroy a sandbox's instance, by driver and result.", fastBuckets, "driver", "result")
	m.execSeconds = histogram("space_exec_start_duration_seconds", "Time to start a command through the agent, by driver and result.", fastBuckets, "driver", "result")
	m.commandExits = counter("space_command_exits_total", "Commands that ended, by reason (exit_zero, exit_nonzero, signal, oom_killed, timed_out, error, lost).", "reason")
	m.warmClaims = counter("space_warm_pool_claims_total", "Creates of a warm template, by template and result (hit: a warm instance was claimed, miss: the pool was empty).", "template", "result")
	m.snapshots = counter("space_snapshot_captures_total", "Snapshot captures, by driver and result.", "driver", "result")
	m.snapshotSeconds = histogram("space_snapshot_capture_duration_seconds", "Time a snapshot capture took, by driver.", opBuckets, "driver")
	m.snapshotBytes = counter("space_snapshot_bytes_total", "Snapshot bytes by kind: read (file and process-image bytes hashed), written (new chunks and manifests stored), deduplicated (bytes read whose chunks were already stored).", "kind")
	m.templateBuilds = counter("space_template_builds_total", "Template builds, by source (api: a template.build operation, builtin: built at start) and result.", "source", "result")
	m.templateSeconds = histogram("space_template_build_duration_seconds", "Time a template build took, by source.", opBuckets, "source")
	m.dpRequests = counter("space_dataplane_requests_total", "Data-plane requests, by status class (2xx, 4xx, …).", "code")
	m.dpBytes = counter("space_dataplane_bytes_total", "Data-plane bytes, by direction (in: request bodies, out: response bodies).", "direction")
	m.dpStreams = prometheus.NewCounter(prometheus.CounterOpts{Name: "space_dataplane_streams_total", Help: "Data-plane streaming responses (SSE, binary frames, Connect streams) started."})
	m.dpStreamsOpen = prometheus.NewGauge(prometheus.GaugeOpts{Name: "space_dataplane_streams_open", Help: "Data-plane streaming responses open now."})
	reg.MustRegister(m.dpStreams, m.dpStreamsOpen,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry returns the registry the metrics are on.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// operationDone records an operation that reached a final state.
func (m *Metrics) operationDone(op core.Operation) {
	res := string(op.State)
	m.ops.WithLabelValues(op.Kind, res).Inc()
	if op.Error != nil && op.Error.Code == "interrupted" {
		return // failed at start-up: its age says nothing about its work
	}
	d := op.UpdatedAt.Sub(op.CreatedAt).Seconds()
	if d < 0 {
		d = 0
	}
	m.opSeconds.WithLabelValues(op.Kind, res).Observe(d)
	if op.Kind == "template.build" {
		m.templateBuilds.WithLabelValues("api", res).Inc()
		m.templateSeconds.WithLabelValues("api").Observe(d)
	}
}

// TemplateBuilt records a template build outside the operations engine
// (a builtin built at start).
func (m *Metrics) TemplateBuilt(source string, d time.Duration, err error) {
	res := string(core.OpSucceeded)
	if err != nil {
		res = string(core.OpFailed)
	}
	m.templateBuilds.WithLabelValues(source, res).Inc()
	m.templateSeconds.WithLabelValues(source).Observe(d.Seconds())
}

// Node returns the node.Observer that feeds these metrics.
func (m *Metrics) Node() node.Observer { return nodeObserver{m} }

type nodeObserver struct{ m *Metrics }

func (o nodeObserver) SandboxStarted(driver, source string, d time.Duration, err error) {
	o.m.startSeconds.WithLabelValues(driver, source, result(err)).Observe(d.Seconds())
}

func (o nodeObserver) SandboxStopped(driver string, d time.Duration, err error) {
	o.m.stopSeconds.WithLabelValues(driver, result(err)).Observe(d.Seconds())
}

func (o nodeObserver) WarmPoolClaim(template string, hit bool) {
	res := "miss"
	if hit {
		res = "hit"
	}
	o.m.warmClaims.WithLabelValues(template, res).Inc()
}

func (o nodeObserver) CommandStarted(driver string, d time.Duration, err error) {
	o.m.execSeconds.WithLabelValues(driver, result(err)).Observe(d.Seconds())
}

func (o nodeObserver) CommandExited(reason string) { o.m.commandExits.WithLabelValues(reason).Inc() }

func (o nodeObserver) SnapshotCaptured(driver string, st core.SnapshotStats, d time.Duration, err error) {
	o.m.snapshots.WithLabelValues(driver, result(err)).Inc()
	if err != nil {
		return
	}
	o.m.snapshotSeconds.WithLabelValues(driver).Observe(d.Seconds())
	read := st.BytesRead + st.ProcessImageBytes
	dedup := read - st.ChunkBytes - st.ProcessChunkBytes
	if dedup < 0 {
		dedup = 0
	}
	o.m.snapshotBytes.WithLabelValues("read").Add(float64(read))
	o.m.snapshotBytes.WithLabelValues("written").Add(float64(st.BytesStored))
	o.m.snapshotBytes.WithLabelValues("deduplicated").Add(float64(dedup))
}

// storeFailed reports whether err is a store failure rather than an answer.
func storeFailed(err error) bool {
	return err != nil && !errors.Is(err, core.ErrNotFound) && !errors.Is(err, core.ErrConflict)
}
