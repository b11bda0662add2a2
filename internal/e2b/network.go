package e2b

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/egress/policy"
)

// E2B's network options, mapped onto SPACE network policies (see
// docs/e2b-compat.md). E2B allows everything unless told otherwise;
// SPACE denies everything unless a policy allows it, so a request that
// asks for nothing keeps SPACE's default (blocked), and the rest maps as:
//
//	allowOut has 0.0.0.0/0 (or ::/0)           open (E2B: allowed entries win over denied ones)
//	denyOut has 0.0.0.0/0, or allow_internet_access false
//	                                            allowlist of the allowOut names; none: blocked
//	other denyOut ranges                        open, if SPACE treats every address in them as
//	                                            internal anyway (open never reaches those); else 400
//	allow_internet_access true                  open (only on routes where the SDK sends it only
//	                                            when the caller set it: POST /v2/sandboxes, PUT .../network)
//	allowOut names alone                        allowlist of them (E2B would still allow the rest)
//
// allowOut addresses and CIDRs other than all traffic, denyOut names,
// header-transform rules and egressProxy cannot be expressed: 400, saying
// so. A policy other than blocked on a server without --egress is the
// core's 400 egress_disabled.

// e2bNetwork is the egress part of E2B's SandboxNetworkConfig and
// SandboxNetworkUpdateConfig, and allowPublicTraffic: whether forwarded
// ports need the traffic token (create only). maskRequestHost and
// httpsPorts are ignored: SPACE forwards the client's Host as it is.
type e2bNetwork struct {
	AllowPublicTraffic *bool                        `json:"allowPublicTraffic"`
	AllowOut           []string                     `json:"allowOut"`
	DenyOut            []string                     `json:"denyOut"`
	Rules              map[string][]json.RawMessage `json:"rules"`
	EgressProxy        json.RawMessage              `json:"egressProxy"`
}

// maxNetworkEntries bounds allowOut and denyOut.
const maxNetworkEntries = 256

func allTraffic(s string) bool { return s == "0.0.0.0/0" || s == "::/0" }

// addressEntry parses s as an address or CIDR (a bare address is one
// host), reporting false for anything else (a name).
func addressEntry(s string) (netip.Prefix, bool) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), true
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a, a.BitLen()), true
	}
	return netip.Prefix{}, false
}

