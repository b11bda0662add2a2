package criu

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
)

// Magic numbers that open CRIU image files (criu/include/magic.h): most
// images start with the common one and then their own; a few with the
// service one.
const (
	imgCommonMagic  = 0x54564319
	imgServiceMagic = 0x55105940
)

// RemapUserns rewrites the user namespace maps in dir/userns-*.img so that
// the restored tree's ids 0.. map to host ids to.. instead of from..
// (count ids): a fork runs under a uid block of its own. CRIU records
// every other id (credentials, file owners) as the namespace sees it, so
// only the map changes.
func RemapUserns(dir string, from, to, count uint32) error {
	return rewriteImages(dir, "userns-*.img", func(b []byte) ([]byte, error) { return remapUsernsImage(b, from, to, count) })
}

// rewriteImages replaces every image in dir matching pattern with what
// fn makes of it, as a new file: the image dir may hold hard links to
// another copy.
func rewriteImages(dir, pattern string, fn func([]byte) ([]byte, error)) error {
	imgs, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil {
		return fmt.Errorf("criu: %w", err)
	}
	for _, p := range imgs {
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("criu: %w", err)
		}
		out, err := fn(b)
		if err != nil {
			return fmt.Errorf("criu: %s: %w", p, err)
		}
		tmp := p + ".new"
		if err := os.WriteFile(tmp, out, 0o644); err != nil {
			return fmt.Errorf("criu: %w", err)
		}
		if err := os.Rename(tmp, p); err != nil {
			return fmt.Errorf("criu: %w", err)
		}
	}
	return nil
}

// remapUsernsImage rewrites lower_first in every uid_gid_extent of the
// userns_entry messages of an image (images/userns.proto: userns_entry
// {repeated uid_gid_extent uid_map = 1; gid_map = 2}, uid_gid_extent
// {uint32 first = 1; lower_first = 2; count = 3}). Other fields are kept
// as they are.
func remapUsernsImage(b []byte, from, to, count uint32) ([]byte, error) {
	hdr, msgs, err := splitImage(b)
	if err != nil {
		return nil, err
	}
	changed := 0
	for k, m := range msgs {
		msgs[k], err = rewriteFields(m, func(num protowire.Number, v []byte) ([]byte, error) {
			if num != 1 && num != 2 {
				return nil, nil
			}
			return rewriteFields(v, func(num protowire.Number, _ []byte) ([]byte, error) { return nil, nil },
				func(num protowire.Number, x uint64) uint64 {
					if num == 2 && x >= uint64(from) && x < uint64(from)+uint64(count) {
						changed++
						return x - uint64(from) + uint64(to)
					}
					return x
				})
		}, func(_ protowire.Number, x uint64) uint64 { return x })
		if err != nil {
			return nil, err
		}
	}
	if changed == 0 {
		return nil, fmt.Errorf("no map onto host ids %d..%d", from, uint64(from)+uint64(count)-1)
	}
	return joinImage(hdr, msgs), nil
}

// splitImage splits a CRIU image into its header (the magic numbers) and
// its entries (each a protobuf message after a 4-byte little-endian
// length).
func splitImage(b []byte) (hdr []byte, msgs [][]byte, err error) {
	if len(b) < 4 {
		return nil, nil, fmt.Errorf("short image")
	}
	n := 4
	if m := binary.LittleEndian.Uint32(b); m == imgCommonMagic || m == imgServiceMagic {
		n = 8
	}
	if len(b) < n {
		return nil, nil, fmt.Errorf("short image")
	}
	for rest := b[n:]; len(rest) > 0; {
		if len(rest) < 4 {
			return nil, nil, fmt.Errorf("truncated entry")
		}
		l := binary.LittleEndian.Uint32(rest)
		if uint32(len(rest)-4) < l {
			return nil, nil, fmt.Errorf("truncated entry")
		}
		msgs = append(msgs, rest[4:4+l])
		rest = rest[4+l:]
	}
	return b[:n], msgs, nil
}

// joinImage is the inverse of splitImage.
func joinImage(hdr []byte, msgs [][]byte) []byte {
	out := append([]byte(nil), hdr...)
	for _, m := range msgs {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(m)))
		out = append(out, m...)
	}
	return out
}

// rewriteFields re-encodes a protobuf message: bytes fields through
// bytesFn (nil result: kept), varints through varintFn; other wire types
// are copied.
func rewriteFields(b []byte, bytesFn func(protowire.Number, []byte) ([]byte, error), varintFn func(protowire.Number, uint64) uint64) ([]byte, error) {
	var out []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		switch typ {
		case protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			out = protowire.AppendTag(out, num, typ)
			out = protowire.AppendVarint(out, varintFn(num, v))
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			nv, err := bytesFn(num, v)
			if err != nil {
				return nil, err
			}
			if nv == nil {
				nv = v
			}
			out = protowire.AppendTag(out, num, typ)
			out = protowire.AppendBytes(out, nv)
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			out = protowire.AppendTag(out, num, typ)
			out = append(out, b[:n]...)
			b = b[n:]
		}
	}
	return out, nil
}

// DropInterfaces removes the network interfaces names from the images in
// dir: their entries in netdev-*.img (images/netdev.proto: net_device_entry
// {nd_type type = 1; …; string name = 5}) and, since `ip addr restore`
// and `ip route restore` fail on a device that is not there, the saved
// addresses, routes and rules of the namespace (ifaddr-, route-, route6-,
// rule-*.img): loopback gets its addresses when it comes up, and the
// caller sets up the rest (a sandbox's network hook).
func DropInterfaces(dir string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	if err := rewriteImages(dir, "netdev-*.img", func(b []byte) ([]byte, error) { return dropNetdevs(b, names) }); err != nil {
		return err
	}
	for _, pat := range []string{"ifaddr-*.img", "route-*.img", "route6-*.img", "rule-*.img"} {
		ms, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			return fmt.Errorf("criu: %w", err)
		}
		for _, p := range ms {
			if err := os.Remove(p); err != nil {
				return fmt.Errorf("criu: %w", err)
			}
		}
	}
	return nil
}

// dropNetdevs copies a netdev image without the entries named in names.
func dropNetdevs(b []byte, names []string) ([]byte, error) {
	hdr, msgs, err := splitImage(b)
	if err != nil {
		return nil, err
	}
	var keep [][]byte
	for _, m := range msgs {
		name, err := netdevName(m)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(names, name) {
			keep = append(keep, m)
		}
	}
	return joinImage(hdr, keep), nil
}

// netdevName is field 5 (name) of a net_device_entry.
func netdevName(msg []byte) (string, error) {
	for b := msg; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", protowire.ParseError(n)
		}
		b = b[n:]
		if num == 5 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return "", protowire.ParseError(n)
			}
			return string(v), nil
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return "", protowire.ParseError(n)
		}
		b = b[n:]
	}
	return "", fmt.Errorf("net device entry without a name")
}
