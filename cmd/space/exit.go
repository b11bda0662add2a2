package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/space-sandbox/space/internal/version"
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

// runVersion prints the version and commit, as {"version", "commit"} with
// --json; --server also asks the server (GET /v1/info) which build it runs.
func runVersion(args []string) error {
	fs, cl := newClientFlags("version")
	server := fs.Bool("server", false, "also show the server's version and commit (GET /v1/info)")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("usage: space version [--json] [--server]")
	}
	out := map[string]any{"client": version.Get()}
	if *server {
		c, err := cl.client()
		if err != nil {
			return err
		}
		ctx, stop := signalContext()
		defer stop()
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		out["server"] = info
	}
	if cl.json {
		if !*server {
			return cl.printJSON(version.Get())
		}
		return cl.printJSON(out)
	}
	fmt.Fprintln(cl.out, version.Get())
	if *server {
		fmt.Fprintf(cl.out, "server: %s\n", out["server"])
	}
	return nil
}
