package main

import (
	"context"
	"fmt"
	"time"

	"github.com/space-sandbox/space/internal/version"
	"github.com/space-sandbox/space/pkg/client"
)

// runHealth asks the control API's /healthz, the one route that needs no
// API key, so that a probe holding none can run it: the Helm chart's `helm
// test` pod does (the image's busybox wget crashes as a non-root user).
// Exit 0 when the server answers 200.
func runHealth(args []string) error {
	fs, cl := newClientFlags("health")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("usage: space health [--url URL] [--timeout 10s] [--json]")
	}
	cl.resolve()
	c := client.New(cl.url, cl.apiKey, client.WithUserAgent("space-cli/"+version.Version))
	sctx, stop := signalContext()
	defer stop()
	ctx, cancel := context.WithTimeout(sctx, *timeout)
	defer cancel()
	if err := c.Health(ctx); err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(map[string]string{"url": cl.url, "status": "ok"})
	}
	fmt.Fprintf(cl.out, "%s: ok\n", cl.url)
	return nil
}
