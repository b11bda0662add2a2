package node

import (
	"context"
	"log/slog"
)

// logOOM records a command the kernel's OOM killer ended (the sandbox's
// cgroup counted kills, now in all, while it ran): the program, never its
// arguments, which may hold anything.
func (s *Sandbox) logOOM(c *Command, kills uint64) {
	prog := ""
	if len(c.Info.Argv) > 0 {
		prog = c.Info.Argv[0]
		if len(prog) > 128 {
			prog = prog[:128]
		}
	}
	s.node.o.Logger.LogAttrs(context.Background(), slog.LevelWarn, "command killed by the OOM killer",
		slog.String("sandbox", s.ID), slog.String("command", c.Info.ID), slog.String("program", prog),
		slog.Int("pid", c.Info.PID), slog.Uint64("oom_kills", kills))
}
