package core

import (
	"errors"
	"testing"
)

// TestValidateDiskLimit: disk_bytes takes the default, else the maximum;
// is bounded by the maximum and 16 MiB; and is refused by a server with
// no disk limits at all.
func TestValidateDiskLimit(t *testing.T) {
	for _, c := range []struct {
		def, max, ask, want int64
		ok                  bool
	}{
		{0, 0, 0, 0, true},             // disks off
		{0, 0, 64 << 20, 0, false},     // disks off: refused
		{1 << 30, 0, 0, 1 << 30, true}, // the default
		{0, 8 << 30, 0, 8 << 30, true}, // no default: the maximum
		{1 << 30, 8 << 30, 2 << 30, 2 << 30, true},
		{1 << 30, 8 << 30, 9 << 30, 0, false}, // over the maximum
		{1 << 30, 8 << 30, 1 << 20, 0, false}, // under 16 MiB
		{1 << 30, 8 << 30, -1, 0, false},
	} {
		s := &Service{opts: ServiceOptions{DefaultLimits: Limits{DiskBytes: c.def}, MaxLimits: Limits{DiskBytes: c.max}}}
		req := CreateRequest{Template: "minimal", Limits: Limits{DiskBytes: c.ask}}
		err := s.validate(&req)
		if (err == nil) != c.ok || err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("default %d max %d ask %d: %v", c.def, c.max, c.ask, err)
			continue
		}
		if c.ok && req.Limits.DiskBytes != c.want {
			t.Errorf("default %d max %d ask %d: got %d, want %d", c.def, c.max, c.ask, req.Limits.DiskBytes, c.want)
		}
	}
}
