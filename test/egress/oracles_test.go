package egress_test

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// IPv6 side of the fake internet (the gateway itself never dials IPv6;
// the addresses exist so that a v6 packet that got out would be seen).
const (
	attackerIP6 = "2001:db8::66"
	edgeIP6     = "2001:db8::10"
	uplinkIP6   = "2001:db8:ffff::1"
	wanIP6      = "2001:db8:ffff::254"
)

// Internal listeners in the test's namespace (the "host"): what O-INTERNAL
// watches. Metadata, corp LAN and the host's own services.
var internalAddrs = []string{"169.254.169.254", "169.254.170.2", "10.0.0.1", "172.16.0.1", "192.168.0.1", "100.64.0.1"}

// packet is one packet the wan received from the uplink.
type packet struct {
	v6       bool
	src, dst netip.Addr
	proto    uint8
	frag     bool
	data     []byte // the whole IP packet, at most 2 KiB
}

// wire is O-WIRE: a packet socket in the wan namespace records every
// packet arriving from the uplink. The gateway's uplink address is the
// only legitimate source; a packet from any other address (a sandbox's,
// a spoofed one, any IPv6 source) means raw guest packets were forwarded.
type wire struct {
	fd      int
	mu      sync.Mutex
	packets []packet
	bytes   int
}

func captureWire(loIndex int) (*wire, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	w := &wire{fd: fd}
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				if err == unix.EINTR {
					continue
				}
				return
			}
			ll, ok := from.(*unix.SockaddrLinklayer)
			if !ok || ll.Ifindex == loIndex || ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			w.add(htons(ll.Protocol), buf[:n])
		}
	}()
	return w, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (w *wire) add(ethertype uint16, b []byte) {
	var p packet
	switch {
	case ethertype == unix.ETH_P_IP && len(b) >= 20:
		p.src, _ = netip.AddrFromSlice(b[12:16])
		p.dst, _ = netip.AddrFromSlice(b[16:20])
		p.proto = b[9]
		p.frag = binary.BigEndian.Uint16(b[6:8])&0x3fff != 0
	case ethertype == unix.ETH_P_IPV6 && len(b) >= 40:
		p.v6 = true
		p.src, _ = netip.AddrFromSlice(b[8:24])
		p.dst, _ = netip.AddrFromSlice(b[24:40])
		p.proto = b[6]
	default:
		return // ARP and the like
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.bytes > 64<<20 {
		return
	}
	p.data = append([]byte(nil), b[:min(len(b), 2048)]...)
	w.bytes += len(p.data)
	w.packets = append(w.packets, p)
}

func (w *wire) Close() error { return unix.Close(w.fd) }

// mark returns a position; violations and saw look only after it.
func (w *wire) mark() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.packets)
}

// violations lists packets after mark whose source is not the gateway's
// uplink (or that are fragments or neither TCP nor UDP nor ICMP).
func (w *wire) violations(mark int) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, p := range w.packets[mark:] {
		if p.v6 && (p.src.IsLinkLocalUnicast() || p.src.IsUnspecified()) && (p.dst.IsLinkLocalMulticast() || p.dst.IsLinkLocalUnicast()) {
			continue // the uplink's own neighbour discovery and MLD: link scope, never forwarded
		}
		switch {
		case p.v6 && p.src.String() != uplinkIP6, !p.v6 && p.src.String() != uplinkIP:
			out = append(out, fmt.Sprintf("source %s -> %s proto %d", p.src, p.dst, p.proto))
		case p.frag:
			out = append(out, fmt.Sprintf("fragment %s -> %s", p.src, p.dst))
		case p.proto != unix.IPPROTO_TCP && p.proto != unix.IPPROTO_UDP && p.proto != unix.IPPROTO_ICMP && p.proto != unix.IPPROTO_ICMPV6:
			out = append(out, fmt.Sprintf("protocol %d %s -> %s", p.proto, p.src, p.dst))
		}
	}
	return out
}

// sawTo reports whether a packet after mark carried s towards an
// attacker address (its IPv4 or IPv6 network).
func (w *wire) sawTo(mark int, s string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	att := netip.MustParsePrefix("198.51.100.0/24")
	for _, p := range w.packets[mark:] {
		if (att.Contains(p.dst) || p.dst.String() == attackerIP6) && bytes.Contains(p.data, []byte(s)) {
			return true
		}
	}
	return false
}

