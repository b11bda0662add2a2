package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unsafe"

	"github.com/space-sandbox/space/internal/template"
	"github.com/space-sandbox/space/internal/version"
	"github.com/space-sandbox/space/pkg/client"
)

// clientCLI holds what every client verb shares: where the server is, the
// API key and the output format.
type clientCLI struct {
	url, apiKey string
	json        bool
	out, errOut io.Writer
}

// newClientFlags returns a flag set with the flags every client verb takes.
func newClientFlags(name string) (*flag.FlagSet, *clientCLI) {
	c := &clientCLI{out: os.Stdout, errOut: os.Stderr}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// The defaults shown by -h and after a flag error are constants: the
	// environment is read only when the client is made, so neither the
	// key nor a URL with credentials in it ever reaches a help text.
	fs.StringVar(&c.url, "url", "", "control API URL (default $SPACE_URL, else "+defaultURL+")")
	fs.StringVar(&c.apiKey, "api-key", "", "API key (default $SPACE_API_KEY; prefer the variable: a flag shows in ps)")
	fs.BoolVar(&c.json, "json", false, "print JSON instead of tables")
	return fs, c
}

const defaultURL = "http://127.0.0.1:7070"

// resolve fills the URL and key from the environment when no flag gave them.
func (c *clientCLI) resolve() {
	if c.url == "" {
		c.url = cmp.Or(os.Getenv("SPACE_URL"), defaultURL)
	}
	if c.apiKey == "" {
		c.apiKey = os.Getenv("SPACE_API_KEY")
	}
}

func (c *clientCLI) client() (*client.Client, error) {
	c.resolve()
	if c.apiKey == "" {
		return nil, errors.New("no API key: set SPACE_API_KEY (or pass --api-key); create one with `space keys create --data-dir DIR` on the server machine")
	}
	return client.New(c.url, c.apiKey, client.WithUserAgent("space-cli/"+version.Version)), nil
}

// connect returns the API client and a context cancelled by SIGINT or
// SIGTERM; call stop when done.
func (c *clientCLI) connect() (*client.Client, context.Context, context.CancelFunc, error) {
	api, err := c.client()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, stop := signalContext()
	return api, ctx, stop, nil
}

func (c *clientCLI) printJSON(v any) error { return printJSONTo(c.out, v) }

// printJSONTo writes v as indented JSON.
func printJSONTo(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// parseClientArgs parses flags placed before, between or after positional
// arguments (Go's flag package stops at the first positional one).
func parseClientArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			if len(pos) == 1 && pos[0] == "help" { // space logs help, as -h
				printFlags(fs)
				os.Exit(0)
			}
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// parseFlags parses args the same way for every verb: -h/--help prints the
// flags on stdout and exits 0; a bad flag is a usage error (exit 2) that
// names the flag and where to look, without the whole flag list (which
// buried the error) and without any default read from the environment.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	if err == nil {
		return nil
	}
	if errors.Is(err, flag.ErrHelp) {
		printFlags(fs)
		os.Exit(0)
	}
	return usagef("%v\n(space %s -h lists its flags)", err, fs.Name())
}

// noArgs refuses positional arguments to a command that takes none (a
// server must not start on `space server help`); "help" prints the flags.
func noArgs(fs *flag.FlagSet) error {
	switch {
	case fs.NArg() == 0:
		return nil
	case fs.NArg() == 1 && fs.Arg(0) == "help":
		printFlags(fs)
		os.Exit(0)
	}
	return usagef("space %s takes no arguments, got %q\n(space %s -h lists its flags)", fs.Name(), fs.Args(), fs.Name())
}

// printFlags prints a verb's flags on stdout.
func printFlags(fs *flag.FlagSet) {
	fs.SetOutput(os.Stdout)
	defer fs.SetOutput(io.Discard)
	fmt.Printf("usage: space %s [flags]\n\nflags:\n", fs.Name())
	fs.PrintDefaults()
}

func wantArgs(fs *flag.FlagSet, pos []string, n int, usage string) error {
	if len(pos) != n {
		return usagef("usage: space %s %s", fs.Name(), usage)
	}
	return nil
}

// signalContext is cancelled by SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// kvFlag collects repeated K=V flags.
type kvFlag map[string]string

func (m kvFlag) String() string { return "" }

func (m kvFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	m[k] = v
	return nil
}

// listFlag collects repeated or comma-separated values.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// parseByteSize reads sizes like 512M, 2G, 1.5Gi or 1048576; K, M, G and T
// are powers of 1024, as in docker and kubectl's Mi/Gi.
func parseByteSize(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:n-1]
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || f*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("bad size %q (want e.g. 512M or 2G)", s)
	}
	return int64(f * float64(mult)), nil
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTP"[exp])
}

