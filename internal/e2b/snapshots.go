package e2b

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
)

// E2B snapshots are SPACE snapshots (core.Service): createSnapshot waits
// for the capture, a snapshot id works as a template id in create (a
// fork of it), listSnapshots lists the project's ready snapshots that the
// server did not take on its own, deleteSnapshot deletes one. fork is a
// snapshot, a fork of it, and the snapshot's deletion once the forks run.

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func infoOf(sn core.Snapshot) snapshotInfo {
	out := snapshotInfo{SnapshotID: sn.ID, Names: []string{}}
	if sn.Name != "" {
		out.Names = append(out.Names, sn.Name)
	}
	return out
}

// snapshotNow captures sb and waits (bounded) for the snapshot to be ready.
func (a *API) snapshotNow(r *http.Request, p auth.Principal, sb core.Sandbox, name string) (core.Snapshot, error) {
	snap, op, err := a.o.Service.CreateNamedSnapshot(r.Context(), p.ProjectID, sb.ID, name, "")
	if err != nil {
		return snap, err
	}
	if op, err = a.waitOp(r, p, op); err != nil {
		return snap, err
	}
	if op.State != core.OpSucceeded {
		msg := "snapshot failed"
		if op.Error != nil {
			msg += ": " + op.Error.Message
		}
		return snap, errf(http.StatusInternalServerError, "%s", msg)
	}
	return a.o.Service.GetSnapshot(r.Context(), p.ProjectID, snap.ID)
}

// waitOp waits for an operation to end, at most CreateWait.
func (a *API) waitOp(r *http.Request, p auth.Principal, op core.Operation) (core.Operation, error) {
	deadline := time.Now().Add(a.o.CreateWait)
	for !op.State.Done() {
		left := time.Until(deadline)
		if left <= 0 {
			return op, errf(http.StatusGatewayTimeout, "operation %s did not finish within %v", op.ID, a.o.CreateWait)
		}
		var err error
		if op, err = a.o.Engine.Wait(r.Context(), p.ProjectID, op.ID, min(left, 30*time.Second)); err != nil {
			return op, err
		}
	}
	return op, nil
}

func (a *API) createSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req struct {
		Name string `json:"name"`
	}
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	if len(req.Name) > core.MaxSnapshotName {
		return errf(http.StatusBadRequest, "name longer than %d bytes", core.MaxSnapshotName)
	}
	sb, err := a.lookup(r, p)
	if err != nil {
		return err
	}
	snap, err := a.snapshotNow(r, p, sb, req.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, infoOf(snap))
	return nil
}

// listSnapshots pages through the project's ready snapshots, oldest first;
// nextToken is the last snapshot id of the previous page. A name filter
// matches the snapshot's name or id.
func (a *API) listSnapshots(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	limit := maxListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			return errf(http.StatusBadRequest, "limit must be 1..%d", maxListLimit)
		}
		limit = n
	}
	f := core.SnapshotFilter{ProjectID: p.ProjectID, States: []core.SnapshotState{core.SnapshotReady}, Limit: 1000}
	if v := q.Get("sandboxID"); v != "" {
		if !core.ValidSandboxID(v) {
			writeJSON(w, http.StatusOK, []snapshotInfo{})
			return nil
		}
		f.SandboxID = v
	}
	if v := q.Get("nextToken"); v != "" {
		if !core.ValidSnapshotID(v) {
			return errf(http.StatusBadRequest, "bad nextToken")
		}
		f.After = v
	}
	name := q.Get("name")
	if len(name) > core.MaxSnapshotName+64 {
		return errf(http.StatusBadRequest, "name filter too long")
	}
	out := []snapshotInfo{}
	next := ""
	// Filtered rows are skipped, so a page may need several store pages;
	// the scan is bounded (maxScan rows), and a page cut there says where
	// to go on.
	const maxScan = 10000
	scanned := 0
