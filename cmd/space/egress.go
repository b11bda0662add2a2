package main

import (
	"flag"
	"fmt"
	"net/netip"

	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/netns"
	"github.com/space-sandbox/space/internal/server"
)

// egressOpts are the `space server` flags of the egress gateway.
type egressOpts struct {
	on                      bool
	dns, pool, prefix, tbl  string
	upstreamCA, credKeyFile string
	metrics                 string
	maxConns, qps           int
	public, internal        string
	ipv6, pool6             string
}

func egressFlags(fs *flag.FlagSet) *egressOpts {
	o := &egressOpts{}
	fs.BoolVar(&o.on, "egress", false, "give every sandbox its own network behind the egress gateway (needs root; without it sandboxes have loopback only)")
	fs.StringVar(&o.dns, "egress-dns", "", "upstream DNS resolver the gateway asks, IPv4[:port] (default: first IPv4 nameserver in /etc/resolv.conf)")
	fs.StringVar(&o.pool, "egress-pool", "10.200.0.0/16", "IPv4 range cut into one /30 per sandbox (always treated as internal)")
	fs.StringVar(&o.prefix, "egress-if-prefix", "spx", "prefix of host-side veth names (at most 6 characters; unique per server on a host)")
	fs.StringVar(&o.tbl, "egress-table", "space", "nftables inet table of the sandbox rules (unique per server on a host)")
	fs.IntVar(&o.maxConns, "egress-max-conns", 256, "concurrent proxied connections per sandbox")
	fs.IntVar(&o.qps, "egress-dns-qps", 100, "DNS queries per second per sandbox")
	fs.StringVar(&o.upstreamCA, "egress-upstream-ca", "", "PEM file of extra roots trusted for upstreams whose TLS the gateway terminates (added to the system roots)")
	fs.StringVar(&o.credKeyFile, "egress-credential-key", "", "file holding the key that encrypts stored credentials (created if missing; default: a key kept in the store)")
	fs.StringVar(&o.metrics, "egress-metrics", "", "serve the gateway's Prometheus counters at http://ADDR/metrics (unauthenticated; keep it on a private address)")
	fs.StringVar(&o.public, "egress-public-ranges", "", "comma-separated CIDRs (IPv4, IPv6) that are internal by default but count as public here, e.g. a lab network; never loopback, link-local/metadata, the pool or the host's own networks")
	fs.StringVar(&o.internal, "egress-internal-ranges", "", "comma-separated CIDRs (IPv4, IPv6) added to the internal ranges no sandbox may reach (they win over --egress-public-ranges)")
	fs.StringVar(&o.ipv6, "egress-ipv6", netns.IPv6Auto, "IPv6 for sandboxes through the gateway: auto (when the host has an IPv6 default route), on or off (no IPv6 address or route in the sandbox)")
	fs.StringVar(&o.pool6, "egress-pool6", "fd73:7061:6365::/48", "IPv6 range cut into one /112 per sandbox (always internal; /96 or shorter)")
	return o
}

// parseRanges reads a comma-separated CIDR list.
func parseRanges(flagName, s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range splitList(s) {
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("--%s: %q is not a CIDR (want e.g. 198.18.0.0/15 or 2001:db8::/32)", flagName, f)
		}
		if p != p.Masked() {
			return nil, fmt.Errorf("--%s: %s has bits set past its prefix length; did you mean %s?", flagName, p, p.Masked())
		}
		out = append(out, p)
	}
	return out, nil
}

func (o *egressOpts) apply(cfg *server.Config) error {
	if !o.on {
		if o.public != "" || o.internal != "" {
			return fmt.Errorf("--egress-public-ranges and --egress-internal-ranges need --egress")
		}
		return nil
	}
	switch o.ipv6 {
	case netns.IPv6Auto, netns.IPv6On, netns.IPv6Off:
	default:
		return fmt.Errorf("--egress-ipv6 %q: want auto, on or off", o.ipv6)
	}
	pool6, err := netip.ParsePrefix(o.pool6)
	if err != nil || !pool6.Addr().Is6() || pool6.Addr().Is4In6() || pool6.Bits() > 96 || pool6 != pool6.Masked() {
		return fmt.Errorf("--egress-pool6 %q: want an IPv6 prefix of /96 or shorter, e.g. fd73:7061:6365::/48", o.pool6)
	}
	public, err := parseRanges("egress-public-ranges", o.public)
	if err != nil {
		return err
	}
	internal, err := parseRanges("egress-internal-ranges", o.internal)
	if err != nil {
		return err
	}
	pool, err := netip.ParsePrefix(o.pool)
	if err != nil || !pool.Addr().Is4() {
		return fmt.Errorf("--egress-pool %q: want an IPv4 prefix", o.pool)
	}
	gc := egress.Config{MaxConns: o.maxConns, DNSQPS: o.qps, Public: public, Deny: internal}
	if o.dns != "" {
		if gc.Upstream, err = netip.ParseAddrPort(o.dns); err != nil {
			a, aerr := netip.ParseAddr(o.dns)
			if aerr != nil {
				return fmt.Errorf("--egress-dns %q: want IPv4[:port]", o.dns)
			}
			gc.Upstream = netip.AddrPortFrom(a, 53)
		}
		if !gc.Upstream.Addr().Is4() {
			return fmt.Errorf("--egress-dns %q: want an IPv4 address", o.dns)
		}
	}
	cfg.Egress = &server.EgressConfig{
		Links:             netns.Config{Pool: pool, IfPrefix: o.prefix, Table: o.tbl, IPv6: o.ipv6, Pool6: pool6},
		Gateway:           gc,
		UpstreamCAFile:    o.upstreamCA,
		CredentialKeyFile: o.credKeyFile,
		MetricsListen:     o.metrics,
	}
	return nil
}
