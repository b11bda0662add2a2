package netns

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultClaimDir holds one file per live Manager on the host, per network
// namespace: what each one owns (pools, table, interface prefix). Two
// servers sharing a host must never share any of these: the second one's
// gateway could not bind its addresses, and each one's start-up sweep
// would remove the other's links and rules.
const DefaultClaimDir = "/run/space/netns-claims"

// claim is one Manager's record in the claim dir. The owner holds an
// exclusive flock on its file for as long as it lives; a file whose lock
// can be taken belongs to a process that is gone.
type claim struct {
	PID      int    `json:"pid"`
	Owner    string `json:"owner,omitempty"`
	Pool     string `json:"pool"`
	Pool6    string `json:"pool6,omitempty"` // only when IPv6 is on
	Table    string `json:"table"`
	IfPrefix string `json:"if_prefix"`
}

func (c claim) String() string {
	s := fmt.Sprintf("pid %d", c.PID)
	if c.Owner != "" {
		s += ", " + c.Owner
	}
	return s
}

// conflicts says what of a and b collide, or "" if nothing does.
func (a claim) conflicts(b claim) string {
	var why []string
	if overlap(a.Pool, b.Pool) {
		why = append(why, fmt.Sprintf("egress pool %s overlaps its pool %s", a.Pool, b.Pool))
	}
	if a.Pool6 != "" && b.Pool6 != "" && overlap(a.Pool6, b.Pool6) {
		why = append(why, fmt.Sprintf("IPv6 pool %s overlaps its IPv6 pool %s", a.Pool6, b.Pool6))
	}
	if a.Table == b.Table {
		why = append(why, fmt.Sprintf("nftables table %q is its table", a.Table))
	}
	// Interface names are prefix + hex: "spx" would match "spxa1".
	if strings.HasPrefix(a.IfPrefix, b.IfPrefix) || strings.HasPrefix(b.IfPrefix, a.IfPrefix) {
		why = append(why, fmt.Sprintf("interface prefix %q collides with its prefix %q", a.IfPrefix, b.IfPrefix))
	}
	return strings.Join(why, "; ")
}

func overlap(a, b string) bool {
	pa, err1 := netip.ParsePrefix(a)
	pb, err2 := netip.ParsePrefix(b)
	return err1 == nil && err2 == nil && pa.Overlaps(pb)
}

// claimHost checks that nothing else on this host (in this network
// namespace) uses cfg's pools, table or interface prefix, and records
// cfg's claim. The returned file holds the claim's lock: keep it open for
// the Manager's life.
func claimHost(cfg Config) (*os.File, error) {
	dir := cfg.ClaimDir
	if dir == "" {
		dir = DefaultClaimDir
	}
	// Claims are per network namespace: servers in different ones may
	// use the same ranges and names.
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		return nil, fmt.Errorf("netns: claim: %w", err)
	}
	dir = filepath.Join(dir, fmt.Sprintf("net-%d", st.Ino))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("netns: claim: %w", err)
	}
	// One start-up at a time per namespace, so two cannot both pass.
	lk, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("netns: claim: %w", err)
	}
	defer lk.Close()
	if err := unix.Flock(int(lk.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("netns: claim: %w", err)
	}
	me := claim{PID: os.Getpid(), Owner: cfg.Owner, Pool: cfg.Pool.String(), Table: cfg.Table, IfPrefix: cfg.IfPrefix}
	if cfg.IPv6 == IPv6On {
		me.Pool6 = cfg.Pool6.String()
	}
	mine := filepath.Join(dir, cfg.Table+".json")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("netns: claim: %w", err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		other, live, err := readClaim(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		if !live {
			continue
		}
		if why := me.conflicts(other); why != "" {
			return nil, fmt.Errorf("netns: another SPACE server on this host (%s) holds what this one asks for: %s: %w", other, why, ErrClaimed)
		}
	}
	if err := checkHostRanges(cfg); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(mine, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("netns: claim: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("netns: claim %s: %w", mine, err)
	}
	b, _ := json.Marshal(me)
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt(b, 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("netns: claim: %w", err)
	}
	return f, nil
}

// ErrClaimed means another server on the host holds a pool, table or
// interface prefix this one was configured with.
var ErrClaimed = errors.New("claimed by another server")

// readClaim reads a claim file and reports whether its owner still lives
// (holds the lock). A stale file is removed.
func readClaim(path string) (claim, bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return claim{}, false, nil
	}
	if err != nil {
		return claim{}, false, fmt.Errorf("netns: claim: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
		_ = os.Remove(path) // its owner is gone (we hold the start-up lock)
		return claim{}, false, nil
	}
	var c claim
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil {
		return claim{}, false, fmt.Errorf("netns: claim %s: %w", path, err)
	}
	return c, true, nil
}

// checkHostRanges refuses pools that overlap an address or route on an
// interface that is not one of this manager's veths (another program's
// network, or a server that is gone but left sandboxes running).
func checkHostRanges(cfg Config) error {
	mine := regexp.MustCompile(`^` + regexp.QuoteMeta(cfg.IfPrefix) + `[0-9a-f]{1,8}$`)
	pools := []netip.Prefix{cfg.Pool}
	if cfg.IPv6 == IPv6On {
		pools = append(pools, cfg.Pool6)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("netns: claim: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	hit := func(n *net.IPNet, link int, what string) error {
		if n == nil || mine.MatchString(names[link]) {
			return nil
		}
		p, ok := netipPrefix(n)
		if !ok {
			return nil
		}
		for _, pool := range pools {
			// The default route covers everything and is only overridden
			// by the sandboxes' own routes; any other overlap (an address's
			// subnet, a narrower or wider route) would be shadowed by them.
			if p.Bits() > 0 && pool.Overlaps(p) {
				return fmt.Errorf("netns: pool %s overlaps %s %s on interface %s of this host, which is not one of this server's (%s*): choose another pool: %w",
					pool, what, p, names[link], cfg.IfPrefix, ErrClaimed)
			}
		}
		return nil
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("netns: claim: %w", err)
	}
	for _, a := range addrs {
		if err := hit(a.IPNet, a.LinkIndex, "address"); err != nil {
			return err
		}
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("netns: claim: %w", err)
	}
	for _, r := range routes {
		if err := hit(r.Dst, r.LinkIndex, "route"); err != nil {
			return err
		}
	}
	return nil
}

func netipPrefix(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), true
}
