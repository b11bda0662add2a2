package server

import (
	"net/netip"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/egress"
)

// egressRanges is the gateway's effective address sets (nil without one).
func egressRanges(n *egress.Network) *core.EgressRanges {
	if n == nil {
		return nil
	}
	in, pub := n.GW.Ranges()
	return &core.EgressRanges{Internal: prefixStrings(in), Public: prefixStrings(pub)}
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// logRanges says at start which ranges the gateway treats as public and
// how many internal ones it applies.
func logRanges(logf func(string, ...any), n *egress.Network) {
	in, pub := n.GW.Ranges()
	if len(pub) > 0 {
		logf("egress: ranges declared public (--egress-public-ranges): %v; internal (never dialled): %v", pub, in)
	}
}
