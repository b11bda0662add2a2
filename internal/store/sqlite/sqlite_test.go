package sqlite

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) core.Store {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "space.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}
