package main

import (
	"errors"
	"fmt"
	"os"
)

// Exit statuses scripts can rely on (docs/cli.md): 0 success, 1 an error
// (the server's, the network's, a failed operation), 2 a usage error (bad
// flags or arguments), and for `space sandbox exec` the remote command's own
// status (128+N when killed by signal N, 127 when it could not start, 130
// after detaching with a second Ctrl-C).
const (
	exitError = 1
	exitUsage = 2
)

// exitCoder is an error that chooses the process's exit status.
type exitCoder interface{ ExitCode() int }

// reportError prints err on stderr and returns the status to exit with.
func reportError(err error) int {
	var ee execExit
	if errors.As(err, &ee) {
		ee.report()
		return ee.ExitCode()
	}
	code := exitError
	var ec exitCoder
	if errors.As(err, &ec) {
		code = ec.ExitCode()
	}
	if msg := err.Error(); msg != "" {
		fmt.Fprintln(os.Stderr, "space:", msg)
	}
	return code
}

// runVersion prints the version, as {"version": …} with --json.
func runVersion(args []string) error {
	switch {
	case len(args) == 0:
		fmt.Println(version)
	case len(args) == 1 && (args[0] == "--json" || args[0] == "-json"):
		return printJSONTo(os.Stdout, map[string]string{"version": version})
	default:
		return usagef("usage: space version [--json]")
	}
	return nil
}
