package e2b

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
)

// sandboxMetric is E2B's SandboxMetric.
type sandboxMetric struct {
	TimestampUnix int64   `json:"timestampUnix"`
	Timestamp     string  `json:"timestamp"` // RFC 3339 (deprecated by E2B, still read by the SDK)
	CPUCount      int     `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	MemCache      int64   `json:"memCache"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

// unixParam parses an optional unix-seconds query parameter.
func unixParam(r *http.Request, name string) (time.Time, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > 1<<40 {
		return time.Time{}, errf(http.StatusBadRequest, "%s must be unix seconds", name)
	}
	return time.Unix(n, 0), nil
}

// metrics answers getMetrics({start, end}): the node's samples of the
// sandbox in that range (one every 5 s for the last 15 minutes, plus one
// taken now). A paused sandbox answers the samples from before its pause,
// a hibernated one none.
func (a *API) metrics(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	start, err := unixParam(r, "start")
	if err != nil {
		return err
	}
	end, err := unixParam(r, "end")
	if err != nil {
		return err
	}
	sb, err := a.lookup(r, p)
	if err != nil {
		return err
	}
	list, err := a.o.Service.Metrics(r.Context(), p.ProjectID, sb.ID, start, end)
	switch {
	case errors.Is(err, core.ErrUnavailable):
		list = nil // a runtime without metrics: none is a valid answer
	case errors.Is(err, core.ErrNotFound):
		list = nil // the instance went away between lookup and sample
	case err != nil:
		return err
	}
	out := make([]sandboxMetric, 0, len(list))
	for _, m := range list {
		out = append(out, sandboxMetric{TimestampUnix: m.Timestamp.Unix(), Timestamp: m.Timestamp.UTC().Format(time.RFC3339),
			CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct, MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache,
			DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