func humanAge(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t)
	if d < 0 {
		return "in " + (-d).Round(time.Second).String()
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func joinKV(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + m[k]
	}
	return strings.Join(keys, ",")
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressPrinter shows an operation's progress on stderr: one line
// rewritten in place on a terminal, one line per change otherwise.
type progressPrinter struct {
	w    io.Writer
	tty  bool
	last string
}

func newProgressPrinter() *progressPrinter {
	return &progressPrinter{w: os.Stderr, tty: isTerminal(os.Stderr)}
}

func (p *progressPrinter) update(op client.Operation) {
	line := fmt.Sprintf("%s %s: %s %d%%", op.Kind, op.Target, op.State, op.Progress)
	if op.Message != "" {
		line += " " + op.Message
	}
	if line == p.last {
		return
	}
	p.last = line
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}

func (p *progressPrinter) done() {
	if p.tty && p.last != "" {
		fmt.Fprintln(p.w)
	}
}

// watch follows an operation, falling back to long-polling if the event
// stream is unavailable (a proxy that buffers SSE, say).
func (p *progressPrinter) watch(ctx context.Context, c *client.Client, id string) (client.Operation, error) {
	defer p.done()
	op, err := c.WatchOperation(ctx, id, p.update)
	var oe *client.OperationError
	if err == nil || errors.As(err, &oe) || ctx.Err() != nil {
		return op, err
	}
	var ae *client.APIError
	if errors.As(err, &ae) && ae.Status < 500 {
		return op, err
	}
	return c.WaitOperation(ctx, id)
}

const sandboxUsage = `usage: space sandbox <verb> [flags]

verbs:
  create [--template base] [--env K=V]... [--metadata K=V]... [--memory 512M] [--cpus 1.5]
         [--pids N] [--disk 1G] [--timeout 15m] [--on-timeout delete|hibernate]
         [--auto-pause 10m] [--auto-resume] [--network blocked|allowlist|open]
         [--allow RULE]... [--preset pypi]... [--public-ports] [--wait=true]
  list   [--state running] [--metadata K=V]... [--limit N] [--all-projects]
  get    ID
  exec   [--shell CMD] [--env K=V]... [--cwd DIR] [--user U] [-t|--tty] [-i|--stdin] [--timeout D] ID [--] CMD ARGS...
         (-it ID -- sh: an interactive shell; exits with the command's exit code)
  run-code [--language python|javascript|r|bash] [--context CTX] [--env K=V]... [--timeout D]
         [--save-images DIR] ID [CODE | -]   run code in a code-interpreter-v1 sandbox's stateful
                                            interpreter (no CODE or -: from stdin); results on stdout,
                                            exit status 1 when the code raised
  logs   ID [--command CID | --all]      a command's output (default: the newest), followed until it exits
  cp     [--user U] SRC DST             copy files or directories in or out, like docker cp:
         LOCAL ID:PATH | ID:PATH LOCAL      into an existing directory, under the source's name
                                            ("-": stdin/stdout for one file); progress on a terminal
  ports  ID [--wait PORT] [--timeout 1m]  the ports something listens on inside, with their URLs
  url    ID PORT [--signed] [--ttl 1h] [--path]  the URL of a port (--signed: opens it with no other credential)
  pause  ID [--wait=true]     freeze every process; the data plane refuses calls until resume
  resume ID [--wait=true]     resume a paused or hibernated sandbox
  hibernate ID [--wait=true]  snapshot, release the instance; resume starts it again
  rm     ID... | --all [--wait]   (--all: every live sandbox of the key's project)
  timeout ID DURATION         delete (or hibernate) it DURATION from now, e.g. 30m; 0: never
  session ID                  print a fresh session token (X-Access-Token for the data plane and ports)
  network ID --network MODE [--allow RULE]... [--preset NAME]...   replace its egress policy
  netlog ID [--after N]       its egress decisions (allowed and denied connections)
  metrics ID [--since 10m]    its CPU, memory and disk use

every verb takes --url, --api-key and --json`

func runSandbox(args []string) error {
	if len(args) == 0 {
		return usagef("%s", sandboxUsage)
	}
	switch args[0] {
	case "create":
		return sandboxCreate(args[1:])
	case "list", "ls":
		return sandboxList(args[1:])
	case "get", "show":
		return sandboxGet(args[1:])
	case "exec":
		return sandboxExec(args[1:])
	case "run-code":
		return sandboxRunCode(args[1:])
	case "rm", "delete":
		return sandboxRemove(args[1:])
	case "pause", "resume", "hibernate":
		return sandboxLifecycle(args[0], args[1:])
	case "logs":
		return runLogs(args[1:])
	case "cp":
		return sandboxCopy(args[1:])
	case "ports":
		return sandboxPorts(args[1:])
	case "url":
		return sandboxURL(args[1:])
	case "timeout":
		return sandboxTimeout(args[1:])
	case "session":
		return sandboxSession(args[1:])
	case "network":
		return sandboxNetwork(args[1:])
	case "netlog":
		return sandboxNetLog(args[1:])
	case "metrics":
		return sandboxMetrics(args[1:])
	case "help", "-h", "--help":
		fmt.Println(sandboxUsage)
		return nil
	}
	return usagef("unknown sandbox verb %q\n%s", args[0], sandboxUsage)
}

func sandboxCreate(args []string) error {
	fs, cl := newClientFlags("sandbox create")
	tmpl := fs.String("template", "base", "template to start from")
	env, meta := kvFlag{}, kvFlag{}
	fs.Var(env, "env", "environment variable K=V (repeatable)")
	fs.Var(meta, "metadata", "metadata K=V (repeatable)")
	memory := fs.String("memory", "", "memory limit, e.g. 512M or 2G (default: the server's)")
	cpus := fs.Float64("cpus", 0, "CPU limit in cores, e.g. 1.5 (default: the server's)")
	pids := fs.Int64("pids", 0, "process limit (default: the server's)")
	disk := fs.String("disk", "", "disk limit of the writable layer, e.g. 1G (default: the server's)")
	timeout := durationVar(fs, "timeout", 0, "delete the sandbox after this long, e.g. 15m; 0 = never (default: the server's)")
	onTimeout := fs.String("on-timeout", "", "at the timeout: delete (default) or hibernate (keep it as a snapshot that resume brings back)")
	autoPause := durationVar(fs, "auto-pause", 0, "pause it after this long without data-plane activity, e.g. 10m (default: never)")
	autoResume := fs.Bool("auto-resume", false, "data-plane calls resume it when paused or hibernated")
	pf := addPolicyFlags(fs)
	publicPorts := fs.Bool("public-ports", false, "forwarded ports open without a token (anyone with the URL reaches them)")
	wait := fs.Bool("wait", true, "wait until the sandbox is running")
	idem := fs.String("idempotency-key", "", "makes retrying this exact request safe")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 0, "[flags]"); err != nil {
		return err
	}
	req := client.CreateRequest{Template: *tmpl, Env: env, Metadata: meta, PublicPorts: *publicPorts,
		Limits: client.Limits{CPUMillis: int64(*cpus*1000 + 0.5), Pids: *pids}, OnTimeout: *onTimeout, AutoResume: *autoResume}
	if req.Network, err = pf.policy(); err != nil {
		return err
	}
	if *onTimeout != "" && *onTimeout != "delete" && *onTimeout != "hibernate" {
		return usagef("--on-timeout must be delete or hibernate, not %q", *onTimeout)
	}
	if *timeout < 0 || *autoPause < 0 {
		return usagef("--timeout and --auto-pause must not be negative")
	}
	if *autoPause > 0 {
		secs := int64((*autoPause + time.Second - 1) / time.Second)
		req.AutoPauseSeconds = &secs
	}
	if *cpus < 0 || *pids < 0 {
		return errors.New("--cpus and --pids must not be negative")
	}
	if *memory != "" {
		if req.Limits.MemoryBytes, err = parseByteSize(*memory); err != nil {
			return err
		}
	}
	if *disk != "" {
		if req.Limits.DiskBytes, err = parseByteSize(*disk); err != nil {
			return err
		}
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "timeout" {
			secs := int64((*timeout + time.Second - 1) / time.Second)
			req.TimeoutSeconds = &secs
		}
	})
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	res, err := c.CreateSandbox(ctx, req, *idem)
	if err != nil {
		return err
	}
	if *wait {
		op, err := newProgressPrinter().watch(ctx, c, res.Operation.ID)
		if err != nil {
			return fmt.Errorf("sandbox %s: %w", res.Sandbox.ID, err)
		}
		res.Operation = op
		var sb client.Sandbox
		if op.DecodeResult(&sb) == nil && sb.ID == res.Sandbox.ID {
			res.Sandbox = sb
		}
	}
	if cl.json {
		return cl.printJSON(res)
	}
	fmt.Fprintln(cl.out, res.Sandbox.ID)
	if !*wait {
		fmt.Fprintf(cl.errOut, "creating; follow with: space ops watch %s\n", res.Operation.ID)
	}
	return nil
}

