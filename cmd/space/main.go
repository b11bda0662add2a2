// Command space is SPACE's single binary: the server, the in-sandbox agent
// and the client verbs. main only dispatches; the work lives in internal/.
package main

import (
	"fmt"
	"os"
)

type command struct {
	name, usage string
	run         func(args []string) error
}

func commands() []command {
	return []command{
		{"server", "run the control API, data plane and in-process node", runServer},
		{"node", "run a node for servers started with --remote-nodes (scale-out)", runNode},
		{"agent", "in-sandbox daemon (started by the node as a sandbox's PID 1)", runAgent},
		{"keys", "manage API keys on this machine: create|list|revoke", runKeys},
		{"certs", "node link certificates from a small CA: init|issue", runCerts},
		{"credentials", "the credential store replicas share: rewrap (after a key rotation)", runCredentials},
		{"sandbox", "sandboxes: create|list|get|exec|logs|cp|pause|resume|hibernate|rm", runSandbox},
		{"snapshot", "snapshots: create|list|get|rm|fork", runSnapshot},
		{"logs", "a sandbox's command output (space sandbox logs)", runLogs},
		{"template", "templates: list|build", runTemplate},
		{"ops", "operations: get|watch", runOps},
		{"doctor", "report what this host offers (KVM, runsc, cgroups, nftables, quotas, …) and the driver auto picks", runDoctor},
		{"bench", "measure the namespace driver (see docs/PERFORMANCE.md)", runBench},
		{"completion", "print a shell completion script: bash|zsh|fish", runCompletion},
		{"version", "print the version (--json: as JSON)", runVersion},
	}
}

const version = "0.1.0"

func usage() {
	fmt.Fprintln(os.Stderr, "usage: space <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(os.Stderr, "  %-9s %s\n", c.name, c.usage)
	}
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(exitUsage)
	}
	for _, c := range commands() {
		if c.name == os.Args[1] {
			if err := c.run(os.Args[2:]); err != nil {
				os.Exit(reportError(err))
			}
			return
		}
	}
	if os.Args[1] == "help" || os.Args[1] == "-h" || os.Args[1] == "--help" {
		usage()
		return
	}
	fmt.Fprintf(os.Stderr, "space: unknown command %q\n", os.Args[1])
	usage()
	os.Exit(exitUsage)
}
