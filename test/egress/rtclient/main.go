// Command rtclient is the red-team toolkit run inside sandboxes by the
// egress tests: each verb makes one kind of attempt and prints OK or ERR.
// Nothing it prints is evidence of a block; the tests' oracles decide.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: rtclient dns|http|tls|https|httpauth|keepalive|raw|rawtls|dnsvia|udp|flood ...")
	}
	a := os.Args[2:]
	cmd := os.Args[1]
	switch cmd {
	case "http6", "tls6", "https6", "raw6": // the same over IPv6 (the name's AAAA)
		dialNet, cmd = "tcp6", strings.TrimSuffix(cmd, "6")
	}
	switch cmd {
	case "dns": // dns NAME
		r := &net.Resolver{PreferGo: true}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		ips, err := r.LookupIPAddr(ctx, a[0])
		check(err)
		fmt.Println("OK", ips)
	case "http": // http ADDR HOST PATH: one request to ADDR (host:port, resolved through DNS if a name)
		c := dial(a[0])
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", a[2], a[1])
		readAll(c)
	case "tls": // tls ADDR SNI HOST PATH
		raw := dial(a[0])
		c := tls.Client(raw, &tls.Config{ServerName: a[1], InsecureSkipVerify: true})
		c.SetDeadline(time.Now().Add(5 * time.Second))
		check(c.Handshake())
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", a[3], a[2])
		readAll(c)
	case "https": // https ADDR HOST PATH METHOD AUTH: certificate verified against the sandbox's trust store; AUTH ($VARS expanded) goes in Authorization if not empty
		raw := dial(a[0])
		c := tls.Client(raw, &tls.Config{ServerName: a[1]})
		c.SetDeadline(time.Now().Add(5 * time.Second))
		check(c.Handshake())
		fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", a[3], a[2], a[1])
		if auth := os.ExpandEnv(a[4]); auth != "" {
			fmt.Fprintf(c, "Authorization: %s\r\n", auth)
		}
		fmt.Fprint(c, "\r\n")
		readAll(c)
	case "httpauth": // httpauth ADDR HOST PATH AUTH: plaintext request with Authorization ($VARS expanded)
		c := dial(a[0])
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nConnection: close\r\n\r\n", a[2], a[1], os.ExpandEnv(a[3]))
		readAll(c)
	case "bench": // bench ADDR SNI N MIB tls|plain: N sequential connections (connect, handshake, one small GET), then one GET of MIB MiB
		bench(a[0], a[1], a[2], a[3], a[4] == "tls")
	case "keepalive": // keepalive ADDR HOST1 PATH1 HOST2 PATH2: two requests on one connection
		c := dial(a[0])
		br := bufio.NewReader(c)
		for i := 0; i < 2; i++ {
			req, _ := http.NewRequest("GET", "http://"+a[1+2*i]+a[2+2*i], nil)
			check(req.Write(c))
			resp, err := http.ReadResponse(br, req)
			check(err)
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			fmt.Printf("RESP%d %d %s\n", i+1, resp.StatusCode, b)
		}
		fmt.Println("OK")
	case "raw": // raw ADDR DATA: DATA (Go escapes such as \r\n interpreted) on one TCP connection, then read
		data, err := strconv.Unquote(`"` + a[1] + `"`)
		check(err)
		c := dial(a[0])
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = io.WriteString(c, data)
		check(err)
		readAll(c)
	case "rawtls": // rawtls ADDR SNI DATA: as raw, inside TLS (certificate not checked)
		data, err := strconv.Unquote(`"` + a[2] + `"`)
		check(err)
		c := tls.Client(dial(a[0]), &tls.Config{ServerName: a[1], InsecureSkipVerify: true})
		c.SetDeadline(time.Now().Add(5 * time.Second))
		check(c.Handshake())
		_, err = io.WriteString(c, data)
		check(err)
		readAll(c)
	case "dnsvia": // dnsvia udp|tcp SERVER NAME: resolve NAME asking SERVER (host:port) directly
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, a[0]+"4", a[1])
		}}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		ips, err := r.LookupIPAddr(ctx, a[2])
		check(err)
		fmt.Println("OK", ips)
	case "udp": // udp ADDR PAYLOAD
		c, err := net.Dial("udp4", a[0])
		check(err)
		_, err = c.Write([]byte(a[1]))
		check(err)
		fmt.Println("OK sent")
	case "udps": // udps PAYLOAD ADDR...: one datagram to each (broadcast allowed)
		for _, to := range a[1:] {
			network := "udp4"
			if strings.HasPrefix(to, "[") {
				network = "udp6"
			}
			ua, err := net.ResolveUDPAddr(network, to)
			if err != nil {
				fmt.Println("ERR", to, err)
				continue
			}
			c, err := net.ListenUDP(network, nil)
			if err == nil {
				if rc, e := c.SyscallConn(); e == nil {
					rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_BROADCAST, 1) })
				}
				_, err = c.WriteToUDP([]byte(a[0]), ua)
				c.Close()
			}
			fmt.Println("sent", to, err)
		}
		fmt.Println("OK")
	case "tlsauth": // tlsauth ADDR SNI HOST PATH AUTH: TLS without certificate checks, Authorization ($VARS expanded)
		c := tls.Client(dial(a[0]), &tls.Config{ServerName: a[1], InsecureSkipVerify: true})
		c.SetDeadline(time.Now().Add(5 * time.Second))
		check(c.Handshake())
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nConnection: close\r\n\r\n", a[3], a[2], os.ExpandEnv(a[4]))
		readAll(c)
	case "httpm": // httpm ADDR HOST PATH METHOD BODY: verified TLS, any method, a body
		c := tls.Client(dial(a[0]), &tls.Config{ServerName: a[1]})
		c.SetDeadline(time.Now().Add(5 * time.Second))
		check(c.Handshake())
		fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", a[3], a[2], a[1], len(a[4]), a[4])
		readAll(c)
	case "icmp": // icmp ADDR... PAYLOAD
		icmpEcho(a[:len(a)-1], a[len(a)-1])
	case "proto": // proto ADDR PAYLOAD
		protos(a[0], a[1])
	case "frag": // frag ADDR PAYLOAD
		frags(a[0], a[1])
	case "spoof": // spoof SRC ADDR PAYLOAD
		spoof(a[0], a[1], a[2])
	case "route": // route ADDR PAYLOAD
		routes(a[0], a[1])
	case "v6": // v6 PAYLOAD
		v6(a[0])
	case "proxyget": // proxyget URL: GET through the proxy the environment names (HTTP_PROXY, HTTPS_PROXY), TLS verified against the trust store
		cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyFromEnvironment},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := cl.Get(a[0])
		check(err)
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		fmt.Printf("STATUS %d reason=%s %s\n", resp.StatusCode, resp.Header.Get("X-Space-Egress-Reason"), strings.TrimSpace(string(b)))
	case "connect": // connect PROXY AUTHORITY SNI HOST PATH: CONNECT AUTHORITY through PROXY (host:port), then TLS with SNI (certificate not checked) and one GET
		c := dial(a[0])
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", a[1], a[1])
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		check(err)
		if resp.StatusCode != http.StatusOK {
			fail(fmt.Sprintf("proxy %s reason=%s", resp.Status, resp.Header.Get("X-Space-Egress-Reason")))
		}
		tc := tls.Client(c, &tls.Config{ServerName: a[2], InsecureSkipVerify: true})
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		check(tc.Handshake())
		fmt.Fprintf(tc, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", a[4], a[3])
		readAll(tc)
	case "mac": // mac MAC ADDR PAYLOAD
		macChange(a[0], a[1], a[2])
	case "loop": // loop: a TCP exchange over the sandbox's own loopback (the blocked mode's positive control)
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		check(err)
		go func() {
			if c, err := ln.Accept(); err == nil {
				io.WriteString(c, "loopback ok")
				c.Close()
			}
		}()
		readAll(dial(ln.Addr().String()))
	case "listen": // listen ADDR LOGFILE REPLY: accept forever, append what each connection sent to LOGFILE, answer REPLY
		ln, err := net.Listen("tcp4", a[0])
		check(err)
		fmt.Println("OK listening")
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(3 * time.Second))
				b := make([]byte, 2048)
				n, _ := c.Read(b)
				if f, err := os.OpenFile(a[1], os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
					fmt.Fprintf(f, "from %s: %q\n", c.RemoteAddr(), b[:n])
					f.Close()
				}
				io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\n"+a[2]+"\n")
			}()
		}
	case "flood": // flood ADDR N: hold N connections open at once
		n, _ := strconv.Atoi(a[1])
		var wg sync.WaitGroup
		var mu sync.Mutex
		refused := 0
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := net.DialTimeout("tcp4", a[0], 3*time.Second)
				if err != nil {
					mu.Lock()
					refused++
					mu.Unlock()
					return
				}
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
					mu.Lock()
					refused++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		fmt.Println("OK refused", refused)
	default:
		fail("unknown verb " + os.Args[1])
	}
}