func sandboxList(args []string) error {
	fs, cl := newClientFlags("sandbox list")
	var states listFlag
	fs.Var(&states, "state", "only these states (repeatable or comma-separated): creating, running, paused, hibernated, deleting, deleted, failed, lost")
	meta := kvFlag{}
	fs.Var(meta, "metadata", "only sandboxes with metadata K=V (repeatable)")
	limit := fs.Int("limit", 0, "show at most this many (0: all)")
	allProjects := fs.Bool("all-projects", false, "every project's sandboxes, with a PROJECT column (admin keys only)")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 0, "[--state S] [--metadata K=V] [--all-projects]"); err != nil {
		return err
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	opts := client.ListOptions{State: states, Metadata: meta, AllProjects: *allProjects}
	if *limit > 0 && *limit <= 1000 {
		opts.Limit = *limit
	}
	list := []client.Sandbox{}
	for sb, err := range c.AllSandboxes(ctx, opts) {
		if err != nil {
			return err
		}
		list = append(list, sb)
		if *limit > 0 && len(list) >= *limit {
			break
		}
	}
	if cl.json {
		return cl.printJSON(map[string]any{"sandboxes": list})
	}
	tw := tabwriter.NewWriter(cl.out, 0, 4, 2, ' ', 0)
	if *allProjects {
		fmt.Fprint(tw, "PROJECT\t")
	}
	fmt.Fprintln(tw, "ID\tTEMPLATE\tSTATE\tAGE\tEXPIRES\tMETADATA")
	for _, sb := range list {
		if *allProjects {
			fmt.Fprintf(tw, "%s\t", sb.ProjectID)
		}
		exp := "never"
		switch {
		case sb.State == client.StateDeleted || sb.State == client.StateFailed || sb.State == client.StateLost:
			exp = "-"
		case sb.ExpiresAt != nil:
			exp = humanAge(*sb.ExpiresAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.Template, sb.State, humanAge(sb.CreatedAt), exp, joinKV(sb.Metadata))
	}
	return tw.Flush()
}

func sandboxGet(args []string) error {
	fs, cl := newClientFlags("sandbox get")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "ID"); err != nil {
		return err
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	sb, err := c.GetSandbox(ctx, pos[0])
	if err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(sb)
	}
	state := sb.State
	if sb.StateReason != "" {
		state += " (" + sb.StateReason + ")"
	}
	limits := []string{}
	if sb.Limits.CPUMillis > 0 {
		limits = append(limits, fmt.Sprintf("cpus=%.2f", float64(sb.Limits.CPUMillis)/1000))
	}
	if sb.Limits.MemoryBytes > 0 {
		limits = append(limits, "memory="+humanBytes(sb.Limits.MemoryBytes))
	}
	if sb.Limits.Pids > 0 {
		limits = append(limits, fmt.Sprintf("pids=%d", sb.Limits.Pids))
	}
	if sb.Limits.DiskBytes > 0 {
		limits = append(limits, "disk="+humanBytes(sb.Limits.DiskBytes))
	}
	exp := "never"
	if sb.ExpiresAt != nil {
		exp = sb.ExpiresAt.Local().Format(time.RFC3339) + " (" + humanAge(*sb.ExpiresAt) + ")"
	}
	envKeys := make([]string, 0, len(sb.Env))
	for k := range sb.Env {
		envKeys = append(envKeys, k)
	}
	sort.Strings(envKeys)
	return writeFields(cl.out, [][2]string{
		{"id", sb.ID}, {"template", sb.Template}, {"state", state},
		{"driver", sb.Driver}, {"node", sb.Node}, {"limits", strings.Join(limits, " ")},
		{"created", sb.CreatedAt.Local().Format(time.RFC3339)}, {"expires", exp},
		{"env", strings.Join(envKeys, ",")}, {"metadata", joinKV(sb.Metadata)},
		{"network", networkSummary(sb.Network)}, {"on timeout", sb.OnTimeout}, {"auto pause", autoPauseText(sb.AutoPauseSeconds)},
		{"auto resume", strconv.FormatBool(sb.AutoResume)},
	})
}

