// Command space-agent is the in-sandbox daemon alone: the same code as
// `space agent`, in a binary that links only the agent, so every sandbox's
// PID 1 starts faster and holds less memory than the full server binary.
// The node runs it as "space-agent agent ARGS", like "space agent ARGS".
package main

import (
	"fmt"
	"os"

	"github.com/space-sandbox/space/internal/agentcmd"
)

// version matches the space binary built from the same tree.
const version = "0.1.0"

func main() {
	if len(os.Args) < 2 || os.Args[1] != "agent" {
		fmt.Fprintln(os.Stderr, "usage: space-agent agent [--init ...|--listen PATH|--vm ...]")
		os.Exit(2)
	}
	if err := agentcmd.Run(os.Args[2:], version); err != nil {
		fmt.Fprintln(os.Stderr, "space-agent:", err)
		os.Exit(1)
	}
}
