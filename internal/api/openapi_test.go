package api

import (
	"testing"

	"github.com/space-sandbox/space/internal/openapitest"
)

func TestOpenAPIMatchesRoutes(t *testing.T) {
	openapitest.CheckRoutes(t, OpenAPI(), openapiRoutes(), openapiPublic())
}

func TestOpenAPIRefsResolve(t *testing.T) { openapitest.CheckRefs(t, OpenAPI()) }

func TestOpenAPIServed(t *testing.T) { openapitest.CheckServed(t, New(Options{}), OpenAPI()) }

// openapiRoutes is every route the document must describe.
func openapiRoutes() []string { return Routes() }

// openapiPublic are the routes served without an API key.
func openapiPublic() map[string]bool {
	out := map[string]bool{}
	for _, rt := range routes {
		if rt.public {
			out[rt.method+" "+rt.pattern] = true
		}
	}
	return out
}
