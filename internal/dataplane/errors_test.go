package dataplane

import (
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/openapitest"
)

// scanDataPlane reads the data plane's code, the shared HTTP plumbing and
// the agent, whose 4xx answers the data plane passes through.
func scanDataPlane(t *testing.T) *openapitest.Scan {
	return openapitest.ScanPackages(t, "internal/dataplane", "internal/httpx", "internal/agent")
}

// TestOpenAPIDocumentsEveryErrorCode: every error code the data plane can
// answer is in the Error schema's code enum and every status is
// documented; the enum lists nothing that is never answered.
func TestOpenAPIDocumentsEveryErrorCode(t *testing.T) {
	var pairs []openapitest.Pair
	for _, p := range scanDataPlane(t).All() {
		switch {
		case p.Code == "" && p.Status < 400:
		case p.Status >= 500 && p.Code != "" && isAgent(p.Pos):
			// mapAgentError answers 502 agent_error for the agent's 5xx.
		case p.Code == "method_not_allowed":
			// The agent's answer to a wrong method; the data plane calls
			// each agent route with its own.
		case p.Code == "egress_disabled" || p.Code == "idempotency_key_reused":
			// httpx.StatusOf's mapping of core errors that only the
			// control plane's sandbox and operation calls return.
		default:
			pairs = append(pairs, p)
		}
	}
	openapitest.CheckCodes(t, OpenAPI(), pairs, "malformed_request")
}

func isAgent(pos string) bool { return strings.HasPrefix(pos, "internal/agent/") }

// TestOpenAPIDocumentsEveryRouteStatus: every status a route's handler
// answers itself, with authorization and the agent-error mapping every
// route goes through, is documented on that route.
func TestOpenAPIDocumentsEveryRouteStatus(t *testing.T) {
	openapitest.CheckRouteStatuses(t, OpenAPI(), scanDataPlane(t), "dataplane", nil,
		"dataplane.Server.authorize", "dataplane.mapAgentError")
}
