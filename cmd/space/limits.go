package main

import (
	"flag"
	"strconv"

	"github.com/space-sandbox/space/internal/node"
	"github.com/space-sandbox/space/internal/server"
)

// byteSize is a flag of a size in bytes: a number, or with a K/M/G/T
// suffix (powers of 1024).
type byteSize struct{ p *int64 }

func (b byteSize) String() string {
	if b.p == nil || *b.p == 0 {
		return "0"
	}
	return strconv.FormatInt(*b.p, 10)
}

func (b byteSize) Set(s string) error {
	n, err := parseByteSize(s)
	if err != nil {
		return err
	}
	*b.p = n
	return nil
}

// limitFlags registers the operator's disk and output bounds, the same on
// space server and space node.
func limitFlags(fs *flag.FlagSet, cfg *server.Config) {
	fs.Var(byteSize{&cfg.DefaultLimits.DiskBytes}, "default-disk-bytes",
		"disk limit of a sandbox whose request names none, e.g. 1G: its writable layer is an ext4 image of that size and writes past it fail with ENOSPC (0 = --max-disk-bytes, else no limit)")
	fs.Var(byteSize{&cfg.MaxLimits.DiskBytes}, "max-disk-bytes",
		"largest limits.disk_bytes a request may ask for, e.g. 16G (0 = no maximum); setting either disk flag turns disk limits on")
	cfg.MaxOutputBytes = node.DefaultMaxLogBytes
	fs.Var(byteSize{&cfg.MaxOutputBytes}, "max-output-bytes",
		"command output each sandbox keeps on the host, its commands together, e.g. 64M: past it the oldest output is dropped and readers get a \"dropped\" event (at least 4M)")
}

// uidFlags registers the host uid pool's settings, the same on space server
// and space node.
func uidFlags(fs *flag.FlagSet, cfg *server.Config) {
	fs.StringVar(&cfg.UIDPool, "uid-pool", "",
		"host uid/gid pool START:COUNT (multiples of 65536) from which each namespace and gvisor sandbox gets its own block of 65536 ids (default 16777216:1073741824; off: every sandbox shares --uid-base's range, as before)")
	fs.StringVar(&cfg.UIDPoolDir, "uid-pool-dir", "",
		"registry of the pool's blocks in use, shared by every SPACE node on the host (default /run/space/uid-pool)")
}

// portFlags registers port forwarding's settings, the same on space server
// and space node.
func portFlags(fs *flag.FlagSet, cfg *server.Config) {
	fs.StringVar(&cfg.SandboxDomain, "sandbox-domain", "",
		"domain of forwarded ports: <port>-<sandbox id>.<domain> (a wildcard DNS name pointing at the data listener; may end in :port) reaches that port (default: localhost:<data port> for an address or localhost data URL, else the data URL's host)")
	fs.IntVar(&cfg.MaxPortConns, "max-port-connections", 256,
		"forwarded requests (WebSockets included) open at once per sandbox; more get 429 too_many_connections")
}
