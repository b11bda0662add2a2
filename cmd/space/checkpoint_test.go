package main

import (
	"testing"

	"github.com/space-sandbox/space/internal/server"
)

// --checkpoint-default: [PROJECT=]INTERVAL in whole seconds within the
// bounds a create request has; anything else is refused.
func TestCheckpointDefaultFlag(t *testing.T) {
	var cfg server.Config
	for _, v := range []string{"30s", "demo=5s", "other=0", "big=168h"} {
		if err := checkpointDefault(&cfg, v); err != nil {
			t.Fatalf("%q: %v", v, err)
		}
	}
	want := map[string]int64{"*": 30, "demo": 5, "other": 0, "big": 604800}
	for k, v := range want {
		if cfg.CheckpointDefaults[k] != v {
			t.Fatalf("defaults %v, want %v", cfg.CheckpointDefaults, want)
		}
	}
	for _, bad := range []string{"", "4s", "demo=1s", "=30s", "demo=1.5s", "demo=x", "169h", "-5s"} {
		if err := checkpointDefault(&cfg, bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