// linkV6 gives the uplink IPv6 addresses and a default route, so that a
// sandbox's IPv6 packet the host forwarded would reach the wan.
func (w *wan) linkV6(up netlink.Link, h *netlink.Handle, peer netlink.Link) error {
	add := func(h *netlink.Handle, l netlink.Link, a string) error {
		return h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(a), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD})
	}
	host, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer host.Close()
	if err := add(host, up, uplinkIP6); err != nil {
		return fmt.Errorf("uplink v6: %w", err)
	}
	if err := add(h, peer, wanIP6); err != nil {
		return fmt.Errorf("wan v6: %w", err)
	}
	_, def, _ := net.ParseCIDR("::/0")
	if err := host.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Dst: def, Gw: net.ParseIP(wanIP6)}); err != nil {
		return fmt.Errorf("v6 default route: %w", err)
	}
	return nil
}

// serveAttacker6 is flagd on IPv6 (TCP 80, UDP 9999).
func (w *wan) serveAttacker6() error {
	ln, err := net.Listen("tcp6", "["+attackerIP6+"]:80")
	if err != nil {
		return err
	}
	w.closers = append(w.closers, ln)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(3 * time.Second))
			b := make([]byte, 2048)
			n, _ := c.Read(b)
			w.note(true, "flagd6 tcp from %s: %q", c.RemoteAddr(), b[:n])
			io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\n"+w.flag+"-flagd6\n")
			c.Close()
		}
	}()
	pc, err := net.ListenPacket("udp6", "["+attackerIP6+"]:9999")
	if err != nil {
		return err
	}
	w.closers = append(w.closers, pc)
	go func() {
		b := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(b)
			if err != nil {
				return
			}
			w.note(true, "flagd6 udp from %s: %q", from, b[:n])
		}
	}()
	return nil
}

// serveInternal starts the internal listeners in the test's namespace:
// metadata and corp addresses (port 80), the host's
// loopback service 127.0.0.1:7777 and its any-address service :2222.
func (w *wan) serveInternal() error {
	// On the namespace's loopback (no dummy module here): the host's
	// routing reaches them, as it would a link-local or LAN service.
	d, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	for _, a := range internalAddrs {
		// Replace: an earlier test in this process (same namespace) may
		// have added them already.
		if err := netlink.AddrReplace(d, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(a).To4(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return fmt.Errorf("internal address %s: %w", a, err)
		}
	}
	listen := func(addr, flag string) error {
		ln, err := net.Listen("tcp4", addr)
		if err != nil {
			return err
		}
		srv := &http.Server{ReadHeaderTimeout: 3 * time.Second, Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			w.mu.Lock()
			w.internal = append(w.internal, fmt.Sprintf("%s %s %s%s from %s", flag, r.Method, r.Host, r.URL, r.RemoteAddr))
			w.mu.Unlock()
			io.WriteString(rw, flag+"-"+w.flag+"\n")
		})}
		w.closers = append(w.closers, srv)
		go srv.Serve(ln)
		return nil
	}
	for _, a := range internalAddrs {
		flag := "CORP-FLAG"
		if strings.HasPrefix(a, "169.254.") {
			flag = "META-FLAG"
		}
		if err := listen(a+":80", flag); err != nil {
			return err
		}
	}
	if err := listen("127.0.0.1:7777", "HOST-LO-FLAG"); err != nil {
		return err
	}
	return listen("0.0.0.0:2222", "HOST-ANY-FLAG")
}

// internalContacts returns the internal listeners' contacts so far.
func (w *wan) internalContacts() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.internal...)
}

