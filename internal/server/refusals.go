package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
)

// What a server with remote nodes does not do yet is refused here with
// 503 unavailable, before any work starts, as docs/scale-out.md says
// ("Refusals with remote nodes").

// errRemoteCredentials: a replica started without operator keys keeps no
// credential store.
var errRemoteCredentials = fmt.Errorf("egress credentials are not available on this server: start the replicas with --credential-keys (the operator keys of the credential store they share): %w", core.ErrUnavailable)

// remoteRefusals wraps the control API: template builds answer 503 at
// once while no node is ready to run them, instead of an operation that
// fails later.
func remoteRefusals(next http.Handler, r *cluster.Remote) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		p := req.URL.Path
		if req.Method == http.MethodGet || req.Method == http.MethodHead || p != "/v1/templates" && !strings.HasPrefix(p, "/v1/templates/") {
			next.ServeHTTP(w, req)
			return
		}
		if req.Method == http.MethodPost && (p == "/v1/templates" || p == "/v1/templates/build" || p == "/v1/templates/upload") {
			if _, err := r.BuildNode(req.Context()); err != nil {
				httpx.WriteError(w, httpx.Errorf(http.StatusServiceUnavailable, "unavailable",
					"template builds run on the nodes and no node is ready to run one: %v", err))
				return
			}
		}
		next.ServeHTTP(w, req)
	})
}

// noRemoteCredentials is the credential store of a replica with remote
// nodes: every call, and every policy that attaches a credential, is 503.
type noRemoteCredentials struct{}

var _ api.Credentials = noRemoteCredentials{}

func (noRemoteCredentials) CreateCredential(context.Context, string, core.CredentialRequest) (core.Credential, error) {
	return core.Credential{}, errRemoteCredentials
}
func (noRemoteCredentials) ListCredentials(context.Context, string) ([]core.Credential, error) {
	return nil, errRemoteCredentials
}
func (noRemoteCredentials) GetCredential(context.Context, string, string) (core.Credential, error) {
	return core.Credential{}, errRemoteCredentials
}
func (noRemoteCredentials) DeleteCredential(context.Context, string, string) error {
	return errRemoteCredentials
}
