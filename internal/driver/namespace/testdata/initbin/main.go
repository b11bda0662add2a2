// Command initbin stands in for `space agent --init` in the namespace
// driver's tests: sandboxinit plus the real agent server.
package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/driver/namespace/agenthandoff"
	"github.com/space-sandbox/space/internal/sandboxinit"
	"github.com/space-sandbox/space/internal/spawner"
)

func main() {
	args := os.Args[1:]
	if len(args) == 2 && args[0] == "agent" && args[1] == "--spawner" {
		if err := spawner.Serve(spawner.HelperFD); err != nil {
			fmt.Fprintln(os.Stderr, "spawner:", err)
			os.Exit(1)
		}
		return
	}
	if len(args) < 2 || args[0] != "agent" || args[1] != "--init" {
		fmt.Fprintln(os.Stderr, "usage: initbin agent --init FLAGS")
		os.Exit(2)
	}
	cfg, err := sandboxinit.ParseArgs(args[2:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	err = sandboxinit.Run(context.Background(), cfg, sandboxinit.Hooks{
		Harden: agent.HardenSelf,
		Serve: func(ctx context.Context, l net.Listener) error {
			hl := agenthandoff.New(l)
			agent.StartReaper(ctx)
			return agent.NewServer(agent.Options{Wrap: hl.Handler}).Serve(ctx, hl)
		},
		Logf: log.Printf,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		os.Exit(1)
	}
}
