package main

import (
	"github.com/space-sandbox/space/internal/agentcmd"
	"github.com/space-sandbox/space/internal/version"
)

// runAgent is `space agent`; the node prefers the slim space-agent binary
// (cmd/space-agent) inside sandboxes and falls back to this one.
func runAgent(args []string) error { return agentcmd.Run(args, version.Version) }
