// Command space is SPACE's single binary: the server, the in-sandbox agent
// and the client verbs. main only dispatches; the work lives in internal/.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
)

type command struct {
	name, usage string
	run         func(args []string) error
}

func commands() []command {
	return []command{
		{"server", "run the control API, data plane and in-process node", runServer},
		{"node", "run a node for servers started with --remote-nodes (scale-out)", runNode},
		{"operator", "serve the Kubernetes agent-sandbox API (Sandbox, SandboxClaim, …) with SPACE sandboxes", runOperator},
		{"agent", "in-sandbox daemon (started by the node as a sandbox's PID 1)", runAgent},
		{"keys", "API keys, on the server machine: create|list|revoke|help", runKeys},
		{"certs", "node link certificates from a small CA: init|issue", runCerts},
		{"credentials", "the credential store replicas share: rewrap (after a key rotation)", runCredentials},
		{"sandbox", "sandboxes: create|list|get|exec|logs|cp|ports|url|session|timeout|network|netlog|metrics|pause|resume|hibernate|rm", runSandbox},
		{"snapshot", "snapshots: create|list|get|rm|fork", runSnapshot},
		{"logs", "a sandbox's command output (space sandbox logs)", runLogs},
		{"template", "templates: list|get|build|tag|delete|logs|gc", runTemplate},
		{"ops", "operations: get|watch", runOps},
		{"events", "follow the project's lifecycle events: operations and sandbox states (like docker events)", runEvents},
		{"doctor", "report what this host offers (KVM, runsc, cgroups, nftables, quotas, …) and the driver auto picks", runDoctor},
		{"bench", "measure the namespace driver (see docs/PERFORMANCE.md)", runBench},
		{"completion", "print a shell completion script: bash|zsh|fish", runCompletion},
		{"version", "print the version and commit (--json: as JSON)", runVersion},
		{"health", "check that the server answers (GET /healthz; no API key needed)", runHealth},
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: space <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.usage)
	}
	fmt.Fprintln(w, "\n`space <command> help` lists a command's verbs, `space <command> <verb> -h` its flags.\n"+
		"Client commands read SPACE_URL and SPACE_API_KEY; docs/cli.md has the details.")
}

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(exitUsage)
	}
	for _, c := range commands() {
		if c.name == os.Args[1] {
			stop := cpuProfile(os.Getenv("SPACE_CPU_PROFILE"))
			stopAllocs := allocProfile(os.Getenv("SPACE_ALLOC_PROFILE"))
			err := c.run(os.Args[2:])
			stopAllocs()
			stop()
			if err != nil {
				os.Exit(reportError(err))
			}
			return
		}
	}
	if os.Args[1] == "help" || os.Args[1] == "-h" || os.Args[1] == "--help" {
		if len(os.Args) > 2 { // space help sandbox = space sandbox help
			for _, c := range commands() {
				if c.name == os.Args[2] {
					if err := c.run(append([]string{"help"}, os.Args[3:]...)); err != nil {
						os.Exit(reportError(err))
					}
					return
				}
			}
		}
		usage(os.Stdout)
		return
	}
	fmt.Fprintf(os.Stderr, "space: unknown command %q\n", os.Args[1])
	usage(os.Stderr)
	os.Exit(exitUsage)
}

// allocProfile writes the allocations the whole command made (every
// 512 KiB allocated, sampled, as `go tool pprof -sample_index
// alloc_space` reads them) to path when the returned function runs
// (SPACE_ALLOC_PROFILE).
func allocProfile(path string) func() {
	if path == "" {
		return func() {}
	}
	return func() {
		f, err := os.Create(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "space: SPACE_ALLOC_PROFILE: %v\n", err)
			return
		}
		defer f.Close()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			fmt.Fprintf(os.Stderr, "space: SPACE_ALLOC_PROFILE: %v\n", err)
		}
	}
}

// cpuProfile writes a CPU profile of the whole command to path until the
// returned function runs (SPACE_CPU_PROFILE: `space bench --fleet
// --fleet-profile` profiles its servers and nodes this way).
func cpuProfile(path string) func() {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "space: SPACE_CPU_PROFILE: %v\n", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(os.Stderr, "space: SPACE_CPU_PROFILE: %v\n", err)
		f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}
