package operator

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"
)

// fakeLeases serves one Lease as the API server does for the calls the
// election makes: GET, POST (AlreadyExists) and PUT with the
// resourceVersion it read (Conflict when it changed meanwhile).
type fakeLeases struct {
	mu    sync.Mutex
	lease *Lease
	rv    int
}

func (f *fakeLeases) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	status := func(code int, reason string) {
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "reason": reason, "message": reason, "code": code})
	}
	switch r.Method {
	case http.MethodGet:
		if f.lease == nil {
			status(http.StatusNotFound, "NotFound")
			return
		}
		json.NewEncoder(w).Encode(f.lease)
	case http.MethodPost, http.MethodPut:
		var l Lease
		if err := json.NewDecoder(r.Body).Decode(&l); err != nil {
			status(http.StatusBadRequest, "BadRequest")
			return
		}
		if r.Method == http.MethodPost && f.lease != nil {
			status(http.StatusConflict, "AlreadyExists")
			return
		}
		if r.Method == http.MethodPut && l.Metadata.ResourceVersion != strconv.Itoa(f.rv) {
			status(http.StatusConflict, "Conflict")
			return
		}
		f.rv++
		l.Metadata.ResourceVersion = strconv.Itoa(f.rv)
		f.lease = &l
		json.NewEncoder(w).Encode(f.lease)
	}
}

func (f *fakeLeases) holder() (string, int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lease.Spec.HolderIdentity, f.lease.Spec.LeaseTransitions
}

func TestElector(t *testing.T) {
	fake := &fakeLeases{}
	srv := httptest.NewTLSServer(fake)
	defer srv.Close()
	kube := NewKubeToken(srv.URL, "t", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	lo := func(id string) LeaderOptions {
		return LeaderOptions{Namespace: "space", Name: "space-operator", Identity: id, Duration: time.Second, Logger: slog.New(slog.DiscardHandler)}
	}
	a, b := &elector{kube: kube, lo: lo("a")}, &elector{kube: kube, lo: lo("b")}
	ctx := context.Background()
	try := func(e *elector, want bool) {
		t.Helper()
		got, err := e.try(ctx)
		if err != nil || got != want {
			t.Fatalf("%s: try = %v, %v; want %v", e.lo.Identity, got, err, want)
		}
	}
	try(a, true)  // creates the lease
	try(b, false) // a holds it
	try(a, true)  // renews
	try(b, false) // a renewed: b's clock restarts
	time.Sleep(1100 * time.Millisecond)
	try(b, true) // a stopped renewing a lease duration ago
	if h, n := fake.holder(); h != "b" || n != 1 {
		t.Fatalf("holder %s after %d transitions", h, n)
	}
	try(a, false)

	// Two replicas taking an expired lease at once: one wins the update.
	c, d := &elector{kube: kube, lo: lo("c")}, &elector{kube: kube, lo: lo("d")}
	try(c, false)
	try(d, false)
	time.Sleep(1100 * time.Millisecond)
	var wg sync.WaitGroup
	won := make([]bool, 2)
	for i, e := range []*elector{c, d} {
		wg.Add(1)
		go func() { defer wg.Done(); won[i], _ = e.try(ctx) }()
	}
	wg.Wait()
	if won[0] == won[1] {
		t.Fatalf("won %v: exactly one replica must take the lease", won)
	}
	winner := c
	if won[1] {
		winner = d
	}
	// A clean stop releases the lease for the next replica at once.
	winner.release()
	if h, _ := fake.holder(); h != "" {
		t.Fatalf("holder %q after release", h)
	}
	try(a, true)
}