scan:
	for scanned < maxScan {
		list, err := a.o.Service.ListSnapshots(r.Context(), f)
		if err != nil {
			return err
		}
		for _, sn := range list {
			scanned++
			f.After = sn.ID
			if sn.Auto || name != "" && sn.Name != name && sn.ID != name {
				continue
			}
			if len(out) == limit {
				next = out[len(out)-1].SnapshotID
				break scan
			}
			out = append(out, infoOf(sn))
		}
		if len(list) < f.Limit {
			break
		}
	}
	if scanned >= maxScan && next == "" && len(out) > 0 {
		next = f.After
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteSnapshot is the SDK's deleteSnapshot (DELETE /templates/{id}): a
// snapshot id of the caller's project is deleted; anything else is not a
// snapshot SPACE knows (templates are not deleted through E2B's API).
func (a *API) deleteSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	id := r.PathValue("id")
	if !core.ValidSnapshotID(id) {
		return errf(http.StatusNotFound, "snapshot %.80q not found (SPACE's E2B layer deletes snapshots only)", id)
	}
	sn, err := a.o.Service.GetSnapshot(r.Context(), p.ProjectID, id)
	if err == nil && sn.Auto {
		err = fmt.Errorf("snapshot %s: %w", id, core.ErrNotFound) // the server's own (hibernation)
	}
	if err == nil {
		_, err = a.o.Service.DeleteSnapshot(r.Context(), p.ProjectID, id)
	}
	if errors.Is(err, core.ErrNotFound) {
		return errf(http.StatusNotFound, "snapshot %s not found", id)
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// createFromSnapshot starts create's sandbox as a fork of a snapshot of the
// caller's project (another project's is not found).
//
// What the request says wins; what it leaves out (network, public
// traffic, autoPause, autoResume) is the source sandbox's, as for a native
// fork (docs/security.md, "Security attributes by creation path").
func (a *API) createFromSnapshot(r *http.Request, p auth.Principal, snapID string, req *newSandboxReq, timeout int64,
	network *core.NetworkPolicy) (core.Sandbox, core.Operation, error) {
	freq := core.ForkRequest{Count: 1, Env: req.EnvVars, Metadata: req.Metadata, TimeoutSeconds: &timeout, Network: network}
	if req.Network != nil && req.Network.AllowPublicTraffic != nil {
		freq.PublicPorts = req.Network.AllowPublicTraffic
	}
	if req.AutoPause != nil {
		freq.OnTimeout = core.OnTimeoutDelete
		if *req.AutoPause {
			freq.OnTimeout = core.OnTimeoutHibernate
		}
	}
	if req.AutoResume != nil {
		freq.AutoResume = &req.AutoResume.Enabled
	}
	sbs, ops, err := a.o.Service.Fork(r.Context(), p.ProjectID, snapID, freq, "")
	if err != nil {
		return core.Sandbox{}, core.Operation{}, err
	}
	if len(sbs) != 1 {
		return core.Sandbox{}, core.Operation{}, errf(http.StatusInternalServerError, "fork made %d sandboxes", len(sbs))
	}
	return sbs[0], ops[0], nil
}

// forkResult is one element of the fork answer.
type forkResult struct {
	Sandbox *sandboxResp `json:"sandbox,omitempty"`
	Error   *apiError    `json:"error,omitempty"`
}

// apiError is E2B's Error.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// fork is E2B's fork: the sandbox is snapshotted in place (frozen for the
// capture, then it runs on with its id and timeout) and count sandboxes
// start from that snapshot, each succeeding or failing on its own. The
// snapshot is deleted once they run: it is the fork's means, not a
// snapshot the caller asked for.
func (a *API) fork(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
	}
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > core.MaxFork {
		return errf(http.StatusBadRequest, "count must be between 1 and %d", core.MaxFork)
	}
	timeout := int64(defaultTTL)
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if timeout <= 0 || timeout > core.MaxTimeoutSecond {
		return errf(http.StatusBadRequest, "timeout must be between 1 and %d seconds", core.MaxTimeoutSecond)
	}
	src, err := a.lookup(r, p)
	if err != nil {
		return err
	}
	if paused(src) {
		return errf(http.StatusConflict, "sandbox %s is paused; connect to it first", src.ID)
	}
	snap, err := a.snapshotNow(r, p, src, "")
	if err != nil {
		return err
	}
	sbs, ops, err := a.o.Service.Fork(r.Context(), p.ProjectID, snap.ID, core.ForkRequest{Count: count, Metadata: src.Metadata,
		TimeoutSeconds: &timeout, Network: src.Network}, "")
	if err != nil && len(sbs) == 0 {
		a.dropSnapshot(r, p, snap.ID)
		return err
	}
	out := make([]forkResult, count)
	done := true
	for i := range out {
		if i >= len(sbs) {
			out[i].Error = resultError(err)
			continue
		}
		op, werr := a.waitOp(r, p, ops[i])
		switch {
		case werr != nil:
			done = false
			out[i].Error = resultError(werr)
		case op.State != core.OpSucceeded:
			msg := "sandbox creation failed"
			if op.Error != nil {
				msg += ": " + op.Error.Message
			}
			out[i].Error = resultError(errf(http.StatusInternalServerError, "%s", msg))
		default:
			sb, gerr := a.o.Service.Get(r.Context(), p.ProjectID, sbs[i].ID)
			if gerr != nil {
				out[i].Error = resultError(gerr)
				continue
			}
			resp := a.sandboxResp(sb, "")
			out[i].Sandbox = &resp
		}
	}
	// A restore still running reads the snapshot: it stays then (and is
	// listed), rather than failing that fork.
	if done {
		a.dropSnapshot(r, p, snap.ID)
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (a *API) dropSnapshot(r *http.Request, p auth.Principal, id string) {
	if _, err := a.o.Service.DeleteSnapshot(r.Context(), p.ProjectID, id); err != nil {
		a.o.Logf("e2b fork: delete snapshot %s: %v", id, err)
	}
}

// resultError is a fork result's error in E2B's shape.
func resultError(err error) *apiError {
	e := &apiError{Code: http.StatusInternalServerError, Message: "fork did not start"}
	if err != nil {
		e.Code, _, e.Message = httpx.StatusOf(err)
	}
	return e
}