// mapNetwork turns E2B's network options into a SPACE policy; nil means
// nothing was asked for (SPACE's default, blocked). allowSet says whether
// allow_internet_access: true can be read as the caller's own request
// (the v1 create route gets it from every SDK by default). internal
// reports whether every address of a range is internal to the gateway
// (never dialled in any mode).
func mapNetwork(allowInternet *bool, allowSet bool, n *e2bNetwork, internal func(netip.Prefix) bool) (*core.NetworkPolicy, error) {
	if n == nil {
		n = &e2bNetwork{}
	}
	if len(n.AllowOut) > maxNetworkEntries || len(n.DenyOut) > maxNetworkEntries {
		return nil, errf(http.StatusBadRequest, "network: at most %d allowOut and %d denyOut entries", maxNetworkEntries, maxNetworkEntries)
	}
	if len(n.Rules) > 0 {
		return nil, errf(http.StatusBadRequest, "network.rules (header transforms) are not supported by SPACE; attach a credential through the SPACE API (POST /v1/credentials, docs/egress.md) instead")
	}
	if s := strings.TrimSpace(string(n.EgressProxy)); s != "" && s != "null" {
		return nil, errf(http.StatusBadRequest, "network.egressProxy is not supported by SPACE: its egress gateway makes every upstream connection itself")
	}
	var names []string
	openAll := false
	for _, s := range n.AllowOut {
		if allTraffic(s) {
			openAll = true
			continue
		}
		if _, ok := addressEntry(s); ok || policy.IsIPLiteral(s) {
			return nil, errf(http.StatusBadRequest, "network.allowOut %.64q: SPACE allows destinations by host name, not by address (the gateway resolves names itself); name the host, or allow all traffic with 0.0.0.0/0", s)
		}
		names = append(names, s)
	}
	denyAll := allowInternet != nil && !*allowInternet
	var partial []netip.Prefix
	for _, s := range n.DenyOut {
		if allTraffic(s) {
			denyAll = true
			continue
		}
		p, ok := addressEntry(s)
		if !ok {
			return nil, errf(http.StatusBadRequest, "network.denyOut %.64q: not an address or CIDR (E2B takes no names in denyOut)", s)
		}
		partial = append(partial, p)
	}
	switch {
	case openAll:
		return &core.NetworkPolicy{Mode: string(policy.Open)}, nil
	case denyAll && len(names) > 0:
		return &core.NetworkPolicy{Mode: string(policy.Allowlist), Allow: core.AllowRules(names)}, nil
	case denyAll:
		return &core.NetworkPolicy{Mode: string(policy.Blocked)}, nil
	case len(partial) > 0:
		for _, p := range partial {
			if internal == nil || !internal(p) {
				return nil, errf(http.StatusBadRequest, "network.denyOut %s: SPACE cannot deny a public range while allowing the rest; its open mode denies only internal ranges (see GET /v1/info egress_ranges). Deny all traffic (0.0.0.0/0) and list the allowed host names in allowOut instead", p)
			}
		}
		return &core.NetworkPolicy{Mode: string(policy.Open)}, nil
	case allowSet && allowInternet != nil && *allowInternet:
		return &core.NetworkPolicy{Mode: string(policy.Open)}, nil
	case len(names) > 0:
		return &core.NetworkPolicy{Mode: string(policy.Allowlist), Allow: core.AllowRules(names)}, nil
	}
	return nil, nil
}

// e2bNetworkInfo is what SandboxDetail says of a sandbox's policy.
type e2bNetworkInfo struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
}

// networkInfo describes p (nil: SPACE's default, blocked) in E2B's terms:
// allowInternetAccess (nil for an allowlist) and allowOut/denyOut.
func networkInfo(p *core.NetworkPolicy) (*bool, *e2bNetworkInfo) {
	yes, no := true, false
	if p == nil || p.Mode == string(policy.Blocked) || p.Mode == "" {
		return &no, &e2bNetworkInfo{DenyOut: []string{"0.0.0.0/0"}}
	}
	if p.Mode == string(policy.Open) {
		return &yes, &e2bNetworkInfo{}
	}
	info := &e2bNetworkInfo{DenyOut: []string{"0.0.0.0/0"}}
	for _, r := range p.Allow {
		// The host of a rule ("host[:ports][ METHODS][ PATHS]").
		host, _, _ := strings.Cut(string(r), " ")
		host, _, _ = strings.Cut(host, ":")
		info.AllowOut = append(info.AllowOut, host)
	}
	return nil, info
}

// updateNetwork is PUT /sandboxes/{id}/network (the SDK's updateNetwork):
// the sandbox's policy is replaced by the mapped one (an empty update sets
// SPACE's default, blocked); credentials attached through the SPACE API
// stay attached.
func (a *API) updateNetwork(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req struct {
		e2bNetwork
		AllowInternetAccess *bool `json:"allow_internet_access"`
	}
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	sb, err := a.lookup(r, p)
	if err != nil {
		return err
	}
	pol, err := mapNetwork(req.AllowInternetAccess, true, &req.e2bNetwork, a.o.InternalRange)
	if err != nil {
		return err
	}
	if pol == nil {
		pol = &core.NetworkPolicy{Mode: string(policy.Blocked)}
	}
	if sb.Network != nil {
		pol.Credentials = sb.Network.Credentials
	}
	if _, err := a.o.Service.SetNetwork(r.Context(), p.ProjectID, sb.ID, *pol); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
