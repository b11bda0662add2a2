package api

import (
	"testing"

	"github.com/space-sandbox/space/internal/openapitest"
)

// scanAPI reads the control API's code and the shared HTTP plumbing.
func scanAPI(t *testing.T) *openapitest.Scan {
	return openapitest.ScanPackages(t, "internal/api", "internal/httpx")
}

// TestOpenAPIDocumentsEveryErrorCode: every error code the control API
// can answer (httpx.Errorf calls, the core-error mapping httpx.StatusOf,
// the edge limits) is in the Error schema's code enum, every status is
// documented, and the enum lists nothing that is never answered.
func TestOpenAPIDocumentsEveryErrorCode(t *testing.T) {
	openapitest.CheckCodes(t, OpenAPI(), scanAPI(t).All(),
		"malformed_request") // httpx.Listener's rewrite of net/http's own 400s
}

// TestOpenAPIDocumentsEveryRouteStatus: every status a route's handler
// answers itself (and the statuses every route can answer) is documented
// on that route.
func TestOpenAPIDocumentsEveryRouteStatus(t *testing.T) {
	openapitest.CheckRouteStatuses(t, OpenAPI(), scanAPI(t), "api", openapiPublic(), "api.Server.authenticate")
}
