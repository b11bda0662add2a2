package egress

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/netns"
)

// defaultPool is netns.Config's default Pool.
var defaultPool = netip.MustParsePrefix("10.200.0.0/16")

// Network joins each sandbox's link and host rules (netns) with the
// gateway that serves it. Its Setup is the namespace driver's Network hook:
// it runs before the sandbox's PID 1 is released, so the rules and the
// listeners exist before the sandbox's first instruction (R1).
type Network struct {
	Links *netns.Manager
	GW    *Gateway
	logf  func(string, ...any)
}

// NewNetwork creates the host table and the gateway. The sandbox pool is
// always internal to the gateway.
func NewNetwork(lc netns.Config, gc Config) (*Network, error) {
	// Refuse bad public ranges before the host table exists.
	pool := lc.Pool
	if !pool.IsValid() {
		pool = defaultPool
	}
	if err := checkPublic(gc.Public, pool.Masked(), hostNetworks()); err != nil {
		return nil, err
	}
	links, err := netns.New(lc)
	if err != nil {
		return nil, err
	}
	eff := links.Config()
	gc.DNSPort, gc.ProxyPort = eff.DNSPort, eff.ProxyPort
	gc.Pool = eff.Pool
	if eff.IPv6 == netns.IPv6On {
		gc.IPv6, gc.Pool6 = true, eff.Pool6
	}
	gw, err := New(gc)
	if err != nil {
		links.Unclaim()
		return nil, err
	}
	logf := gc.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return &Network{Links: links, GW: gw, logf: logf}, nil
}

// Setup gives a new sandbox (driver instance id) its link, rules and
// gateway listeners, with the blocked policy.
func (n *Network) Setup(ctx context.Context, id string, pid int) error {
	l, err := n.Links.Setup(ctx, id, pid)
	if err != nil {
		return err
	}
	if err := n.GW.Attach(id, l.Host, l.Host6); err != nil {
		n.Links.Release(id)
		return err
	}
	return nil
}

// SetupPath is Setup for a sandbox whose network namespace is the nsfs
// file nsPath rather than a process's (the gvisor driver makes the netns
// before runsc starts, so the rules exist before the sandbox does).
func (n *Network) SetupPath(ctx context.Context, id, nsPath string) error {
	l, err := n.Links.SetupPath(ctx, id, nsPath)
	if err != nil {
		return err
	}
	if err := n.GW.Attach(id, l.Host, l.Host6); err != nil {
		n.Links.Release(id)
		return err
	}
	return nil
}

// Release removes a sandbox's gateway state and rules.
func (n *Network) Release(id string) {
	n.GW.Detach(id)
	n.Links.Release(id)
}

// Adopt serves again a sandbox that survived a restart (blocked until its
// policy is set again).
func (n *Network) Adopt(id string) error {
	l, err := n.Links.Adopt(id)
	if err != nil {
		return err
	}
	return n.GW.Attach(id, l.Host, l.Host6)
}

// Sweep removes links and rules of instances not in keep.
func (n *Network) Sweep(keep map[string]bool) error { return n.Links.Sweep(keep) }

// Counters returns a sandbox's packet-filter counters.
func (n *Network) Counters(id string) (map[string]uint64, error) { return n.Links.Counters(id) }

// Close stops the gateway. Links and rules stay: sandboxes outlive the
// node process, and with the gateway gone their connections are refused.
func (n *Network) Close() {
	n.GW.Close()
	n.Links.Unclaim()
}

// RemoveIfUnused deletes the host table once no sandbox link of this
// network is left on the host (a node shutting down with no sandboxes).
// A link still there (a netns dies with its PID 1, a moment after) is
// waited for up to wait; if one remains, the table stays: it is what keeps
// that sandbox's traffic from being routed (R1). It reports whether the
// table is gone.
func (n *Network) RemoveIfUnused(wait time.Duration) (bool, error) {
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(n.Links.Config().IfPrefix) + `[0-9a-f]{1,8}$`)
	deadline := time.Now().Add(wait)
	for {
		links, err := netlink.LinkList()
		if err != nil {
			return false, err
		}
		var left []string
		for _, l := range links {
			if re.MatchString(l.Attrs().Name) {
				left = append(left, l.Attrs().Name)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("egress: table %s kept: sandbox links %v are still on the host", n.Links.Config().Table, left)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := n.Links.Destroy(); err != nil {
		return false, err
	}
	return true, nil
}

// WrapDriver returns d with each instance's network released when the
// instance is destroyed or fails to start, re-adopted on Attach and swept
// with the driver's own leftovers.
func (n *Network) WrapDriver(d driver.Driver) driver.Driver { return &netDriver{Driver: d, n: n} }

// Unwrap returns the wrapped driver.
func (d *netDriver) Unwrap() driver.Driver { return d.Driver }

type netDriver struct {
	driver.Driver
	n *Network
}

func (d *netDriver) Create(ctx context.Context, spec driver.Spec) (driver.Instance, error) {
	inst, err := d.Driver.Create(ctx, spec)
	if err != nil {
		d.n.Release(spec.ID)
		return nil, err
	}
	return &netInstance{Instance: inst, n: d.n}, nil
}

func (d *netDriver) Attach(ctx context.Context, id string) (driver.Instance, error) {
	inst, err := d.Driver.Attach(ctx, id)
	if err != nil {
		d.n.Release(id)
		return nil, err
	}
	if err := d.n.Adopt(id); err != nil {
		// The sandbox can outlive its host-side veth: in Kubernetes the
		// node pod's network namespace holds that end and takes the pair
		// with it when the pod is replaced. A sandbox whose namespace the
		// host can still enter gets a new link (and a new address).
		relinked := false
		if p, ok := driver.As[driver.NetNSer](inst); ok {
			if serr := d.n.SetupPath(ctx, id, p.NetNSPath()); serr != nil {
				err = fmt.Errorf("%w; new link: %w", err, serr)
			} else {
				relinked = true
				d.n.logf("egress: %s: re-attach network: a new link, the old one is gone (%v)", id, err)
			}
		}
		if !relinked {
			// Fail closed: the rules (if any) stay, nothing serves them.
			d.n.logf("egress: %s: re-attach network: %v", id, err)
		}
	}
	return &netInstance{Instance: inst, n: d.n}, nil
}

func (d *netDriver) Sweep(ctx context.Context, keep map[string]bool) error {
	if err := d.Driver.Sweep(ctx, keep); err != nil {
		return err
	}
	if err := d.n.Sweep(keep); err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	return nil
}

type netInstance struct {
	driver.Instance
	n *Network
}

// Unwrap exposes the driver's instance, so its optional interfaces (pause,
// writable layer, liveness) stay reachable through driver.As.
func (i *netInstance) Unwrap() driver.Instance { return i.Instance }

func (i *netInstance) Destroy(ctx context.Context) error {
	err := i.Instance.Destroy(ctx)
	i.n.Release(i.ID())
	return err
}

// Restore implements driver.Restorer (process snapshots) for a wrapped
// driver that has it, with the network handled as in Create.
func (d *netDriver) Restore(ctx context.Context, spec driver.Spec, dir string) (driver.Instance, error) {
	r, ok := d.Driver.(driver.Restorer)
	if !ok {
		return nil, fmt.Errorf("driver %s cannot restore process snapshots: %w", d.Name(), driver.ErrUnsupported)
	}
	inst, err := r.Restore(ctx, spec, dir)
	if err != nil {
		d.n.Release(spec.ID)
		return nil, err
	}
	return &netInstance{Instance: inst, n: d.n}, nil
}
