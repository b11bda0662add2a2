package api

import (
	"net/http"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
)

// metricsList is the answer of GET /v1/sandboxes/{id}/metrics.
type metricsList struct {
	Metrics []core.SandboxMetric `json:"metrics"`
}

// timeParam parses an optional RFC 3339 or unix-seconds query parameter.
func timeParam(r *http.Request, name string) (time.Time, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' || n > 1<<40 {
			return time.Time{}, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "%s must be RFC 3339 or unix seconds", name)
		}
		n = n*10 + int64(c-'0')
	}
	return time.Unix(n, 0), nil
}

// sandboxMetrics serves the node's resource samples of a sandbox in
// [start, end] (core.Service.Metrics).
func (s *Server) sandboxMetrics(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	start, err := timeParam(r, "start")
	if err != nil {
		return err
	}
	end, err := timeParam(r, "end")
	if err != nil {
		return err
	}
	list, err := s.o.Service.Metrics(r.Context(), p.ProjectID, r.PathValue("id"), start, end)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, metricsList{Metrics: list})
	return nil
}
