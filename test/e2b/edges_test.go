package e2btest

import (
	"testing"
	"time"
)

// TestSDKEdges runs test/e2b/edges.test.mjs (signed URLs as returned,
// restore with envs, snapshot deletion order, a restored sandbox's
// template, a paused sandbox's public port) with each pinned SDK version.
func TestSDKEdges(t *testing.T) {
	e := need(t)
	runSuite(t, e, "edges.test.mjs", 3*time.Minute)
}
