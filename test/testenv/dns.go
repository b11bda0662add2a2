package testenv

import (
	"net"
	"strings"

	"golang.org/x/net/dns/dnsmessage"
)

// ServeDNS answers A queries on pc from zone (name with its final dot →
// IPv4 address) and NXDOMAIN for any other name, until pc is closed: the
// upstream resolver of an egress gateway under test (--egress-dns).
func ServeDNS(pc net.PacketConn, zone map[string]string) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		hdr, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: hdr.ID, Response: true, Authoritative: true, RCode: dnsmessage.RCodeNameError})
		ip, ok := zone[strings.ToLower(q.Name.String())]
		if ok {
			b = dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: hdr.ID, Response: true, Authoritative: true})
		}
		b.EnableCompression()
		b.StartQuestions()
		b.Question(q)
		b.StartAnswers()
		if a := net.ParseIP(ip).To4(); ok && q.Type == dnsmessage.TypeA && a != nil {
			b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60},
				dnsmessage.AResource{A: [4]byte{a[0], a[1], a[2], a[3]}})
		}
		if msg, err := b.Finish(); err == nil {
			pc.WriteTo(msg, from)
		}
	}
}
