package netns

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// The host-side ruleset, one table per Manager:
//
//	table inet <Table> {
//	  map sbx  { type ifname : verdict }   # host veth -> jump s-<ifname>
//	  set ifs  { type ifname }             # every sandbox's host veth
//	  chain pre  { filter prerouting -450: iifname vmap @sbx }  # before defrag: sees raw fragments
//	  chain nat  { nat prerouting -100: iifname @ifs: port 53 -> DNS port, other TCP -> proxy port }
//	  chain in   { filter input 0: iifname vmap @sbxin }
//	  chain fwd  { filter forward 0: iifname @ifs drop; oifname @ifs drop }
//	  chain s-<if>  { v6, spoof, fragment, IP option, protocol checks, counted }
//	  chain i-<if>  { after NAT: only GW:DNS and GW:proxy, counted }
//	}
//
// Every drop has a counter whose rule carries a comment naming the reason;
// Counters reads them back.

const (
	chainPre = "pre"
	chainNAT = "nat"
	chainIn  = "in"
	chainFwd = "fwd"
	mapPre   = "sbx"
	mapIn    = "sbxin"
	setIfs   = "ifs"
	// prioPre runs before conntrack's defragmentation (-400) so that
	// fragments are seen, and dropped, as they arrive.
	prioPre = -450
)

func ifnameKey(name string) []byte {
	b := make([]byte, 16)
	copy(b, name)
	return b
}

func comment(s string) []byte { return userdata.AppendString(nil, userdata.TypeComment, s) }

func port16(p uint16) []byte { return binary.BigEndian.AppendUint16(nil, p) }

func meta(key expr.MetaKey) *expr.Meta { return &expr.Meta{Key: key, Register: 1} }

func cmp(op expr.CmpOp, data []byte) *expr.Cmp {
	return &expr.Cmp{Op: op, Register: 1, Data: data}
}

func payload(base expr.PayloadBase, off, n uint32) *expr.Payload {
	return &expr.Payload{DestRegister: 1, Base: base, Offset: off, Len: n}
}

func counted(reason string, v expr.VerdictKind, match ...expr.Any) *nftables.Rule {
	return &nftables.Rule{
		Exprs:    append(match, &expr.Counter{}, &expr.Verdict{Kind: v}),
		UserData: comment(reason),
	}
}

func (m *Manager) tableRef() *nftables.Table {
	return &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyINet}
}

// ensureTable creates the table, maps and base chains if they are missing.
// It never flushes: sandboxes of a previous process keep their rules.
func (m *Manager) ensureTable() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	defer c.CloseLasting()
	if err := m.ensureL2Table(c); err != nil {
		return err
	}
	t := m.tableRef()
	if _, err := c.ListTableOfFamily(t.Name, t.Family); err == nil {
		return m.ensureNAT6(c)
	}
	c.AddTable(t)
	vmap := &nftables.Set{Table: t, Name: mapPre, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	vmapIn := &nftables.Set{Table: t, Name: mapIn, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	ifs := &nftables.Set{Table: t, Name: setIfs, KeyType: nftables.TypeIFName}
	for _, s := range []*nftables.Set{vmap, vmapIn, ifs} {
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("nftables: add set %s: %w", s.Name, err)
		}
	}
	accept := nftables.ChainPolicyAccept
	pre := c.AddChain(&nftables.Chain{Name: chainPre, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(prioPre), Policy: &accept})
	nat := c.AddChain(&nftables.Chain{Name: chainNAT, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	in := c.AddChain(&nftables.Chain{Name: chainIn, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	fwd := c.AddChain(&nftables.Chain{Name: chainFwd, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})

	vlookup := func(s *nftables.Set, key expr.MetaKey) []expr.Any {
		return []expr.Any{meta(key), &expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: s.Name, SetID: s.ID}}
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: vlookup(vmap, expr.MetaKeyIIFNAME)})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: vlookup(vmapIn, expr.MetaKeyIIFNAME)})

	inIfs := func(key expr.MetaKey) []expr.Any {
		return []expr.Any{meta(key), &expr.Lookup{SourceRegister: 1, SetName: ifs.Name, SetID: ifs.ID}}
	}
	for _, key := range []expr.MetaKey{expr.MetaKeyIIFNAME, expr.MetaKeyOIFNAME} {
		r := counted("forward", expr.VerdictDrop, inIfs(key)...)
		r.Table, r.Chain = t, fwd
		c.AddRule(r)
	}
	// DNS on any address goes to the gateway resolver (R5); every other
	// TCP connection goes to the transparent proxy (R4). The pre chain has
	// already dropped what is not IPv4 (or the sandbox's IPv6) TCP or
	// UDP/53.
	m.addRedirects(c, nat, ifs, unix.NFPROTO_IPV4, "")
	m.addRedirects(c, nat, ifs, unix.NFPROTO_IPV6, redirect6)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: create table %s: %w", t.Name, err)
	}
	return nil
}

