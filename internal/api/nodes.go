package api

import (
	"net/http"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/httpx"
)

// Nodes of a server with remote nodes: the registry, and drains for
// upgrades. Admin keys only: a node carries every project's sandboxes.

func (s *Server) needAdmin(r *http.Request, p auth.Principal, action, target string) error {
	if p.Admin {
		return nil
	}
	s.audit(r.Context(), p, action, "node", target, "denied")
	return httpx.Errorf(http.StatusForbidden, "forbidden", "nodes are managed with an admin key")
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	if err := s.needAdmin(r, p, "node.list", ""); err != nil {
		return err
	}
	nodes, err := s.o.Service.ListNodes(r.Context())
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"nodes": nodes})
	return nil
}

func (s *Server) drainNode(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	name := r.PathValue("name")
	if err := s.needAdmin(r, p, "node.drain", name); err != nil {
		return err
	}
	op, err := s.o.Service.DrainNode(r.Context(), p.ProjectID, name, r.Header.Get("Idempotency-Key"))
	if err != nil {
		return err
	}
	s.audit(r.Context(), p, "node.drain", "node", name, "succeeded")
	accepted(w, op, map[string]any{})
	return nil
}

func (s *Server) undrainNode(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	name := r.PathValue("name")
	if err := s.needAdmin(r, p, "node.undrain", name); err != nil {
		return err
	}
	n, err := s.o.Service.UndrainNode(r.Context(), name)
	if err != nil {
		return err
	}
	s.audit(r.Context(), p, "node.undrain", "node", name, "succeeded")
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"node": n})
	return nil
}
