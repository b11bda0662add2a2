package core

import "testing"

// TestBytesRange: limit errors give both bounds in one unit (they once
// said "between 16 MiB and 0" with no maximum, bytes against MiB).
func TestBytesRange(t *testing.T) {
	for _, c := range []struct {
		lo, hi int64
		want   string
	}{
		{16 << 20, 8 << 30, "must be between 16 MiB and 8192 MiB (16777216 to 8589934592 bytes)"},
		{16 << 20, 0, "must be at least 16 MiB (16777216 bytes)"},
	} {
		if got := bytesRange(c.lo, c.hi); got != c.want {
			t.Errorf("bytesRange(%d, %d) = %q, want %q", c.lo, c.hi, got, c.want)
		}
	}
}