// writeFields prints "name: value" rows aligned, "-" for an empty value.
func writeFields(out io.Writer, rows [][2]string) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		if r[1] == "" {
			r[1] = "-"
		}
		fmt.Fprintf(tw, "%s:\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

func sandboxRemove(args []string) error {
	fs, cl := newClientFlags("sandbox rm")
	wait := fs.Bool("wait", false, "wait until the sandboxes are gone")
	all := fs.Bool("all", false, "every live sandbox of the key's project (creating, running, paused, hibernated)")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 && !*all || len(pos) > 0 && *all {
		return usagef("usage: space sandbox rm ID... | --all  [--wait]")
	}
	c, ctx, stop, err := cl.connect()
	if err != nil {
		return err
	}
	defer stop()
	if *all {
		for sb, err := range c.AllSandboxes(ctx, client.ListOptions{State: []string{"creating", "running", "paused", "hibernated"}}) {
			if err != nil {
				return err
			}
			pos = append(pos, sb.ID)
		}
		if len(pos) == 0 {
			if cl.json {
				return cl.printJSON(map[string]any{"operations": []client.Operation{}})
			}
			fmt.Fprintln(cl.errOut, "no sandboxes to delete")
			return nil
		}
	}
	// Like docker rm: every id is tried; the failures are reported and
	// make the exit status 1.
	var ops []client.Operation
	failed := 0
	for _, id := range pos {
		op, err := c.DeleteSandbox(ctx, id)
		if err == nil && *wait {
			op, err = newProgressPrinter().watch(ctx, c, op.ID)
		}
		if err != nil {
			fmt.Fprintf(cl.errOut, "space: %s: %v\n", id, err)
			failed++
			continue
		}
		ops = append(ops, op)
		switch {
		case cl.json:
		case *wait:
			fmt.Fprintf(cl.out, "deleted %s\n", id)
		default:
			fmt.Fprintf(cl.out, "deleting %s (operation %s)\n", id, op.ID)
		}
	}
	if cl.json {
		if len(pos) == 1 && len(ops) == 1 && !*all {
			return cl.printJSON(ops[0])
		}
		if ops == nil {
			ops = []client.Operation{}
		}
		if err := cl.printJSON(map[string]any{"operations": ops}); err != nil {
			return err
		}
	}
	if failed > 0 {
		return silentError{fmt.Sprintf("%d of %d sandboxes not deleted", failed, len(pos))}
	}
	return nil
}

// execValueFlags are the exec flags that take a value (for -it splitting).
var execValueFlags = map[string]bool{"shell": true, "env": true, "cwd": true, "user": true,
	"timeout": true, "tag": true, "url": true, "api-key": true}

// splitShortFlags expands combined one-letter exec flags (-it, -ti) among
// the flags before the command, so `exec -it ID -- sh` works as in docker.
func splitShortFlags(args []string) []string {
	out := make([]string, 0, len(args)+2)
	positional := 0
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || positional > 1 {
			return append(out, args[i:]...)
		}
		switch {
		case len(a) > 2 && a[0] == '-' && a[1] != '-' && strings.Trim(a[1:], "it") == "":
			for _, c := range a[1:] {
				out = append(out, "-"+string(c))
			}
			continue
		case strings.HasPrefix(a, "-"):
			name := strings.TrimLeft(a, "-")
			if execValueFlags[name] && i+1 < len(args) {
				out = append(out, a, args[i+1])
				i++
				continue
			}
		default:
			positional++
			if positional > 1 {
				return append(out, args[i:]...)
			}
		}
		out = append(out, a)
	}
	return out
}

