// Package agentcmd is `space agent`: the in-sandbox daemon's command line,
// shared by the `space` binary and the slim `space-agent` binary that the
// node runs inside sandboxes (it links only what the agent needs, so it
// starts faster and uses less memory than the whole server).
package agentcmd

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/driver/gvisor/agentlisten"
	"github.com/space-sandbox/space/internal/driver/gvisor/agentpids"
	"github.com/space-sandbox/space/internal/driver/namespace/agenthandoff"
	"github.com/space-sandbox/space/internal/fdhygiene"
	"github.com/space-sandbox/space/internal/sandboxinit"
	"github.com/space-sandbox/space/internal/spawner"
)

// runAgent runs the in-sandbox daemon. With --init it is a sandbox's PID 1,
// started by the namespace driver with the listener on a fixed descriptor;
// with --listen it serves on a unix socket (for development and tests).
// Run runs `space agent ARGS`; version is reported by the agent.
func Run(args []string, version string) error {
	// --spawner: not an agent but the namespace driver's fork helper on the
	// host (internal/spawner), on the socket it got as fd 3.
	if len(args) > 0 && args[0] == "--spawner" {
		if _, err := fdhygiene.CloseStrays(spawner.HelperFD); err != nil {
			return fmt.Errorf("spawner: close inherited descriptors: %w", err)
		}
		return spawner.Serve(spawner.HelperFD)
	}
	// Whatever the host process leaked to us (a descriptor it inherited
	// without close-on-exec) must not reach PID 1's /proc/1/fd or any
	// command. Only the descriptors the driver passes on purpose stay.
	// In a VM (--vm) the guest kernel started us: no host descriptor can
	// reach us, and /proc is not mounted yet.
	var keep []int
	if len(args) > 0 && args[0] == "--init" {
		keep = []int{sandboxinit.ListenerFD, sandboxinit.SyncFD, sandboxinit.StatusFD, sandboxinit.AgentFD}
	}
	if len(args) == 0 || args[0] != "--vm" {
		if closed, err := fdhygiene.CloseStrays(keep...); err != nil {
			return fmt.Errorf("agent: close inherited descriptors: %w", err)
		} else if len(closed) > 0 {
			fmt.Fprintf(os.Stderr, "agent: closed inherited descriptors %v\n", closed)
		}
	}
	if len(args) > 0 && args[0] == "--init" {
		cfg, err := sandboxinit.ParseArgs(args[1:])
		if err != nil {
			return err
		}
		ctx := context.Background()
		logf := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "agent: "+format+"\n", a...) }
		return sandboxinit.Run(ctx, cfg, sandboxinit.Hooks{
			Harden: agent.HardenSelf,
			Serve: func(ctx context.Context, l net.Listener) error {
				// A listener the driver can take back for a CRIU dump
				// and hand in again (package agenthandoff).
				hl := agenthandoff.New(l)
				agent.StartReaper(ctx)
				return agent.NewServer(agent.Options{Version: version, Wrap: hl.Handler}).Serve(ctx, hl)
			},
			Logf: logf,
		})
	}
	if len(args) > 0 && args[0] == "--vm" {
		return runVM(args[1:], version)
	}
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	sock := fs.String("listen", "", "unix socket path to serve on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *sock == "" {
		return fmt.Errorf("usage: space agent --listen PATH (the node starts it with --init)")
	}
	// A listener the agent can release and reopen, so a gVisor sandbox
	// (which cannot save a listening host socket) can be checkpointed.
	l, err := agentlisten.Listen(*sock)
	if err != nil {
		return err
	}
	// gVisor: the commands' cgroup in the Sentry's cgroupfs, where the
	// sandbox's pids limit is enforced (the driver names the mount in the
	// agent's environment and sets pids.max through agentpids.Path).
	// Without one commands run unlimited inside and the route says so.
	opts := agent.Options{Version: version}
	g, err := agentpids.FromEnv()
	if err != nil {
		fmt.Fprintf(os.Stderr, "agent: no in-sandbox pids limit: %v\n", err)
		g = nil
	}
	if g != nil {
		opts.ProcAttr = g.ProcAttr
	}
	opts.Wrap = func(h http.Handler) http.Handler { return l.Handler(g.Handler(h)) }
	// Fail closed: a gVisor sandbox whose agent is not guarded does not serve.
	if err := agent.HardenGVisor(); err != nil {
		_ = l.Close()
		return fmt.Errorf("harden: %w", err)
	}
	ctx := context.Background()
	agent.StartReaper(ctx)
	return agent.NewServer(opts).Serve(ctx, l)
}
