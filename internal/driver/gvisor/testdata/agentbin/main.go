// Command agentbin stands in for `space agent --listen PATH` in the gvisor
// driver's tests: the real agent's handler on a listener that can be
// released for a checkpoint (agentlisten).
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/driver/gvisor/agentlisten"
	"github.com/space-sandbox/space/internal/driver/gvisor/agentpids"
)

func main() {
	args := os.Args[1:]
	if len(args) != 3 || args[0] != "agent" || args[1] != "--listen" {
		fmt.Fprintln(os.Stderr, "usage: agentbin agent --listen PATH")
		os.Exit(2)
	}
	l, err := agentlisten.Listen(args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var opts agent.Options
	g, err := agentpids.FromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "no in-sandbox pids limit:", err)
		g = nil
	}
	if g != nil {
		opts.ProcAttr = g.ProcAttr
	}
	ctx := context.Background()
	agent.StartReaper(ctx)
	srv := &http.Server{
		Handler:           l.Handler(g.Handler(agent.NewServer(opts).Handler())),
		ReadHeaderTimeout: 30 * time.Second,
	}
	if err := srv.Serve(l); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
