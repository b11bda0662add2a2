package e2btest

import (
	"testing"
	"time"
)

// TestSDKAttributes runs test/e2b/attrs.test.mjs (the E2B column of the
// table of security attributes by creation path) with each pinned SDK
// version.
func TestSDKAttributes(t *testing.T) {
	e := need(t)
	runSuite(t, e, "attrs.test.mjs", 4*time.Minute)
}