func bench(addr, name, nStr, mibStr string, useTLS bool) {
	n, _ := strconv.Atoi(nStr)
	mib, _ := strconv.Atoi(mibStr)
	host, port, err := net.SplitHostPort(addr)
	check(err)
	if ips, err := net.LookupHost(host); err == nil && len(ips) > 0 {
		addr = net.JoinHostPort(ips[0], port) // resolve once: measure connections, not DNS
	} else {
		check(err)
	}
	get := func(path string, sink io.Writer) (int64, time.Duration) {
		t0 := time.Now()
		var c net.Conn = dial(addr)
		c.SetDeadline(time.Now().Add(60 * time.Second))
		if useTLS {
			tc := tls.Client(c, &tls.Config{ServerName: name, InsecureSkipVerify: true})
			check(tc.Handshake())
			c = tc
		}
		defer c.Close()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, name)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		check(err)
		nb, err := io.Copy(sink, resp.Body)
		check(err)
		return nb, time.Since(t0)
	}
	lat := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		_, d := get("/simple/", io.Discard)
		lat = append(lat, d)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	nb, d := get("/blob/"+strconv.Itoa(mib), io.Discard)
	fmt.Printf("OK p50_us=%d p90_us=%d mib_s=%.0f bytes=%d\n", lat[n/2].Microseconds(), lat[n*9/10].Microseconds(),
		float64(nb)/(1<<20)/d.Seconds(), nb)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// dialNet is what dial uses: tcp4, or tcp6 for the *6 commands.
var dialNet = "tcp4"

func dial(addr string) net.Conn {
	c, err := net.DialTimeout(dialNet, addr, 5*time.Second)
	check(err)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return c
}

func readAll(r io.Reader) {
	b, err := io.ReadAll(io.LimitReader(r, 64<<10))
	if len(b) == 0 && err != nil {
		fail(err.Error())
	}
	fmt.Println("OK", strings.ReplaceAll(string(b), "\r\n", " | "))
}

func check(err error) {
	if err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Println("ERR", msg)
	os.Exit(1)
}
