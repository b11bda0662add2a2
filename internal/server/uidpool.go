package server

import (
	"cmp"
	"fmt"
	"os"

	"github.com/space-sandbox/space/internal/idmap"
	"github.com/space-sandbox/space/internal/uidpool"
)

// withUIDPool opens the host uid pool sandboxes get their own blocks from
// (Config.UIDPool), unless it is "off".
func withUIDPool(cfg Config) (Config, error) {
	if cfg.UIDPool == "off" {
		cfg.Logf("uid pool off: every sandbox runs under host ids %d.. (shared)", cfg.UIDBase)
		return cfg, nil
	}
	start, count := uint32(uidpool.DefaultStart), uint32(uidpool.DefaultCount)
	if cfg.UIDPool != "" {
		var err error
		if start, count, err = uidpool.ParseRange(cfg.UIDPool); err != nil {
			return cfg, fmt.Errorf("--uid-pool: %w", err)
		}
	}
	p, err := uidpool.Open(cmp.Or(cfg.UIDPoolDir, uidpool.DefaultDir), start, count)
	if err != nil {
		return cfg, fmt.Errorf("--uid-pool: %w", err)
	}
	if p.Overlaps(cfg.UIDBase, uidpool.BlockSize) {
		return cfg, fmt.Errorf("--uid-pool %s overlaps the template range %d..%d (--uid-base)", p, cfg.UIDBase, cfg.UIDBase+uidpool.BlockSize-1)
	}
	// Find out at start, not at every create, whether the data dir's
	// filesystem takes idmapped mounts (only root can, and only the
	// container drivers use the pool). Without them an explicit
	// --uid-pool fails; the default falls back to the shared range, so a
	// host that ran before keeps running, and says so.
	if os.Geteuid() == 0 && (cfg.Driver == "" || cfg.Driver == "auto" || cfg.Driver == "namespace" || cfg.Driver == "gvisor") {
		err := os.MkdirAll(cfg.DataDir, 0o711)
		if err == nil {
			err = idmap.Probe(cfg.DataDir)
		}
		if err != nil && cfg.UIDPool != "" {
			return cfg, fmt.Errorf("--uid-pool needs idmapped mounts under %s: %w (--uid-pool off keeps every sandbox on --uid-base's shared range)", cfg.DataDir, err)
		}
		if err != nil {
			cfg.Logf("uid pool off: idmapped mounts do not work under %s (%v): every sandbox runs under host ids %d.. (shared; docs/security.md)", cfg.DataDir, err, cfg.UIDBase)
			return cfg, nil
		}
	}
	cfg.uidPool = p
	cfg.Logf("uid pool %s: each sandbox gets its own host ids; templates (host ids %d..) are seen through idmapped mounts", p, cfg.UIDBase)
	return cfg, nil
}
