package qemu

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// routeTap makes the network namespace of QEMU process pid a router
// between the guest's tap and the sandbox's veth (already there, set up by
// Options.Network): the tap gets the guest's gateway address, forwarding
// is on, and what the guest sends leaves through the veth masqueraded to
// the veth's address, the only source the host's egress rules admit. No
// other traffic is forwarded, and nothing reaches the namespace itself
// from the guest (nothing listens there; QEMU has no network sockets).
//
// The namespace is outside the VM: the guest, root or not, cannot change
// these rules, unlike a container's netns.
func routeTap(pid int) error {
	ns, err := vns.GetFromPid(pid)
	if err != nil {
		return fmt.Errorf("qemu netns: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	tap, err := h.LinkByName(tapName)
	if err != nil {
		return fmt.Errorf("tap: %w", err)
	}
	// A fixed MAC: a restored guest's ARP cache still names the tap of
	// the VM it was saved from.
	mac, _ := net.ParseMAC(tapMAC)
	if err := h.LinkSetHardwareAddr(tap, mac); err != nil {
		return fmt.Errorf("tap mac: %w", err)
	}
	ip, ipn, _ := net.ParseCIDR(tapAddr)
	ipn.IP = ip
	if err := h.AddrAdd(tap, &netlink.Addr{IPNet: ipn}); err != nil {
		return fmt.Errorf("tap address: %w", err)
	}
	if err := inNetns(ns, func() error {
		for k, v := range map[string]string{
			"ipv4/ip_forward":                        "1",
			"ipv6/conf/all/disable_ipv6":             "1",
			"ipv6/conf/" + tapName + "/disable_ipv6": "1",
		} {
			if err := os.WriteFile("/proc/sys/net/"+k, []byte(v), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("sysctl %s: %w", k, err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := tapRules(int(ns)); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	// Up only once the rules are in.
	if err := h.LinkSetUp(tap); err != nil {
		return fmt.Errorf("tap up: %w", err)
	}
	return nil
}

// tapRules installs, in the namespace nsFD:
//
//	table ip space-vm {
//	  chain in   { filter input 0; policy accept; iifname vmtap0 drop }
//	  chain fwd  { filter forward 0; policy drop;
//	               iifname vmtap0 oifname != vmtap0 ip saddr 169.254.0.2
//	                 ct state != invalid meta l4proto { tcp, udp, icmp } accept
//	               iifname != vmtap0 oifname vmtap0 ct state established,related accept }
//	  chain post { nat postrouting 100; oifname != vmtap0 masquerade }
//	}
//
// Only the guest's own address and the protocols masquerading rewrites
// leave: anything else (a forged source, GRE, SCTP, UDP-Lite, invalid
// packets) would otherwise cross with its original source and be left
// to the host's anti-spoof rules. Replies go only back to the tap.
func tapRules(nsFD int) error {
	c, err := nftables.New(nftables.WithNetNSFd(nsFD))
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "space-vm"})
	accept, drop := nftables.ChainPolicyAccept, nftables.ChainPolicyDrop
	in := c.AddChain(&nftables.Chain{Name: "in", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	fwd := c.AddChain(&nftables.Chain{Name: "fwd", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	post := c.AddChain(&nftables.Chain{Name: "post", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	ifIs := func(key expr.MetaKey, op expr.CmpOp) []expr.Any {
		return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: ifname(tapName)}}
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: append(ifIs(expr.MetaKeyIIFNAME, expr.CmpOpEq),
		&expr.Verdict{Kind: expr.VerdictDrop})})
	ctState := func(bits uint32, op expr.CmpOp) []expr.Any {
		return []expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: binaryutil.NativeEndian.PutUint32(0)},
			&expr.Cmp{Op: op, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
		}
	}
	guest := net.ParseIP(strings.SplitN(guestNet, "/", 2)[0]).To4()
	for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMP} {
		exprs := append(ifIs(expr.MetaKeyIIFNAME, expr.CmpOpEq), ifIs(expr.MetaKeyOIFNAME, expr.CmpOpNeq)...)
		exprs = append(exprs,
			// ip saddr (offset 12 in the network header) == the guest's address
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: guest},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}})
		exprs = append(exprs, ctState(expr.CtStateBitINVALID, expr.CmpOpEq)...)
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: append(exprs, &expr.Verdict{Kind: expr.VerdictAccept})})
	}
	back := append(ifIs(expr.MetaKeyIIFNAME, expr.CmpOpNeq), ifIs(expr.MetaKeyOIFNAME, expr.CmpOpEq)...)
	back = append(back, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED, expr.CmpOpNeq)...)
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: append(back, &expr.Verdict{Kind: expr.VerdictAccept})})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: append(ifIs(expr.MetaKeyOIFNAME, expr.CmpOpNeq),
		&expr.Masq{})})
	return c.Flush()
}

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

// inNetns runs fn on a thread that has joined ns.
func inNetns(ns vns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	orig, err := vns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := vns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := fn()
	if err := vns.Set(orig); err != nil {
		// Leave the thread locked: the runtime discards it when the
		// goroutine ends.
		return fmt.Errorf("return to host netns: %w", err)
	}
	runtime.UnlockOSThread()
	return ferr
}