// redirect6 marks the nat chain's IPv6 redirects (a table made before
// IPv6 support gets them added).
const redirect6 = "redirect6"

// addRedirects queues the nat chain's redirects for one family: DNS to the
// resolver's port, other TCP to the transparent proxy's (redirect: to the
// address of the sandbox veth the packet came in on, its GW).
func (m *Manager) addRedirects(c *nftables.Conn, nat *nftables.Chain, ifs *nftables.Set, family byte, mark string) {
	t := m.tableRef()
	redirect := func(proto byte, dport *uint16, to uint16) {
		e := []expr.Any{meta(expr.MetaKeyIIFNAME), &expr.Lookup{SourceRegister: 1, SetName: ifs.Name, SetID: ifs.ID}}
		e = append(e, meta(expr.MetaKeyNFPROTO), cmp(expr.CmpOpEq, []byte{family}),
			meta(expr.MetaKeyL4PROTO), cmp(expr.CmpOpEq, []byte{proto}))
		if dport != nil {
			e = append(e, payload(expr.PayloadBaseTransportHeader, 2, 2), cmp(expr.CmpOpEq, port16(*dport)))
		}
		e = append(e, &expr.Immediate{Register: 1, Data: port16(to)},
			&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED})
		r := &nftables.Rule{Table: t, Chain: nat, Exprs: e}
		if mark != "" {
			r.UserData = comment(mark)
		}
		c.AddRule(r)
	}
	dns := uint16(53)
	redirect(unix.IPPROTO_UDP, &dns, m.cfg.DNSPort)
	redirect(unix.IPPROTO_TCP, &dns, m.cfg.DNSPort)
	redirect(unix.IPPROTO_TCP, nil, m.cfg.ProxyPort)
}

// ensureNAT6 adds the IPv6 redirects to a table made without them.
func (m *Manager) ensureNAT6(c *nftables.Conn) error {
	t := m.tableRef()
	nat := &nftables.Chain{Name: chainNAT, Table: t}
	rules, err := c.GetRules(t, nat)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	for _, r := range rules {
		if v, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok && v == redirect6 {
			return nil
		}
	}
	m.addRedirects(c, nat, &nftables.Set{Table: t, Name: setIfs, KeyType: nftables.TypeIFName}, unix.NFPROTO_IPV6, redirect6)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: IPv6 redirects: %w", err)
	}
	return nil
}

func preChain(ifname string) string { return "s-" + ifname }
func inChain(ifname string) string  { return "i-" + ifname }