// registryFiles builds registry.test's repositories: a Debian archive
// (dists/stable Release with checksums, Packages and Packages.gz, one
// .deb in the pool) and a PEP 503 simple index with one wheel.
func registryFiles() (map[string][]byte, error) {
	files := map[string][]byte{}
	deb, err := buildDeb("space-demo", "1.0")
	if err != nil {
		return nil, err
	}
	debPath := "pool/main/s/space-demo/space-demo_1.0_all.deb"
	files["/debian/"+debPath] = deb
	sum := sha256.Sum256(deb)
	m5 := md5.Sum(deb)
	packages := fmt.Sprintf("Package: space-demo\nVersion: 1.0\nArchitecture: all\nMaintainer: SPACE <space@registry.test>\n"+
		"Installed-Size: 1\nFilename: %s\nSize: %d\nMD5sum: %x\nSHA256: %x\nSection: misc\nPriority: optional\n"+
		"Description: SPACE egress test package\n fetched through the gateway by apt-get download.\n", debPath, len(deb), m5, sum)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(packages))
	zw.Close()
	idx := map[string][]byte{"main/binary-amd64/Packages": []byte(packages), "main/binary-amd64/Packages.gz": gz.Bytes()}
	var rel strings.Builder
	fmt.Fprintf(&rel, "Origin: SPACE\nLabel: SPACE test\nSuite: stable\nCodename: stable\nDate: %s\nArchitectures: amd64\nComponents: main\nDescription: fake Debian archive of the egress tests\n",
		time.Now().UTC().Format(time.RFC1123))
	for _, algo := range []string{"MD5Sum", "SHA256"} {
		fmt.Fprintf(&rel, "%s:\n", algo)
		for _, name := range []string{"main/binary-amd64/Packages", "main/binary-amd64/Packages.gz"} {
			b := idx[name]
			var h string
			if algo == "MD5Sum" {
				s := md5.Sum(b)
				h = hex.EncodeToString(s[:])
			} else {
				s := sha256.Sum256(b)
				h = hex.EncodeToString(s[:])
			}
			fmt.Fprintf(&rel, " %s %d %s\n", h, len(b), name)
		}
	}
	files["/debian/dists/stable/Release"] = []byte(rel.String())
	for name, b := range idx {
		files["/debian/dists/stable/"+name] = b
	}
	whl, err := buildWheel("space_demo", "1.0")
	if err != nil {
		return nil, err
	}
	whlName := "space_demo-1.0-py3-none-any.whl"
	files["/packages/"+whlName] = whl
	ws := sha256.Sum256(whl)
	files["/simple/space-demo/"] = []byte(fmt.Sprintf("<!DOCTYPE html>\n<html><body>\n<a href=\"/packages/%s#sha256=%x\">%s</a>\n</body></html>\n", whlName, ws, whlName))
	files["/simple/space-demo"] = files["/simple/space-demo/"]
	return files, nil
}

// buildDeb makes a real binary package: an ar archive of debian-binary,
// control.tar.gz and data.tar.gz.
func buildDeb(name, version string) ([]byte, error) {
	tgz := func(entries map[string]string) ([]byte, error) {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		tw := tar.NewWriter(zw)
		for n, body := range entries {
			if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(1700000000, 0), Typeflag: tar.TypeReg}); err != nil {
				return nil, err
			}
			io.WriteString(tw, body)
		}
		if err := tw.Close(); err != nil {
			return nil, err
		}
		if err := zw.Close(); err != nil {
			return nil, err
		}
		return b.Bytes(), nil
	}
	control, err := tgz(map[string]string{"./control": fmt.Sprintf("Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: SPACE <space@registry.test>\nDescription: SPACE egress test package\n", name, version)})
	if err != nil {
		return nil, err
	}
	data, err := tgz(map[string]string{"./usr/share/doc/" + name + "/README": "fetched through the SPACE egress gateway\n"})
	if err != nil {
		return nil, err
	}
	var ar bytes.Buffer
	ar.WriteString("!<arch>\n")
	for _, m := range []struct {
		name string
		body []byte
	}{{"debian-binary", []byte("2.0\n")}, {"control.tar.gz", control}, {"data.tar.gz", data}} {
		fmt.Fprintf(&ar, "%-16s%-12d%-6d%-6d%-8s%-10d`\n", m.name, 1700000000, 0, 0, "100644", len(m.body))
		ar.Write(m.body)
		if len(m.body)%2 == 1 {
			ar.WriteByte('\n')
		}
	}
	return ar.Bytes(), nil
}

// buildWheel makes a minimal valid wheel (zip with the package, METADATA,
// WHEEL and RECORD).
func buildWheel(pkg, version string) ([]byte, error) {
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	info := fmt.Sprintf("%s-%s.dist-info/", pkg, version)
	files := []struct{ name, body string }{
		{pkg + "/__init__.py", "GREETING = 'fetched through the SPACE egress gateway'\n"},
		{info + "METADATA", fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n", strings.ReplaceAll(pkg, "_", "-"), version)},
		{info + "WHEEL", "Wheel-Version: 1.0\nGenerator: space-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	for _, f := range files {
		fw, err := zw.Create(f.name)
		if err != nil {
			return nil, err
		}
		io.WriteString(fw, f.body)
		fmt.Fprintf(&record, "%s,,\n", f.name)
	}
	fmt.Fprintf(&record, "%sRECORD,,\n", info)
	fw, err := zw.Create(info + "RECORD")
	if err != nil {
		return nil, err
	}
	io.WriteString(fw, record.String())
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
