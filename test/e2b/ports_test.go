package e2btest

import (
	"testing"
	"time"
)

// TestSDKPorts runs test/e2b/ports.test.mjs (getHost, header routing,
// allowPublicTraffic) with each pinned SDK version.
func TestSDKPorts(t *testing.T) {
	e := need(t)
	runSuite(t, e, "ports.test.mjs", 3*time.Minute)
}
