package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"

	"github.com/space-sandbox/space/internal/version"
	"github.com/space-sandbox/space/pkg/client"
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
	if msg := explain(err); msg != "" {
		fmt.Fprintln(os.Stderr, "space:", msg)
	}
	return code
}

// explain is err's message, with what to do where the raw error would not
// say: an unreachable server (named once, not the request URL twice as
// net/http words it), a build step that needed the network.
func explain(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		where := ue.URL
		if u, perr := url.Parse(ue.URL); perr == nil {
			where = u.Scheme + "://" + u.Host
		}
		var dnsErr *net.DNSError
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			return fmt.Sprintf("cannot connect to %s (connection refused): is the server running? (space server; or set SPACE_URL or --url to where it listens)", where)
		case errors.As(err, &dnsErr):
			return fmt.Sprintf("cannot resolve %s (%v): check SPACE_URL or --url", where, dnsErr)
		case ue.Timeout():
			return fmt.Sprintf("%s did not answer in time: is the server overloaded or behind a firewall?", where)
		}
		return fmt.Sprintf("cannot reach %s: %v", where, ue.Err)
	}
	msg := err.Error()
	var oe *client.OperationError
	if errors.As(err, &oe) && oe.Operation.Error != nil && strings.HasPrefix(oe.Operation.Kind, "template") {
		m := oe.Operation.Error.Message
		switch {
		case strings.Contains(m, "(RUN ") && strings.Contains(m, "exited with code"):
			msg += "\nhint: RUN steps run with no network (a blocked policy): COPY what they need from the build context, " +
				"or start FROM an image that has it (docs/templates.md); space template logs " + oe.Operation.ID + " prints every step's full log"
		case strings.Contains(m, "no such host") || strings.Contains(m, "connection refused") || strings.Contains(m, "i/o timeout"):
			msg += "\nhint: the server could not reach the image registry: check the server machine's DNS and network " +
				"(registries on private addresses also need space server --allow-private-registries)"
		}
	}
	return msg
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
		si := out["server"].(client.ServerInfo)
		fmt.Fprintf(cl.out, "server: %s, driver %s\n", version.Info{Version: si.Version, Commit: si.Commit}, si.Driver)
	}
	return nil
}

// silentError ends the process with status 1 after the command has
// reported the details itself; main prints only its summary.
type silentError struct{ summary string }

func (e silentError) Error() string { return e.summary }
