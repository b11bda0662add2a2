package template

import (
	"context"
	"errors"
	"testing"
)

// TestCheckRegistryHost: without AllowPrivateRegistries a registry whose
// host is (or resolves to) a loopback, private, link-local or CGNAT address
// is refused before anything is dialled.
func TestCheckRegistryHost(t *testing.T) {
	ctx := context.Background()
	for _, h := range []string{"127.0.0.1:5000", "[::1]:5000", "10.1.2.3", "192.168.0.1:443", "169.254.169.254",
		"100.64.1.1", "[fe80::1]:5000", "[fd00::1]", "0.0.0.0", "localhost:5000"} {
		if err := checkRegistryHost(ctx, h); !errors.Is(err, ErrPrivateRegistry) {
			t.Errorf("%s: %v, want ErrPrivateRegistry", h, err)
		}
	}
	for _, h := range []string{"8.8.8.8", "[2001:4860:4860::8888]:443", "1.1.1.1:5000"} {
		if err := checkRegistryHost(ctx, h); err != nil {
			t.Errorf("%s: %v", h, err)
		}
	}
}
