package egress

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/egress/policy"
	"golang.org/x/net/dns/dnsmessage"
)

const (
	maxDNSMsg   = 4096
	answerTTL   = 30 // seconds: short, so a policy change is noticed soon
	maxCNAMEs   = 8
	dnsTCPIdle  = 10 * time.Second
	dnsTCPConns = 8
)

func (s *sandbox) serveUDP(pc *net.UDPConn) {
	defer s.wg.Done()
	buf := make([]byte, maxDNSMsg)
	for {
		n, from, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		q := append([]byte(nil), buf[:n]...)
		select {
		case s.dnsIn <- struct{}{}:
		default:
			continue // overloaded: drop, the client retries (R18)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.dnsIn }()
			if resp := s.answer(q, 512); resp != nil {
				pc.WriteToUDPAddrPort(resp, from)
			}
		}()
	}
}

func (s *sandbox) serveDNSTCP(ln *net.TCPListener) {
	defer s.wg.Done()
	sem := make(chan struct{}, dnsTCPConns)
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		if !s.track(c) {
			<-sem
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-sem }()
			defer s.untrack(c)
			for {
				c.SetDeadline(time.Now().Add(dnsTCPIdle))
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				q := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				resp := s.answer(q, 65535)
				if resp == nil {
					return
				}
				if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(resp))), resp...)); err != nil {
					return
				}
			}
		}()
	}
}

// answer handles one query from the sandbox; nil means no reply.
func (s *sandbox) answer(msg []byte, maxLen int) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil || h.Response {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return nil
	}
	s.count(func(st *Stats) { st.DNSQueries++ })
	reply := func(rc dnsmessage.RCode, q *dnsmessage.Question, addrs []netip.Addr, ttl uint32) []byte {
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode,
			RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rc})
		b.EnableCompression()
		if q != nil {
			b.StartQuestions()
			b.Question(*q)
			b.StartAnswers()
			for _, a := range addrs {
				rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: ttl}
				if a.Is4() {
					b.AResource(rh, dnsmessage.AResource{A: a.As4()})
				} else {
					b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()})
				}
			}
		}
		out, err := b.Finish()
		if err != nil || len(out) > maxLen {
			return nil
		}
		return out
	}
	if h.OpCode != 0 || len(qs) != 1 || qs[0].Class != dnsmessage.ClassINET {
		return reply(dnsmessage.RCodeFormatError, nil, nil, 0)
	}
	q := qs[0]
	d := Decision{Proto: "dns", Name: strings.TrimSuffix(q.Name.String(), ".")}
	refuse := func(reason string) []byte {
		d.Verdict, d.Reason = "deny", reason
		s.record(d)
		s.count(func(st *Stats) { st.DNSRefused++ })
		return reply(dnsmessage.RCodeRefused, &q, nil, 0)
	}
	if !s.bkt.take() {
		return refuse("dns_rate_limited")
	}
	pol := s.policy.Load()
	if pol == nil || pol.Mode == policy.Blocked {
		return refuse("blocked") // no recursion at all (R17)
	}
	name, err := policy.Canonical(q.Name.String())
	if err != nil {
		return refuse("bad_name")
	}
	d.Name = name
	rule, ok := pol.AllowName(name)
	if !ok {
		return refuse("dns_refused")
	}
	d.Rule = rule.String()
	if q.Type != dnsmessage.TypeA && (q.Type != dnsmessage.TypeAAAA || !s.addr6.IsValid()) {
		// Only A (and, for a sandbox with IPv6, AAAA) is resolved: no
		// TXT/HTTPS/SVCB (and so no ECH configs, R5), no AAAA without
		// IPv6. An empty answer, not an error.
		d.Verdict, d.Reason = "allow", "nodata_"+strings.TrimPrefix(q.Type.String(), "Type")
		s.record(d)
		return reply(dnsmessage.RCodeSuccess, &q, nil, 0)
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.gw.cfg.DialTimeout)
	defer cancel()
	addrs, ttl, reason, err := s.resolveType(ctx, name, pol, q.Type)
	if err != nil {
		s.gw.cfg.Logf("egress: %s: resolve %s: %v", s.id, name, err)
		d.Verdict, d.Reason = "deny", "upstream_error"
		s.record(d)
		return reply(dnsmessage.RCodeServerFailure, &q, nil, 0)
	}
	if reason != "" {
		return refuse(reason)
	}
	s.pin(name, addrs)
	d.Verdict = "allow"
	d.Dialled = joinAddrs(addrs)
	if len(addrs) == 0 {
		d.Reason = "nodata"
	}
	s.record(d)
	if ttl > answerTTL {
		ttl = answerTTL
	}
	return reply(dnsmessage.RCodeSuccess, &q, addrs, ttl)
}

func joinAddrs(as []netip.Addr) string {
	ss := make([]string, len(as))
	for i, a := range as {
		ss[i] = a.String()
	}
	return strings.Join(ss, ",")
}

// resolve asks the upstream for name's A records. A CNAME chain leaving
// the allowlist is refused (a name under an allowed zone must not lend its
// authority to another zone's addresses); internal addresses are dropped
// from the answer (rebinding, R5/R15).
func (s *sandbox) resolve(ctx context.Context, name string, pol *policy.Policy) (addrs []netip.Addr, ttl uint32, refuse string, err error) {
	return s.resolveType(ctx, name, pol, dnsmessage.TypeA)
}

