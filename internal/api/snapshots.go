package api

import (
	"net/http"
	"strconv"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
)

func accepted(w http.ResponseWriter, op core.Operation, body map[string]any) {
	w.Header().Set("Location", "/v1/operations/"+op.ID)
	body["operation"] = op
	httpx.WriteJSON(w, http.StatusAccepted, body)
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	op, err := s.o.Service.Pause(r.Context(), p.ProjectID, r.PathValue("id"), r.Header.Get("Idempotency-Key"))
	if err != nil {
		return err
	}
	accepted(w, op, map[string]any{})
	return nil
}

func (s *Server) hibernateSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	op, err := s.o.Service.Hibernate(r.Context(), p.ProjectID, r.PathValue("id"), r.Header.Get("Idempotency-Key"))
	if err != nil {
		return err
	}
	accepted(w, op, map[string]any{})
	return nil
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	op, err := s.o.Service.Resume(r.Context(), p.ProjectID, r.PathValue("id"), r.Header.Get("Idempotency-Key"))
	if err != nil {
		return err
	}
	accepted(w, op, map[string]any{})
	return nil
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	snap, op, err := s.o.Service.CreateSnapshot(r.Context(), p.ProjectID, r.PathValue("id"), r.Header.Get("Idempotency-Key"))
	if err != nil {
		return err
	}
	accepted(w, op, map[string]any{"snapshot": snap})
	return nil
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	f := core.SnapshotFilter{ProjectID: p.ProjectID, Limit: 100}
	for k := range q {
		if k != "sandbox_id" && k != "limit" && k != "page_token" {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "unknown query parameter %.64q", k)
		}
	}
	if id := q.Get("sandbox_id"); id != "" {
		if !core.ValidSandboxID(id) {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "bad sandbox_id")
		}
		f.SandboxID = id
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "limit must be 1..1000")
		}
		f.Limit = n
	}
	if pt := q.Get("page_token"); pt != "" {
		if !core.ValidSnapshotID(pt) {
			return httpx.Errorf(http.StatusBadRequest, "invalid_argument", "bad page_token")
		}
		f.After = pt
	}
	want := f.Limit
	f.Limit++ // one extra tells whether a next page exists
	list, err := s.o.Service.ListSnapshots(r.Context(), f)
	if err != nil {
		return err
	}
	next := ""
	if len(list) > want {
		list = list[:want]
		next = list[want-1].ID
	}
	if list == nil {
		list = []core.Snapshot{}
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"snapshots": list, "next_page_token": next})
	return nil
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	snap, err := s.o.Service.GetSnapshot(r.Context(), p.ProjectID, r.PathValue("id"))
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, snap)
	return nil
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	op, err := s.o.Service.DeleteSnapshot(r.Context(), p.ProjectID, r.PathValue("id"))
	if err != nil {
		return err
	}
	accepted(w, op, map[string]any{})
	return nil
}

// forkSnapshot answers one create operation and one session per new sandbox.
func (s *Server) forkSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req core.ForkRequest
	if err := httpx.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	sbs, ops, err := s.o.Service.Fork(r.Context(), p.ProjectID, r.PathValue("id"), req, r.Header.Get("Idempotency-Key"))
	if err != nil && len(sbs) == 0 {
		return err
	}
	out := make([]map[string]any, len(sbs))
	for i := range sbs {
		out[i] = map[string]any{"sandbox": sbs[i], "operation": ops[i], "session": s.issue(sbs[i])}
	}
	processes := "not restored: this snapshot is filesystem-only; each sandbox starts its processes afresh"
	if snap, gerr := s.o.Service.GetSnapshot(r.Context(), p.ProjectID, r.PathValue("id")); gerr == nil && snap.Kind == core.SnapshotKindProcess {
		processes = "restored: each sandbox continues its own copy of the snapshot's processes where they were"
	}
	body := map[string]any{"sandboxes": out, "processes": processes}
	if err != nil {
		_, code, msg := httpx.StatusOf(err)
		body["error"] = map[string]string{"code": code, "message": msg}
	}
	httpx.WriteJSON(w, http.StatusAccepted, body)
	return nil
}