// addSandbox installs one sandbox's chains and map elements in one batch.
func (m *Manager) addSandbox(c *nftables.Conn, l *Link) error {
	t := m.tableRef()
	pre := c.AddChain(&nftables.Chain{Name: preChain(l.HostIf), Table: t})
	in := c.AddChain(&nftables.Chain{Name: inChain(l.HostIf), Table: t})
	add := func(ch *nftables.Chain, r *nftables.Rule) { r.Table, r.Chain = t, ch; c.AddRule(r) }
	nh := expr.PayloadBaseNetworkHeader
	th := expr.PayloadBaseTransportHeader
	guest := l.Guest.As4()
	gw := l.Host.As4()

	// R2/R3: anything but IPv4 (and, with IPv6 on, IPv6) from the
	// assigned address, unfragmented and without IP options or extension
	// headers, is dropped and counted.
	if l.Guest6.IsValid() {
		m.addPre6(c, pre, l)
	} else {
		add(pre, counted("v6_drop", expr.VerdictDrop, meta(expr.MetaKeyNFPROTO), cmp(expr.CmpOpEq, []byte{unix.NFPROTO_IPV6})))
	}
	add(pre, counted("nonip_drop", expr.VerdictDrop, meta(expr.MetaKeyNFPROTO), cmp(expr.CmpOpNeq, []byte{unix.NFPROTO_IPV4})))
	add(pre, counted("spoof_drop", expr.VerdictDrop, payload(nh, 12, 4), cmp(expr.CmpOpNeq, guest[:])))
	add(pre, counted("frag_drop", expr.VerdictDrop, payload(nh, 6, 2),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 2, Mask: []byte{0x3f, 0xff}, Xor: []byte{0, 0}},
		cmp(expr.CmpOpNeq, []byte{0, 0})))
	add(pre, counted("ipopt_drop", expr.VerdictDrop, payload(nh, 0, 1),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x0f}, Xor: []byte{0}},
		cmp(expr.CmpOpNeq, []byte{5})))
	add(pre, counted("tcp", expr.VerdictAccept, meta(expr.MetaKeyL4PROTO), cmp(expr.CmpOpEq, []byte{unix.IPPROTO_TCP})))
	add(pre, counted("dns", expr.VerdictAccept, meta(expr.MetaKeyL4PROTO), cmp(expr.CmpOpEq, []byte{unix.IPPROTO_UDP}),
		payload(th, 2, 2), cmp(expr.CmpOpEq, port16(53))))
	add(pre, counted("udp_drop", expr.VerdictDrop, meta(expr.MetaKeyL4PROTO), cmp(expr.CmpOpEq, []byte{unix.IPPROTO_UDP})))
	add(pre, counted("icmp_drop", expr.VerdictDrop, meta(expr.MetaKeyL4PROTO), cmp(expr.CmpOpEq, []byte{unix.IPPROTO_ICMP})))
	add(pre, counted("proto_drop", expr.VerdictDrop))

	// After NAT only the gateway's own listeners on this sandbox's GW
	// address remain; whatever conntrack did not redirect ends here.
	if l.Host6.IsValid() {
		gw6 := l.Host6.As16()
		// Neighbour solicitations (to GW6's solicited-node group): the
		// pre chain admitted only those for GW6.
		add(in, counted("nd_in", expr.VerdictAccept, meta(expr.MetaKeyNFPROTO), cmp(expr.CmpOpEq, []byte{unix.NFPROTO_IPV6}),
			meta(expr.MetaKeyL4PROTO), cmp(expr.CmpOpEq, []byte{unix.IPPROTO_ICMPV6}), payload(th, 0, 1), cmp(expr.CmpOpEq, []byte{135})))
		add(in, counted("input_drop", expr.VerdictDrop, meta(expr.MetaKeyNFPROTO), cmp(expr.CmpOpEq, []byte{unix.NFPROTO_IPV6}),
			payload(nh, 24, 16), cmp(expr.CmpOpNeq, gw6[:])))
	}
	add(in, counted("input_drop", expr.VerdictDrop, meta(expr.MetaKeyNFPROTO), cmp(expr.CmpOpEq, []byte{unix.NFPROTO_IPV4}),
		payload(nh, 16, 4), cmp(expr.CmpOpNeq, gw[:])))
	add(in, counted("dns_in", expr.VerdictAccept, meta(expr.MetaKeyL4PROTO), cmp(expr.CmpOpEq, []byte{unix.IPPROTO_UDP}),
		payload(th, 2, 2), cmp(expr.CmpOpEq, port16(m.cfg.DNSPort))))
	add(in, counted("dns_tcp_in", expr.VerdictAccept, meta(expr.MetaKeyL4PROTO), cmp(expr.CmpOpEq, []byte{unix.IPPROTO_TCP}),
		payload(th, 2, 2), cmp(expr.CmpOpEq, port16(m.cfg.DNSPort))))
	add(in, counted("proxy_in", expr.VerdictAccept, meta(expr.MetaKeyL4PROTO), cmp(expr.CmpOpEq, []byte{unix.IPPROTO_TCP}),
		payload(th, 2, 2), cmp(expr.CmpOpEq, port16(m.cfg.ProxyPort))))
	add(in, counted("input_drop", expr.VerdictDrop))
	m.addL2(c, l)

	key := ifnameKey(l.HostIf)
	if err := c.SetAddElements(&nftables.Set{Table: t, Name: setIfs, KeyType: nftables.TypeIFName},
		[]nftables.SetElement{{Key: key}}); err != nil {
		return err
	}
	if err := c.SetAddElements(&nftables.Set{Table: t, Name: mapPre, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict},
		[]nftables.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: pre.Name}}}); err != nil {
		return err
	}
	return c.SetAddElements(&nftables.Set{Table: t, Name: mapIn, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict},
		[]nftables.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: in.Name}}})
}

