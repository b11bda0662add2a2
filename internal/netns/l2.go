package netns

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The link layer of a sandbox's veth (R2, R16). The host assigns both ends'
// MAC addresses, derived from their IPv4 addresses (locally administered,
// unicast), so a restarted node knows them without asking the sandbox:
//
//	host end  02:68:<GW as 4 bytes>
//	sandbox   02:73:<sandbox address as 4 bytes>
//
// The host's neighbour entry for the sandbox's address is static
// (NUD_PERMANENT, the assigned MAC): nothing the sandbox sends (ARP
// replies, announcements, ND advertisements) changes it, and the host
// never asks. A netdev ingress chain on the host end, one per sandbox,
// runs before anything else sees a frame:
//
//	table netdev <Table> {
//	  chain l-<if> { filter ingress device <if> priority -500;
//	    ether saddr != <sandbox MAC>                     counter drop  # mac_drop
//	    arp request, sha <sandbox MAC>, spa <sandbox>,
//	      tpa <GW>                                        counter accept # arp
//	    ether type arp                                    counter drop  # arp_drop
//	    ether type != { ip, ip6 }                         counter drop  # l2_drop
//	  }
//	}
//
// So the only ARP the host ever answers is the sandbox asking for its own
// gateway, from its own addresses; a changed MAC loses all connectivity
// and is counted (mac_drop); VLAN tags and other ethertypes are dropped
// (l2_drop). IPv6 neighbour discovery is policed in the inet chain (see
// addSandbox).

const (
	macHost  = 0x68 // 'h'
	macGuest = 0x73 // 's'
	prioL2   = -500
)

func linkMAC(kind byte, a netip.Addr) net.HardwareAddr {
	b := a.As4()
	return net.HardwareAddr{0x02, kind, b[0], b[1], b[2], b[3]}
}

func l2Chain(ifname string) string { return "l-" + ifname }

func (m *Manager) l2TableRef() *nftables.Table {
	return &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyNetdev}
}

// ensureL2Table creates the netdev table if it is missing.
func (m *Manager) ensureL2Table(c *nftables.Conn) error {
	t := m.l2TableRef()
	if _, err := c.ListTableOfFamily(t.Name, t.Family); err == nil {
		return nil
	}
	c.AddTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: create netdev table %s: %w", t.Name, err)
	}
	return nil
}

// addL2 queues one sandbox's ingress chain on its host veth (which must
// exist).
func (m *Manager) addL2(c *nftables.Conn, l *Link) {
	t := m.l2TableRef()
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: l2Chain(l.HostIf), Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookIngress, Priority: nftables.ChainPriorityRef(prioL2), Policy: &accept, Device: l.HostIf})
	add := func(r *nftables.Rule) { r.Table, r.Chain = t, ch; c.AddRule(r) }
	ll := expr.PayloadBaseLLHeader
	nh := expr.PayloadBaseNetworkHeader
	etherType := func(op expr.CmpOp, typ uint16) []expr.Any {
		return []expr.Any{payload(ll, 12, 2), cmp(op, port16(typ))}
	}
	guest, gw := l.Guest.As4(), l.Host.As4()
	add(counted("mac_drop", expr.VerdictDrop, payload(ll, 6, 6), cmp(expr.CmpOpNeq, l.GuestMAC)))
	// An ARP request (Ethernet/IPv4) for the gateway, from the sandbox's
	// own MAC and address.
	arp := etherType(expr.CmpOpEq, unix.ETH_P_ARP)
	arp = append(arp,
		payload(nh, 0, 8), cmp(expr.CmpOpEq, []byte{0, 1, 8, 0, 6, 4, 0, 1}),
		payload(nh, 8, 6), cmp(expr.CmpOpEq, l.GuestMAC),
		payload(nh, 14, 4), cmp(expr.CmpOpEq, guest[:]),
		payload(nh, 24, 4), cmp(expr.CmpOpEq, gw[:]))
	add(counted("arp", expr.VerdictAccept, arp...))
	add(counted("arp_drop", expr.VerdictDrop, etherType(expr.CmpOpEq, unix.ETH_P_ARP)...))
	notIP := append(etherType(expr.CmpOpNeq, unix.ETH_P_IP), cmp(expr.CmpOpNeq, port16(unix.ETH_P_IPV6)))
	add(counted("l2_drop", expr.VerdictDrop, notIP...))
}

// l2Chains lists the ingress chains of this manager's netdev table.
func (m *Manager) l2Chains(c *nftables.Conn) (map[string]bool, error) {
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, ch := range chains {
		if ch.Table.Name == m.cfg.Table && strings.HasPrefix(ch.Name, "l-") {
			out[ch.Name] = true
		}
	}
	return out, nil
}

// delL2 queues the removal of one sandbox's ingress chain. Since Linux
// 6.16 a netdev chain outlives its device (and would hook a new device of
// the same name), so it is always removed explicitly.
func (m *Manager) delL2(c *nftables.Conn, ifname string) {
	ch := &nftables.Chain{Name: l2Chain(ifname), Table: m.l2TableRef()}
	c.FlushChain(ch)
	c.DelChain(ch)
}

// pinNeighbour makes the host's neighbour entry for the sandbox's address
// static, with the MAC the host assigned.
func pinNeighbour(host netlink.Link, l *Link) error {
	n := &netlink.Neigh{LinkIndex: host.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: l.Guest.AsSlice(), HardwareAddr: l.GuestMAC}
	if err := netlink.NeighSet(n); err != nil {
		return fmt.Errorf("netns: static neighbour %s: %w", l.Guest, err)
	}
	if l.Guest6.IsValid() {
		n6 := &netlink.Neigh{LinkIndex: host.Attrs().Index, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
			IP: l.Guest6.AsSlice(), HardwareAddr: l.GuestMAC}
		if err := netlink.NeighSet(n6); err != nil {
			return fmt.Errorf("netns: static neighbour %s: %w", l.Guest6, err)
		}
	}
	return nil
}

// Neighbour returns the host's neighbour entry for a sandbox's address: its
// MAC and whether it is static (NUD_PERMANENT).
func (m *Manager) Neighbour(id string) (net.HardwareAddr, bool, error) {
	l, ok := m.Get(id)
	if !ok {
		return nil, false, fmt.Errorf("netns: %s has no network", id)
	}
	host, err := netlink.LinkByName(l.HostIf)
	if err != nil {
		return nil, false, fmt.Errorf("netns: %w", err)
	}
	ns, err := netlink.NeighList(host.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return nil, false, fmt.Errorf("netns: %w", err)
	}
	for _, n := range ns {
		if n.IP.Equal(l.Guest.AsSlice()) {
			return n.HardwareAddr, n.State&netlink.NUD_PERMANENT != 0, nil
		}
	}
	return nil, false, fmt.Errorf("netns: no neighbour entry for %s on %s", l.Guest, l.HostIf)
}