func sandboxExec(args []string) error {
	fs, cl := newClientFlags("sandbox exec")
	shell := fs.String("shell", "", "run this with /bin/sh -c instead of CMD ARGS")
	env := kvFlag{}
	fs.Var(env, "env", "environment variable K=V (repeatable)")
	cwd := fs.String("cwd", "", "working directory in the sandbox")
	user := fs.String("user", "", "user name or uid in the sandbox")
	var tty, stdin bool
	fs.BoolVar(&tty, "tty", false, "run on a pseudo-terminal; with a terminal on stdin it is put in raw mode")
	fs.BoolVar(&tty, "t", false, "short for --tty")
	fs.BoolVar(&stdin, "stdin", false, "forward this process's stdin to the command")
	fs.BoolVar(&stdin, "i", false, "short for --stdin (-it: an interactive terminal)")
	timeout := durationVar(fs, "timeout", 0, "kill the command after this long, e.g. 30s (0: never)")
	tag := fs.String("tag", "", "label shown in command listings")
	// Flags go before or right after the id; everything after the first
	// other word (or after --) is the command, flags included.
	args = splitShortFlags(args)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return usagef("usage: space sandbox exec [flags] ID [--] CMD ARGS")
	}
	id := rest[0]
	if err := parseFlags(fs, rest[1:]); err != nil {
		return err
	}
	argv := fs.Args()
	if (len(argv) == 0) == (*shell == "") {
		return usagef("give either a command after the sandbox id or --shell, not both")
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc, err := c.Connect(ctx, id)
	if err != nil {
		return err
	}
	req := client.ExecRequest{Argv: argv, Shell: *shell, Env: env, Cwd: *cwd, User: *user,
		Stdin: stdin, Timeout: *timeout, Tag: *tag}
	if tty {
		cols, rows := terminalSize()
		req.PTY = &client.PTY{Cols: cols, Rows: rows}
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		if _, ok := req.Env["TERM"]; !ok {
			if term := os.Getenv("TERM"); term != "" {
				req.Env["TERM"] = term
			}
		}
	}
	// One request starts the command and streams its output; stdin and
	// signals are forwarded once the start event names the command.
	var (
		cmdID   string
		restore = func() {}
	)
	defer func() { restore() }()
	sigs := make(chan os.Signal, 4)
	defer signal.Stop(sigs)
	started := func(cmd client.Command) error {
		cmdID = cmd.ID
		// Raw mode only once the command runs: keys then reach the remote
		// terminal as bytes (Ctrl-C included), its echo is the only one.
		if tty && stdin && isTTY(os.Stdin) {
			r, err := makeRaw(int(os.Stdin.Fd()))
			if err != nil {
				return err
			}
			restore = r
		}
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGWINCH)
		go forwardSignals(ctx, cancel, sc, cmd.ID, sigs, tty)
		if stdin {
			go forwardStdin(ctx, sc, cmd.ID)
		}
		return nil
	}
	_, exit, err := sc.ExecStreamStarted(ctx, req, started, func(ev client.Event) error {
		w := os.Stdout
		switch ev.Type {
		case client.EventStderr:
			w = os.Stderr
		case client.EventDropped:
			fmt.Fprintln(os.Stderr, droppedNotice(ev))
			return nil
		}
		_, err := w.Write(ev.Data)
		return err
	})
	var ae *client.APIError
	if cmdID == "" && errors.As(err, &ae) && ae.Code == "exec_failed" {
		fmt.Fprintf(os.Stderr, "space: %s\n", ae.Message)
		return exitCode(127) // as a shell does for a command it cannot run
	}
	if err != nil {
		if cmdID != "" && ctx.Err() != nil {
			fmt.Fprintf(os.Stderr, "space: detached; command %s may still run in %s\n", cmdID, id)
			return exitCode(130)
		}
		return err
	}
	signal.Stop(sigs)
	cancel()
	return execExit{exit: exit, json: cl.json}
}

// execExit ends `space sandbox exec` with the remote command's status; main
// prints its notes on stderr (after the terminal is restored) and exits.
type execExit struct {
	exit client.Exit
	json bool
}

func (e execExit) Error() string {
	switch {
	case e.exit.Error != "":
		return "command failed: " + e.exit.Error
	case e.exit.TimedOut:
		return "command killed at its timeout"
	case e.exit.OOMKilled:
		return "command killed: out of memory"
	}
	return ""
}

// ExitCode is the status this process exits with.
func (e execExit) ExitCode() int { return exitStatus(e.exit) }

// report prints the exit on stderr: JSON with --json (stdout stays the
// command's), else a note when the command did not simply exit.
func (e execExit) report() {
	if e.json {
		enc := json.NewEncoder(os.Stderr)
		enc.SetIndent("", "  ")
		enc.Encode(e.exit)
	}
	if msg := e.Error(); msg != "" {
		fmt.Fprintln(os.Stderr, "space:", msg)
	}
}

// exitCode ends the process with a status and no message.
type exitCode int

func (e exitCode) Error() string { return "" }

// ExitCode is the status this process exits with.
func (e exitCode) ExitCode() int { return int(e) }

