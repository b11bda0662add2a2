package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// sandboxPorts lists the ports something listens on inside a sandbox, or
// with --wait waits for one.
func sandboxPorts(args []string) error {
	fs, cl := newClientFlags("sandbox ports")
	wait := fs.Int("wait", 0, "wait until something listens on this port, then list")
	timeout := durationVar(fs, "timeout", time.Minute, "with --wait: give up after this long")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "ID [--wait PORT] [--timeout 1m]"); err != nil {
		return err
	}
	if *wait < 0 || *wait > 65535 {
		return usagef("--wait must be a port, 1-65535")
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	sc, err := c.Connect(ctx, pos[0])
	if err != nil {
		return err
	}
	if *wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, *timeout)
		_, err := sc.WaitForPort(wctx, *wait)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return fmt.Errorf("nothing listened on port %d of %s within %s", *wait, pos[0], *timeout)
		}
		if err != nil {
			return err
		}
	}
	ports, err := sc.ListPorts(ctx)
	if err != nil {
		return err
	}
	if cl.json {
		if ports == nil {
			ports = []client.Port{}
		}
		return cl.printJSON(map[string]any{"ports": ports})
	}
	tw := tabwriter.NewWriter(cl.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PORT\tADDRESS\tFAMILY\tURL")
	for _, p := range ports {
		u := p.URL
		if u == "" {
			u, _ = sc.PortURL(p.Port)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", p.Port, p.Address, p.Family, u)
	}
	return tw.Flush()
}

// sandboxURL prints the URL of a sandbox's port: as built from a session
// (the session token must come with each request unless the sandbox has
// public ports) or, with --signed, a signed URL that opens the port alone.
func sandboxURL(args []string) error {
	fs, cl := newClientFlags("sandbox url")
	signed := fs.Bool("signed", false, "a URL carrying a port token: opens this port (only) with no other credential")
	ttl := durationVar(fs, "ttl", time.Hour, "with --signed: how long the URL works (at most 168h)")
	path := fs.Bool("path", false, "the path form under the data plane URL (no wildcard DNS needed) instead of PORT-ID.DOMAIN")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 2, "ID PORT [--signed [--ttl 1h]] [--path]"); err != nil {
		return err
	}
	port, err := strconv.Atoi(pos[1])
	if err != nil || port < 1 || port > 65535 {
		return usagef("PORT must be 1-65535, not %q", pos[1])
	}
	if *ttl < time.Second || *ttl > 7*24*time.Hour {
		return usagef("--ttl must be between 1s and 168h")
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	if *signed {
		s, err := c.SignedPortURL(ctx, pos[0], port, *ttl)
		if err != nil {
			return err
		}
		if cl.json {
			return cl.printJSON(s)
		}
		if *path {
			fmt.Fprintln(cl.out, s.PathURL)
		} else {
			fmt.Fprintln(cl.out, s.URL)
		}
		return nil
	}
	sc, err := c.Connect(ctx, pos[0])
	if err != nil {
		return err
	}
	host, err := sc.PortURL(port)
	if err != nil {
		return err
	}
	pathURL, err := sc.PortPathURL(port)
	if err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(map[string]string{"url": host, "path_url": pathURL})
	}
	if *path {
		fmt.Fprintln(cl.out, pathURL)
	} else {
		fmt.Fprintln(cl.out, host)
	}
	// Without public ports the URL answers 401 to a bare request: say
	// what opens it (on a terminal only, so scripts get the URL alone).
	if isTerminal(os.Stderr) {
		if sb, err := c.GetSandbox(ctx, pos[0]); err == nil && !sb.PublicPorts {
			fmt.Fprintf(cl.errOut, "(private: send X-Access-Token: $(space sandbox session %s), or use --signed for a browser)\n", pos[0])
		}
	}
	return nil
}