// delSandbox queues the removal of one sandbox's elements and chains.
// Missing pieces make the batch fail, so callers check what exists first.
func (m *Manager) delSandbox(c *nftables.Conn, ifname string, chains map[string]bool) {
	t := m.tableRef()
	key := ifnameKey(ifname)
	_ = c.SetDeleteElements(&nftables.Set{Table: t, Name: mapPre, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict},
		[]nftables.SetElement{{Key: key}})
	_ = c.SetDeleteElements(&nftables.Set{Table: t, Name: mapIn, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict},
		[]nftables.SetElement{{Key: key}})
	_ = c.SetDeleteElements(&nftables.Set{Table: t, Name: setIfs, KeyType: nftables.TypeIFName}, []nftables.SetElement{{Key: key}})
	for _, name := range []string{preChain(ifname), inChain(ifname)} {
		if chains == nil || chains[name] {
			ch := &nftables.Chain{Name: name, Table: t}
			c.FlushChain(ch)
			c.DelChain(ch)
		}
	}
	if chains == nil || chains[l2Chain(ifname)] {
		m.delL2(c, ifname)
	}
}

// sandboxIfnames lists the ifnames that have chains in the table.
func (m *Manager) sandboxChains(c *nftables.Conn) (map[string]bool, error) {
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, ch := range chains {
		if ch.Table.Name == m.cfg.Table && (strings.HasPrefix(ch.Name, "s-") || strings.HasPrefix(ch.Name, "i-")) {
			out[ch.Name] = true
		}
	}
	l2, err := m.l2Chains(c)
	if err != nil {
		return nil, err
	}
	for name := range l2 {
		out[name] = true
	}
	return out, nil
}

// counters reads one sandbox's counters by reason.
func (m *Manager) counters(c *nftables.Conn, ifname string) (map[string]uint64, error) {
	t := m.tableRef()
	out := map[string]uint64{}
	for _, name := range []string{preChain(ifname), inChain(ifname)} {
		rules, err := c.GetRules(t, &nftables.Chain{Name: name, Table: t})
		if err != nil {
			return nil, err
		}
		addCounts(out, rules)
	}
	// The link-layer chain (absent for a sandbox set up by an older node).
	if rules, err := c.GetRules(m.l2TableRef(), &nftables.Chain{Name: l2Chain(ifname), Table: m.l2TableRef()}); err == nil {
		addCounts(out, rules)
	}
	return out, nil
}