// usageError is a mistake in how a command was called: main exits 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// ExitCode is the status this process exits with.
func (e usageError) ExitCode() int { return 2 }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// usageErr marks a flag-parsing error as a usage error.
func usageErr(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// exitStatus maps a remote exit to this process's status the way a shell
// does: the code, or 128+signal for a killed command.
func exitStatus(e client.Exit) int {
	if e.Error != "" && e.Code <= 0 {
		return 127
	}
	if e.Code >= 0 {
		return e.Code & 0xff
	}
	sigs := map[string]int{"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGABRT": 6, "SIGKILL": 9,
		"SIGSEGV": 11, "SIGPIPE": 13, "SIGALRM": 14, "SIGTERM": 15}
	if n, ok := sigs[e.Signal]; ok {
		return 128 + n
	}
	return 255
}

// forwardSignals passes interrupts on to the remote command; a second
// SIGINT detaches, leaving the command to its fate. Window changes resize
// the remote terminal.
func forwardSignals(ctx context.Context, cancel context.CancelFunc, sc *client.SandboxConn, cmdID string, sigs <-chan os.Signal, tty bool) {
	interrupts := 0
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-sigs:
			switch s {
			case syscall.SIGWINCH:
				if tty {
					cols, rows := terminalSize()
					sc.Resize(ctx, cmdID, cols, rows)
				}
				continue
			case syscall.SIGINT:
				interrupts++
				if interrupts > 1 {
					cancel()
					return
				}
			}
			name := map[os.Signal]string{syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM", syscall.SIGHUP: "SIGHUP"}[s]
			if err := sc.Signal(ctx, cmdID, name); err != nil && ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "space: forward %s: %v\n", name, err)
			}
		}
	}
}

// forwardStdin copies stdin to the command and closes the command's stdin
// at EOF. Errors after the command ended are expected and not shown.
func forwardStdin(ctx context.Context, sc *client.SandboxConn, cmdID string) {
	buf := make([]byte, 32<<10)
	for {
		n, err := os.Stdin.Read(buf)
		if n > 0 {
			if werr := sc.WriteStdin(ctx, cmdID, buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			sc.CloseStdin(ctx, cmdID)
			return
		}
	}
}

// terminalSize returns the size of the terminal on stdout or stdin, else
// $COLUMNS x $LINES, else 80x24.
func terminalSize() (cols, rows uint16) {
	for _, f := range []*os.File{os.Stdout, os.Stdin} {
		var ws struct{ Row, Col, X, Y uint16 }
		_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), uintptr(syscall.TIOCGWINSZ), uintptr(unsafe.Pointer(&ws)))
		if errno == 0 && ws.Col > 0 && ws.Row > 0 {
			return ws.Col, ws.Row
		}
	}
	cols, rows = 80, 24
	if n, err := strconv.ParseUint(os.Getenv("COLUMNS"), 10, 16); err == nil && n > 0 {
		cols = uint16(n)
	}
	if n, err := strconv.ParseUint(os.Getenv("LINES"), 10, 16); err == nil && n > 0 {
		rows = uint16(n)
	}
	return cols, rows
}

const templateUsage = `usage: space template <verb> [flags]

verbs:
  list
  get    NAME
  delete NAME                 (refused while sandboxes use it)
  tag    NAME ALIAS           (ALIAS: name or name:tag, pointing at the same template)
  logs   OPERATION [--step N]  (a build's full RUN step logs)
  gc                          (remove layers no template or live sandbox uses)
  build -f Buildfile [-t NAME[:TAG]] [DIR] [--no-context] [--logs]
        (a build file: FROM/RUN/COPY/ENV/WORKDIR/USER/START/READY; DIR is the COPY context)
  build NAME --source busybox|debian [--packages a,b] [--env K=V]... [--cwd DIR] [--user U] [--wait=true]
  build NAME --image REF [--env K=V]... [--cwd DIR] [--user U]   (pulled by the server from a registry)
  build NAME --archive PATH                  (docker-archive or OCI-layout tarball, uploaded to the server)
  build NAME --dir PATH | --tar PATH [--data-dir /var/lib/space] [--uid-base 100000]
        (builds from a host directory or tarball run on the server machine, with the
         server stopped: the server holds the template directory while it runs)

every API verb takes --url, --api-key and --json`

func runTemplate(args []string) error {
	if len(args) == 0 {
		return errors.New(templateUsage)
	}
	switch args[0] {
	case "list", "ls":
		return templateList(args[1:])
	case "build":
		if hasBuildfileFlag(args[1:]) {
			return templateBuildFile(args[1:])
		}
		return templateBuild(args[1:])
	case "get", "show":
		return templateGet(args[1:])
	case "delete", "rm":
		return templateDelete(args[1:])
	case "tag", "alias":
		return templateAlias(args[1:])
	case "logs":
		return templateLogs(args[1:])
	case "gc":
		return templateGC(args[1:])
	case "help", "-h", "--help":
		fmt.Println(templateUsage)
		return nil
	}
	return fmt.Errorf("unknown template verb %q\n%s", args[0], templateUsage)
}

