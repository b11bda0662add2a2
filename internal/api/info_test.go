package api

import (
	"encoding/json"
	"testing"

	"github.com/space-sandbox/space/internal/version"
)

// TestInfoCarriesVersion checks GET /v1/info names the server's build: the
// release version and, when the binary carries one, the commit (space
// version --server compares them with the CLI's own).
func TestInfoCarriesVersion(t *testing.T) {
	e := newEdgeEnv(t)
	a := e.do(t, "GET", "/v1/info", "", nil)
	var in struct{ Version, Commit string }
	if a.status != 200 || json.Unmarshal(a.body, &in) != nil {
		t.Fatalf("GET /v1/info: %d %s", a.status, a.body)
	}
	if want := version.Get(); in.Version != want.Version || in.Version == "" || in.Commit != want.Commit {
		t.Fatalf("GET /v1/info = %s, want version %q commit %q", a.body, want.Version, want.Commit)
	}
	old := version.Commit
	version.Commit = "feedface0123"
	defer func() { version.Commit = old }()
	a = e.do(t, "GET", "/v1/info", "", nil)
	if json.Unmarshal(a.body, &in) != nil || in.Commit != "feedface0123" {
		t.Fatalf("GET /v1/info with a commit set by -ldflags: %s", a.body)
	}
}
