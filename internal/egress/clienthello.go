package egress

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/space-sandbox/space/internal/egress/policy"
)

// maxHello bounds the handshake bytes read before deciding (R18).
const maxHello = 32 << 10

var errHello = errors.New("malformed ClientHello")

// readClientHello reads TLS records until the first handshake message (a
// ClientHello) is complete, parses it strictly (R10: one host_name, no
// duplicate extensions, no ECH or ESNI) and returns the canonical SNI ("" if
// absent) and every byte read, to be replayed upstream.
func readClientHello(r *bufio.Reader) (sni string, raw []byte, err error) {
	var hs []byte
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return "", raw, fmt.Errorf("%w: %v", errHello, err)
		}
		raw = append(raw, hdr[:]...)
		n := int(binary.BigEndian.Uint16(hdr[3:]))
		if hdr[0] != 0x16 || hdr[1] != 3 || n == 0 || n > 1<<14+256 {
			return "", raw, fmt.Errorf("%w: bad record header", errHello)
		}
		if len(raw)+n > maxHello {
			return "", raw, fmt.Errorf("%w: longer than %d bytes", errHello, maxHello)
		}
		start := len(raw)
		raw = append(raw, make([]byte, n)...)
		if _, err := io.ReadFull(r, raw[start:]); err != nil {
			return "", raw, fmt.Errorf("%w: %v", errHello, err)
		}
		hs = append(hs, raw[start:]...)
		if len(hs) >= 4 {
			if hs[0] != 1 {
				return "", raw, fmt.Errorf("%w: not a ClientHello", errHello)
			}
			if want := 4 + (int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])); len(hs) >= want {
				if len(hs) != want {
					return "", raw, fmt.Errorf("%w: trailing handshake data", errHello)
				}
				sni, err := parseClientHello(hs[4:want])
				return sni, raw, err
			}
		}
	}
}

// cursor reads big-endian fields and remembers the first overrun.
type cursor struct {
	b   []byte
	bad bool
}

func (c *cursor) take(n int) []byte {
	if c.bad || n > len(c.b) {
		c.bad = true
		return nil
	}
	v := c.b[:n]
	c.b = c.b[n:]
	return v
}

func (c *cursor) u8() int { v := c.take(1); return ifOK(c, func() int { return int(v[0]) }) }
func (c *cursor) u16() int {
	v := c.take(2)
	return ifOK(c, func() int { return int(binary.BigEndian.Uint16(v)) })
}

func ifOK(c *cursor, f func() int) int {
	if c.bad {
		return 0
	}
	return f()
}

func parseClientHello(body []byte) (string, error) {
	c := &cursor{b: body}
	c.take(2 + 32) // legacy_version, random
	c.take(c.u8()) // session id
	if cs := c.u16(); cs == 0 || cs%2 != 0 {
		return "", fmt.Errorf("%w: cipher suites", errHello)
	} else {
		c.take(cs)
	}
	if n := c.u8(); n == 0 {
		return "", fmt.Errorf("%w: compression methods", errHello)
	} else {
		c.take(n)
	}
	if c.bad {
		return "", errHello
	}
	if len(c.b) == 0 {
		return "", nil // no extensions, so no SNI
	}
	ext := &cursor{b: c.take(c.u16())}
	if c.bad || len(c.b) != 0 {
		return "", fmt.Errorf("%w: extensions length", errHello)
	}
	seen := map[int]bool{}
	sni := ""
	for len(ext.b) > 0 {
		typ := ext.u16()
		data := ext.take(ext.u16())
		if ext.bad {
			return "", fmt.Errorf("%w: extension framing", errHello)
		}
		if seen[typ] {
			return "", fmt.Errorf("%w: duplicate extension %d", errHello, typ)
		}
		seen[typ] = true
		switch typ {
		case 0xfe0d, 0xffce: // encrypted_client_hello, encrypted_server_name
			return "", fmt.Errorf("%w: ECH/ESNI is not allowed", errHello)
		case 0: // server_name
			l := &cursor{b: data}
			list := &cursor{b: l.take(l.u16())}
			if l.bad || len(l.b) != 0 {
				return "", fmt.Errorf("%w: server_name framing", errHello)
			}
			if list.u8() != 0 {
				return "", fmt.Errorf("%w: server_name type", errHello)
			}
			name := list.take(list.u16())
			if list.bad || len(list.b) != 0 {
				return "", fmt.Errorf("%w: exactly one server name is allowed", errHello)
			}
			canon, err := policy.Canonical(string(name))
			if err != nil {
				return "", fmt.Errorf("%w: server name: %v", errHello, err)
			}
			sni = canon
		}
	}
	return sni, nil
}
