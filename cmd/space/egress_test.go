package main

import (
	"flag"
	"fmt"
	"io"
	"testing"

	"github.com/space-sandbox/space/internal/server"
)

func TestEgressFlags(t *testing.T) {
	parse := func(args ...string) (server.Config, error) {
		cfg := server.DefaultConfig()
		fs := flag.NewFlagSet("server", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o := egressFlags(fs)
		if err := fs.Parse(args); err != nil {
			return cfg, err
		}
		return cfg, o.apply(&cfg)
	}
	cfg, err := parse()
	if err != nil || cfg.Egress != nil {
		t.Fatalf("egress must be off by default: %v %+v", err, cfg.Egress)
	}
	cfg, err = parse("--egress", "--egress-dns", "192.0.2.53", "--egress-pool", "10.201.0.0/20", "--egress-metrics", "127.0.0.1:9102")
	if err != nil {
		t.Fatal(err)
	}
	eg := cfg.Egress
	if eg == nil || eg.Gateway.Upstream.String() != "192.0.2.53:53" || eg.Links.Pool.String() != "10.201.0.0/20" ||
		eg.Links.IfPrefix != "spx" || eg.Links.Table != "space" || eg.Gateway.MaxConns != 256 || eg.MetricsListen != "127.0.0.1:9102" {
		t.Fatalf("egress config: %+v", eg)
	}
	if eg.Links.IPv6 != "auto" || eg.Links.Pool6.String() != "fd73:7061:6365::/48" {
		t.Errorf("IPv6 defaults: %q %v", eg.Links.IPv6, eg.Links.Pool6)
	}
	if cfg, err = parse("--egress", "--egress-ipv6", "off", "--egress-pool6", "fd00:1::/64"); err != nil || cfg.Egress.Links.IPv6 != "off" || cfg.Egress.Links.Pool6.String() != "fd00:1::/64" {
		t.Errorf("--egress-ipv6 off --egress-pool6 fd00:1::/64: %v %+v", err, cfg.Egress)
	}
	if cfg, _ = parse("--egress", "--egress-dns", "192.0.2.53:5353"); cfg.Egress.Gateway.Upstream.Port() != 5353 {
		t.Errorf("dns port: %v", cfg.Egress.Gateway.Upstream)
	}
	cfg, err = parse("--egress", "--egress-public-ranges", "198.18.0.0/15, 2001:db8::/32", "--egress-internal-ranges", "198.18.99.0/24,fd12::/16")
	if err != nil {
		t.Fatal(err)
	}
	if g := cfg.Egress.Gateway; fmt.Sprint(g.Public) != "[198.18.0.0/15 2001:db8::/32]" || fmt.Sprint(g.Deny) != "[198.18.99.0/24 fd12::/16]" {
		t.Errorf("ranges: public %v internal %v", g.Public, g.Deny)
	}
	for _, bad := range [][]string{{"--egress", "--egress-dns", "dns.example"}, {"--egress", "--egress-dns", "[::1]:53"}, {"--egress", "--egress-pool", "fd00::/64"},
		{"--egress", "--egress-public-ranges", "198.18.0.1/15"}, {"--egress", "--egress-public-ranges", "lab.example"},
		{"--egress", "--egress-internal-ranges", "10.0.0.0/33"}, {"--egress-public-ranges", "198.18.0.0/15"}, {"--egress-internal-ranges", "10.9.0.0/16"},
		{"--egress", "--egress-ipv6", "yes"}, {"--egress", "--egress-pool6", "10.0.0.0/8"}, {"--egress", "--egress-pool6", "fd00::/112"}, {"--egress", "--egress-pool6", "fd00::1/64"}} {
		if _, err := parse(bad...); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
