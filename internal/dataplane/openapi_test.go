package dataplane

import (
	"testing"

	"github.com/space-sandbox/space/internal/openapitest"
)

func TestOpenAPIMatchesRoutes(t *testing.T) {
	openapitest.CheckRoutes(t, OpenAPI(), openapiRoutes(), openapiPublic())
}

func TestOpenAPIRefsResolve(t *testing.T) { openapitest.CheckRefs(t, OpenAPI()) }

func TestOpenAPIServed(t *testing.T) { openapitest.CheckServed(t, New(Options{}), OpenAPI()) }

// openapiPublic are served without a session token, outside the routes table.
func openapiPublic() map[string]bool {
	return map[string]bool{"GET /healthz": true, "GET /openapi.json": true}
}

// openapiRoutes is every route the document must describe.
func openapiRoutes() []string {
	out := Routes()
	for r := range openapiPublic() {
		out = append(out, r)
	}
	return out
}