// addCounts adds the packet counts of rules to out, by the reason each
// rule's comment names.
func addCounts(out map[string]uint64, rules []*nftables.Rule) {
	for _, r := range rules {
		reason, ok := userdata.GetString(r.UserData, userdata.TypeComment)
		if !ok {
			continue
		}
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				out[reason] += ctr.Packets
			}
		}
	}
}

// removeTable deletes the whole table (tests, and a manager asked to
// clean up after itself).
func (m *Manager) removeTable() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	n := 0
	for _, t := range []*nftables.Table{m.tableRef(), m.l2TableRef()} {
		if _, err := c.ListTableOfFamily(t.Name, t.Family); err == nil {
			c.DelTable(t)
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return c.Flush()
}

// sandboxChainsNow opens a connection and lists sandbox chains.
func (m *Manager) sandboxChainsNow() (map[string]bool, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	defer c.CloseLasting()
	return m.sandboxChains(c)
}

// addPre6 queues the IPv6 part of a sandbox's pre chain: only its own
// address as source, no fragments, no extension headers, TCP and UDP/53
// (redirected by the nat chain like IPv4), neighbour solicitations for its
// GW6 and nothing else of ICMPv6; MLD reports (the sandbox's kernel
// announcing its multicast groups, from ::) are dropped and counted apart,
// so that they do not look like spoofing.
func (m *Manager) addPre6(c *nftables.Conn, pre *nftables.Chain, l *Link) {
	t := m.tableRef()
	add := func(r *nftables.Rule) { r.Table, r.Chain = t, pre; c.AddRule(r) }
	nh, th := expr.PayloadBaseNetworkHeader, expr.PayloadBaseTransportHeader
	v6 := func(more ...expr.Any) []expr.Any {
		return append([]expr.Any{meta(expr.MetaKeyNFPROTO), cmp(expr.CmpOpEq, []byte{unix.NFPROTO_IPV6})}, more...)
	}
	next := func(op expr.CmpOp, p byte) []expr.Any { return []expr.Any{payload(nh, 6, 1), cmp(op, []byte{p})} }
	icmp := func(typ byte) []expr.Any {
		return append(next(expr.CmpOpEq, unix.IPPROTO_ICMPV6), payload(th, 0, 1), cmp(expr.CmpOpEq, []byte{typ}))
	}
	guest, gw := l.Guest6.As16(), l.Host6.As16()
	for _, typ := range []byte{130, 131, 132, 143} {
		add(counted("mld_drop", expr.VerdictDrop, v6(icmp(typ)...)...))
	}
	add(counted("spoof_drop", expr.VerdictDrop, v6(payload(nh, 8, 16), cmp(expr.CmpOpNeq, guest[:]))...))
	add(counted("frag_drop", expr.VerdictDrop, v6(next(expr.CmpOpEq, 44)...)...))
	for _, p := range []byte{0, 43, 60} { // hop-by-hop, routing, destination options
		add(counted("ipopt_drop", expr.VerdictDrop, v6(next(expr.CmpOpEq, p)...)...))
	}
	add(counted("tcp", expr.VerdictAccept, v6(next(expr.CmpOpEq, unix.IPPROTO_TCP)...)...))
	add(counted("dns", expr.VerdictAccept, v6(append(next(expr.CmpOpEq, unix.IPPROTO_UDP), payload(th, 2, 2), cmp(expr.CmpOpEq, port16(53)))...)...))
	add(counted("udp_drop", expr.VerdictDrop, v6(next(expr.CmpOpEq, unix.IPPROTO_UDP)...)...))
	// A neighbour solicitation for GW6 (hop limit 255: from the link).
	add(counted("nd", expr.VerdictAccept, v6(append(icmp(135), payload(nh, 7, 1), cmp(expr.CmpOpEq, []byte{255}),
		payload(th, 8, 16), cmp(expr.CmpOpEq, gw[:]))...)...))
	add(counted("icmp_drop", expr.VerdictDrop, v6(next(expr.CmpOpEq, unix.IPPROTO_ICMPV6)...)...))
	add(counted("proto_drop", expr.VerdictDrop, v6()...))
}
