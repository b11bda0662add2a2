package dataplane

import (
	"net/http"
	"strconv"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/node"
)

// Bounds of the port listing's wait.
const (
	defaultPortWait = 30 * time.Second
	maxPortWait     = 5 * time.Minute
	portPoll        = 100 * time.Millisecond
)

type portView struct {
	Port    int    `json:"port"`
	Address string `json:"address"`
	Family  string `json:"family"`
	// URL and PathURL reach the port through the data plane (host form
	// and path form).
	URL     string `json:"url,omitempty"`
	PathURL string `json:"path_url,omitempty"`
}

type portList struct {
	Ports []portView `json:"ports"`
}

// listPorts lists the TCP ports something listens on inside the sandbox.
// ?wait=PORT waits (up to timeout_ms, default 30 s, at most 5 min) until
// that port listens: 504 port_timeout if it does not in time.
func (s *Server) listPorts(w http.ResponseWriter, r *http.Request, sb *node.Sandbox) error {
	q := r.URL.Query()
	want := 0
	if v := q.Get("wait"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 65535 {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "wait must be a port, 1-65535")
		}
		want = n
	}
	wait := defaultPortWait
	if v := q.Get("timeout_ms"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || time.Duration(n)*time.Millisecond > maxPortWait {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "timeout_ms must be 0-%d", maxPortWait.Milliseconds())
		}
		wait = time.Duration(n) * time.Millisecond
	}
	deadline := time.Now().Add(wait)
	for {
		ports, err := sb.ListPorts(r.Context())
		if err != nil {
			return err
		}
		if want == 0 || listens(ports, want) {
			httpx.WriteJSON(w, http.StatusOK, s.portViews(sb.ID, ports))
			return nil
		}
		if !time.Now().Before(deadline) {
			return httpx.Errorf(http.StatusGatewayTimeout, "port_timeout", "nothing listened on port %d within %s", want, wait)
		}
		t := time.NewTimer(portPoll)
		select {
		case <-r.Context().Done():
			t.Stop()
			return r.Context().Err()
		case <-t.C:
		}
	}
}

func listens(ports []agent.ListeningPort, port int) bool {
	for _, p := range ports {
		if p.Port == port {
			return true
		}
	}
	return false
}

func (s *Server) portViews(id string, ports []agent.ListeningPort) portList {
	out := portList{Ports: make([]portView, 0, len(ports))}
	for _, p := range ports {
		v := portView{Port: p.Port, Address: p.Address, Family: p.Family}
		if s.o.PortURLs != nil {
			v.URL, v.PathURL = s.o.PortURLs.Host(id, p.Port), s.o.PortURLs.Path(id, p.Port)
		}
		out.Ports = append(out.Ports, v)
	}
	return out
}
