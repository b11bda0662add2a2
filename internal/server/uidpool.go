package server

import (
	"cmp"
	"fmt"

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
	cfg.uidPool = p
	cfg.Logf("uid pool %s: each sandbox gets its own host ids; templates (host ids %d..) are seen through idmapped mounts", p, cfg.UIDBase)
	return cfg, nil
}