func templateList(args []string) error {
	fs, cl := newClientFlags("template list")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 0, ""); err != nil {
		return err
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	list, err := c.ListTemplates(ctx)
	if err != nil {
		return err
	}
	if cl.json {
		if list == nil {
			list = []client.TemplateInfo{}
		}
		return cl.printJSON(map[string]any{"templates": list})
	}
	tw := tabwriter.NewWriter(cl.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSOURCE\tSIZE\tFILES\tDIGEST\tAGE")
	for _, t := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", t.Name, t.Source, humanBytes(t.SizeBytes), t.Files, shortDigest(t.Digest), humanAge(t.CreatedAt))
	}
	return tw.Flush()
}

func shortDigest(d string) string {
	if h, ok := strings.CutPrefix(d, "sha256:"); ok && len(h) > 12 {
		return h[:12]
	}
	return d
}

// templateNameRE is the API's rule for template names (sandboxes can only
// use names that match it, so local builds are held to it too).
var templateNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

func templateBuild(args []string) error {
	fs, cl := newClientFlags("template build")
	source := fs.String("source", "", "busybox or debian (built by the server)")
	var pkgs listFlag
	fs.Var(&pkgs, "packages", "extra Debian packages, comma-separated (debian)")
	env := kvFlag{}
	fs.Var(env, "env", "default environment variable K=V (repeatable)")
	cwd := fs.String("cwd", "", "default working directory")
	user := fs.String("user", "", "default user")
	wait := fs.Bool("wait", true, "wait for the build to finish")
	idem := fs.String("idempotency-key", "", "makes retrying this exact request safe")
	dir := fs.String("dir", "", "build locally from this host directory (run on the server machine)")
	tarPath := fs.String("tar", "", "build locally from this rootfs tarball (run on the server machine)")
	image := fs.String("image", "", "registry reference of an OCI/Docker image, pulled by the server")
	archive := fs.String("archive", "", "docker-archive or OCI-layout tarball to upload and build from")
	dataDir := fs.String("data-dir", "/var/lib/space", "server state directory (local builds)")
	uidBase := fs.Uint("uid-base", 100000, "host uid of root in sandboxes; must match the server (local builds)")
	// Build-file builds take these; runTemplate hands them to
	// templateBuildFile, they are declared here so that -h lists them.
	fs.String("f", "", "build file (FROM/RUN/COPY/ENV/WORKDIR/USER/START/READY): space template build -f FILE [-t NAME[:TAG]] [DIR]")
	fs.String("file", "", "same as -f")
	fs.String("t", "", "with -f: template name, optionally NAME:TAG (default: the context directory's name)")
	fs.String("tag", "", "same as -t")
	fs.Bool("no-context", false, "with -f: send no build context")
	fs.Bool("logs", false, "with -f: after the build, print the full log of every RUN step that ran")
	public := fs.Bool("public", false, "publish the template to every project (needs an admin key; --source and --image builds, and -f)")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "NAME --source busybox|debian | --image REF | --archive PATH | --dir PATH | --tar PATH"); err != nil {
		return err
	}
	name := pos[0]
	if !templateNameRE.MatchString(name) {
		return fmt.Errorf("template name %q must match %s", name, templateNameRE)
	}
	n := 0
	for _, s := range []string{*source, *dir, *tarPath, *image, *archive} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		return errors.New("give exactly one of --source, --image, --archive, --dir or --tar")
	}
	if *image != "" || *archive != "" {
		if len(pkgs) > 0 {
			return errors.New("--packages only applies to --source debian")
		}
		*source = "image"
	}
	ctx, stop := signalContext()
	defer stop()
	if *dir != "" || *tarPath != "" {
		if len(pkgs) > 0 {
			return errors.New("--packages only applies to --source debian")
		}
		src, path := template.SourceDir, *dir
		if *tarPath != "" {
			src, path = template.SourceTar, *tarPath
		}
		return cl.buildLocal(ctx, *dataDir, uint32(*uidBase), template.BuildRequest{
			Name: name, Source: src, Path: path,
			Defaults: template.Defaults{Env: env, Cwd: *cwd, User: *user},
		})
	}
	if *source != "busybox" && *source != "debian" && *source != "image" {
		return fmt.Errorf("--source must be busybox or debian (use --image or --archive for images, --dir or --tar for local files), not %q", *source)
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	var op client.Operation
	if *archive != "" {
		if *public {
			return errors.New("--public does not apply to --archive uploads yet")
		}
		if len(env) > 0 || *cwd != "" || *user != "" {
			return errors.New("--archive takes its env, cwd and user from the image config")
		}
		f, err := os.Open(*archive)
		if err != nil {
			return err
		}
		defer f.Close()
		op, err = c.UploadTemplate(ctx, name, f, *idem)
		if err != nil {
			return err
		}
	} else {
		op, err = c.BuildTemplate(ctx, client.TemplateBuildRequest{Name: name, Source: *source, Packages: pkgs,
			Image: *image, Env: env, Cwd: *cwd, User: *user, Public: *public}, *idem)
		if err != nil {
			return err
		}
	}
	if !*wait {
		if cl.json {
			return cl.printJSON(op)
		}
		fmt.Fprintf(cl.out, "building %s (operation %s); follow with: space ops watch %s\n", name, op.ID, op.ID)
		return nil
	}
	if op, err = newProgressPrinter().watch(ctx, c, op.ID); err != nil {
		return err
	}
	var t client.TemplateInfo
	op.DecodeResult(&t)
	if cl.json {
		return cl.printJSON(t)
	}
	fmt.Fprintf(cl.out, "built %s %s (%s, %d files)\n", name, t.Digest, humanBytes(t.SizeBytes), t.Files)
	return nil
}