// resolveType is resolve for A or AAAA records.
func (s *sandbox) resolveType(ctx context.Context, name string, pol *policy.Policy, qtype dnsmessage.Type) (addrs []netip.Addr, ttl uint32, refuse string, err error) {
	s.count(func(st *Stats) { st.UpstreamSockets++ })
	resp, err := s.gw.exchange(ctx, name, qtype)
	if err != nil {
		return nil, 0, "", err
	}
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil {
		return nil, 0, "", err
	}
	if h.RCode == dnsmessage.RCodeNameError {
		return nil, 0, "", nil
	}
	if h.RCode != dnsmessage.RCodeSuccess {
		return nil, 0, "", fmt.Errorf("upstream rcode %v", h.RCode)
	}
	if err := p.SkipAllQuestions(); err != nil {
		return nil, 0, "", err
	}
	cnames := map[string]string{}
	a := map[string][]netip.Addr{}
	ttl = answerTTL
	for {
		rh, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			break
		}
		if err != nil {
			return nil, 0, "", err
		}
		owner := strings.ToLower(strings.TrimSuffix(rh.Name.String(), "."))
		switch rh.Type {
		case dnsmessage.TypeCNAME:
			r, err := p.CNAMEResource()
			if err != nil {
				return nil, 0, "", err
			}
			cnames[owner] = strings.ToLower(strings.TrimSuffix(r.CNAME.String(), "."))
		case dnsmessage.TypeA:
			r, err := p.AResource()
			if err != nil {
				return nil, 0, "", err
			}
			if qtype == dnsmessage.TypeA {
				a[owner] = append(a[owner], netip.AddrFrom4(r.A))
			}
		case dnsmessage.TypeAAAA:
			r, err := p.AAAAResource()
			if err != nil {
				return nil, 0, "", err
			}
			if qtype == dnsmessage.TypeAAAA {
				a[owner] = append(a[owner], netip.AddrFrom16(r.AAAA))
			}
		default:
			if err := p.SkipAnswer(); err != nil {
				return nil, 0, "", err
			}
			continue
		}
		if rh.TTL < ttl {
			ttl = rh.TTL
		}
	}
	cur := name
	for i := 0; ; i++ {
		next, ok := cnames[cur]
		if !ok {
			break
		}
		if i >= maxCNAMEs {
			return nil, 0, "cname_loop", nil
		}
		canon, err := policy.Canonical(next)
		if err != nil {
			return nil, 0, "cname_bad", nil
		}
		if _, ok := pol.AllowName(canon); !ok {
			return nil, 0, "cname_exit", nil
		}
		cur = canon
	}
	for _, ip := range a[cur] {
		// An IPv4-mapped (or -compatible) AAAA is an IPv4 address in
		// disguise: never answered (R15).
		if !s.gw.filter.internal(ip) && (ip.Is4() || !ip.Is4In6() && !netip.MustParsePrefix("::/96").Contains(ip)) {
			addrs = append(addrs, ip)
		}
	}
	if len(addrs) == 0 && len(a[cur]) > 0 {
		return nil, 0, "internal_answer", nil
	}
	return addrs, ttl, "", nil
}

// exchange sends one query (A or AAAA) for name to the upstream resolver
// over UDP, retrying over TCP when the answer is truncated. The socket is
// connected, so only the upstream's own replies are read; the id and
// question must match (spoofed answers are ignored).
func (g *Gateway) exchange(ctx context.Context, name string, qtype dnsmessage.Type) ([]byte, error) {
	qn, err := dnsmessage.NewName(name + ".")
	if err != nil {
		return nil, err
	}
	var idb [2]byte
	rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])
	q := dnsmessage.Question{Name: qn, Type: qtype, Class: dnsmessage.ClassINET}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.StartQuestions()
	b.Question(q)
	msg, err := b.Finish()
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	deadline, _ := ctx.Deadline()
	for _, network := range []string{"udp4", "tcp4"} {
		c, err := d.DialContext(ctx, network, g.cfg.Upstream.String())
		if err != nil {
			return nil, err
		}
		c.SetDeadline(deadline)
		resp, err := roundTrip(c, network, msg)
		c.Close()
		if err != nil {
			return nil, err
		}
		var p dnsmessage.Parser
		h, err := p.Start(resp)
		if err != nil || h.ID != id || !h.Response {
			return nil, fmt.Errorf("bad upstream reply")
		}
		got, err := p.Question()
		if err != nil || got.Type != q.Type || !strings.EqualFold(got.Name.String(), q.Name.String()) {
			return nil, fmt.Errorf("upstream reply to another question")
		}
		if !h.Truncated {
			return resp, nil
		}
	}
	return nil, errors.New("truncated upstream reply over TCP")
}

func roundTrip(c net.Conn, network string, msg []byte) ([]byte, error) {
	if network == "udp4" {
		if _, err := c.Write(msg); err != nil {
			return nil, err
		}
		buf := make([]byte, maxDNSMsg)
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...)); err != nil {
		return nil, err
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return nil, err
	}
	resp := make([]byte, binary.BigEndian.Uint16(l[:]))
	_, err := io.ReadFull(c, resp)
	return resp, err
}
