package api

import (
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/portfwd"
)

// Bounds of a signed port URL's lifetime.
const (
	defaultPortURLTTL = time.Hour
	maxPortURLTTL     = 7 * 24 * time.Hour
)

type portURLRequest struct {
	// TTLSeconds: how long the URL opens the port (default 3600, at most
	// 7 days).
	TTLSeconds *int64 `json:"ttl_seconds,omitempty"`
}

type portURLResponse struct {
	// URL is the host form (wildcard DNS), PathURL the path form; both
	// carry the port token as ?space_token=.
	URL       string    `json:"url"`
	PathURL   string    `json:"path_url"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// portURLs is the URL builder for a sandbox whose data plane is dataURL.
func (s *Server) portURLs(dataURL string) portfwd.URLs {
	return portfwd.NewURLs(dataURL, s.o.SandboxDomain)
}

// portURL mints a signed URL for one port of a sandbox: a port token
// (opens that port only, no commands or files) valid for ttl_seconds, so a
// browser can open a preview of a private sandbox.
func (s *Server) portURL(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	ps := r.PathValue("port")
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != ps {
		return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "port must be 1-65535")
	}
	var req portURLRequest
	if r.ContentLength != 0 {
		if err := httpx.DecodeJSON(w, r, &req); err != nil {
			return err
		}
	}
	ttl := defaultPortURLTTL
	if req.TTLSeconds != nil {
		ttl = time.Duration(*req.TTLSeconds) * time.Second
		if *req.TTLSeconds < 1 || ttl > maxPortURLTTL {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "ttl_seconds must be 1-%d", int64(maxPortURLTTL/time.Second))
		}
	}
	sb, err := s.o.Service.Get(r.Context(), p.ProjectID, r.PathValue("id"))
	if err != nil {
		return err
	}
	if sb.State.Terminal() || sb.State == core.SandboxDeleting {
		return httpx.Errorf(http.StatusConflict, "conflict", "sandbox is %s", sb.State)
	}
	tok, exp := s.o.Sessions.IssuePort(sb.ProjectID, sb.ID, port, ttl)
	urls := s.portURLs(s.dataURLOf(sb))
	q := "?" + portfwd.QueryToken + "=" + url.QueryEscape(tok)
	httpx.WriteJSON(w, http.StatusOK, portURLResponse{URL: urls.Host(sb.ID, port) + q, PathURL: urls.Path(sb.ID, port) + q,
		Token: tok, ExpiresAt: exp})
	return nil
}