// buildLocal builds a template from host files with the template manager
// itself. Host paths are never accepted over the API: whoever names them
// must already be able to read them, which the API cannot check.
func (c *clientCLI) buildLocal(ctx context.Context, dataDir string, uidBase uint32, req template.BuildRequest) error {
	abs, err := filepath.Abs(req.Path)
	if err != nil {
		return err
	}
	req.Path = abs
	dir := filepath.Join(dataDir, "templates")
	m, err := template.NewManager(dir, template.Options{UIDBase: uidBase, UIDCount: 65536})
	if errors.Is(err, template.ErrLocked) {
		return fmt.Errorf("%s is in use by a running server: stop it, build, then start it again (busybox and debian templates build through the API while it runs)", dir)
	}
	if err != nil {
		return err
	}
	defer m.Close()
	tty := isTerminal(os.Stderr)
	last := ""
	t, err := m.Build(ctx, req, func(stage string, done, total int64, msg string) {
		line := stage
		if total > 0 {
			line += fmt.Sprintf(" %d%%", 100*done/total)
		}
		if msg != "" {
			line += " " + msg
		}
		if line == last {
			return
		}
		last = line
		if tty {
			fmt.Fprintf(os.Stderr, "\r\033[K%s", line)
		} else {
			fmt.Fprintln(os.Stderr, line)
		}
	})
	if tty && last != "" {
		fmt.Fprintln(os.Stderr)
	}
	if err != nil {
		return fmt.Errorf("build %s: %w", req.Name, err)
	}
	info := client.TemplateInfo{Name: t.Name, Digest: t.Digest, Source: t.Source, SizeBytes: t.SizeBytes,
		Files: t.Files, Env: t.Defaults.Env, Cwd: t.Defaults.Cwd, User: t.Defaults.User, CreatedAt: t.CreatedAt}
	if c.json {
		return c.printJSON(info)
	}
	fmt.Fprintf(c.out, "built %s %s (%s, %d files)\n", t.Name, t.Digest, humanBytes(t.SizeBytes), t.Files)
	return nil
}

const opsUsage = `usage: space ops <verb> [flags]

verbs:
  get   ID [--wait 30s]   show an operation; --wait holds until it is done (at most 60s)
  watch ID                follow an operation until it is done; exits 1 if it failed

The API lists no operations; space events follows every operation and
sandbox state change of the project (--after 0: the retained history).

every verb takes --url, --api-key and --json`

func runOps(args []string) error {
	if len(args) == 0 {
		return usagef("%s", opsUsage)
	}
	switch args[0] {
	case "get", "show":
		return opsGet(args[1:])
	case "watch":
		return opsWatch(args[1:])
	case "help", "-h", "--help":
		fmt.Println(opsUsage)
		return nil
	}
	return usagef("unknown ops verb %q\n%s", args[0], opsUsage)
}

func (c *clientCLI) printOperation(op client.Operation) {
	rows := [][2]string{
		{"id", op.ID}, {"kind", op.Kind}, {"target", op.Target}, {"state", op.State},
		{"progress", fmt.Sprintf("%d%%", op.Progress)}, {"message", op.Message},
		{"created", op.CreatedAt.Local().Format(time.RFC3339)}, {"updated", op.UpdatedAt.Local().Format(time.RFC3339)},
	}
	if op.Error != nil {
		rows = append(rows, [2]string{"error", op.Error.Code + ": " + op.Error.Message})
	}
	writeFields(c.out, rows)
}

func opsGet(args []string) error {
	fs, cl := newClientFlags("ops get")
	wait := durationVar(fs, "wait", 0, "wait up to this long (at most 60s) for the operation to finish, e.g. 30s")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "ID [--wait 30s]"); err != nil {
		return err
	}
	if *wait < 0 || *wait > 60*time.Second {
		return errors.New("--wait must be between 0 and 60s")
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	op, err := c.GetOperation(ctx, pos[0], *wait)
	if err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(op)
	}
	cl.printOperation(op)
	return nil
}

func opsWatch(args []string) error {
	fs, cl := newClientFlags("ops watch")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "ID"); err != nil {
		return err
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	enc := json.NewEncoder(cl.out)
	op, err := c.WatchOperation(ctx, pos[0], func(op client.Operation) {
		if cl.json {
			enc.Encode(op) // one object per line
			return
		}
		line := fmt.Sprintf("%s  %-9s %3d%%", op.UpdatedAt.Local().Format("15:04:05"), op.State, op.Progress)
		if op.Message != "" {
			line += "  " + op.Message
		}
		fmt.Fprintln(cl.out, line)
	})
	var oe *client.OperationError
	if errors.As(err, &oe) && op.Error != nil && !cl.json {
		fmt.Fprintf(cl.out, "error: %s: %s\n", op.Error.Code, op.Error.Message)
	}
	return err
}

// droppedNotice says what a "dropped" event means, for a terminal.
func droppedNotice(ev client.Event) string {
	var d client.Dropped
	_ = json.Unmarshal(ev.Data, &d)
	return fmt.Sprintf("space: output dropped: events 1-%d (%s of output) exceeded the sandbox's bound on kept output; continuing at event %d",
		d.DroppedEvents, humanBytes(d.DroppedBytes), d.FirstSeq)
}
