package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// sandboxLifecycle runs pause, resume or hibernate and, with --wait (the
// default), follows the operation with a progress line on stderr.
func sandboxLifecycle(verb string, args []string) error {
	fs, cl := newClientFlags("sandbox " + verb)
	wait := fs.Bool("wait", true, "wait until the operation is done")
	idem := fs.String("idempotency-key", "", "makes retrying this exact request safe")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "ID [--wait=false]"); err != nil {
		return err
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	call := map[string]func(context.Context, string, string) (client.Operation, error){
		"pause": c.PauseSandbox, "resume": c.ResumeSandbox, "hibernate": c.HibernateSandbox}[verb]
	op, err := call(ctx, pos[0], *idem)
	if err != nil {
		return err
	}
	if *wait {
		if op, err = newProgressPrinter().watch(ctx, c, op.ID); err != nil {
			return err
		}
	}
	if cl.json {
		return cl.printJSON(op)
	}
	past := map[string]string{"pause": "paused", "resume": "resumed", "hibernate": "hibernated"}[verb]
	if *wait {
		fmt.Fprintf(cl.out, "%s %s\n", past, pos[0])
	} else {
		fmt.Fprintf(cl.out, "%s %s (operation %s)\n", strings.TrimSuffix(verb, "e")+"ing", pos[0], op.ID)
	}
	return nil
}

const snapshotUsage = `usage: space snapshot <verb> [flags]

verbs:
  create SANDBOX_ID [--wait=true]         snapshot a sandbox's filesystem (progress on stderr)
  list   [--sandbox ID]
  get    SNAPSHOT_ID
  rm     SNAPSHOT_ID [--wait]
  fork   SNAPSHOT_ID [--count N] [--wait=true]   new sandboxes from a snapshot; prints their ids

every verb takes --url, --api-key and --json`

func runSnapshot(args []string) error {
	if len(args) == 0 {
		return usagef("%s", snapshotUsage)
	}
	switch args[0] {
	case "create":
		return snapshotCreate(args[1:])
	case "list", "ls":
		return snapshotList(args[1:])
	case "get", "show":
		return snapshotGet(args[1:])
	case "rm", "delete":
		return snapshotRemove(args[1:])
	case "fork":
		return snapshotFork(args[1:])
	case "help", "-h", "--help":
		fmt.Println(snapshotUsage)
		return nil
	}
	return usagef("unknown snapshot verb %q\n%s", args[0], snapshotUsage)
}

func snapshotCreate(args []string) error {
	fs, cl := newClientFlags("snapshot create")
	wait := fs.Bool("wait", true, "wait until the snapshot is ready")
	idem := fs.String("idempotency-key", "", "makes retrying this exact request safe")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "SANDBOX_ID [--wait=false]"); err != nil {
		return err
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	snap, op, err := c.CreateSnapshot(ctx, pos[0], *idem)
	if err != nil {
		return err
	}
	if *wait {
		if _, err = newProgressPrinter().watch(ctx, c, op.ID); err != nil {
			return fmt.Errorf("snapshot %s: %w", snap.ID, err)
		}
		if snap, err = c.GetSnapshot(ctx, snap.ID); err != nil {
			return err
		}
	}
	if cl.json {
		return cl.printJSON(snap)
	}
	fmt.Fprintln(cl.out, snap.ID)
	return nil
}

func snapshotList(args []string) error {
	fs, cl := newClientFlags("snapshot list")
	sbx := fs.String("sandbox", "", "only this sandbox's snapshots")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 0, "[--sandbox ID]"); err != nil {
		return err
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	list, err := c.ListSnapshots(ctx, *sbx)
	if err != nil {
		return err
	}
	if cl.json {
		if list == nil {
			list = []client.Snapshot{}
		}
		return cl.printJSON(map[string]any{"snapshots": list})
	}
	tw := tabwriter.NewWriter(cl.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSANDBOX\tPARENT\tSTATE\tKIND\tAGE")
	for _, s := range list {
		parent := s.ParentID
		if parent == "" {
			parent = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.SandboxID, parent, s.State, s.Kind, humanAge(s.CreatedAt))
	}
	return tw.Flush()
}

func snapshotGet(args []string) error {
	fs, cl := newClientFlags("snapshot get")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "SNAPSHOT_ID"); err != nil {
		return err
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	s, err := c.GetSnapshot(ctx, pos[0])
	if err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(s)
	}
	return writeFields(cl.out, [][2]string{{"id", s.ID}, {"sandbox", s.SandboxID}, {"parent", s.ParentID},
		{"template", s.Template}, {"state", s.State}, {"kind", s.Kind}, {"processes", s.Processes},
		{"created", s.CreatedAt.Local().Format(time.RFC3339)}})
}

func snapshotRemove(args []string) error {
	fs, cl := newClientFlags("snapshot rm")
	wait := fs.Bool("wait", false, "wait until its data is freed")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "SNAPSHOT_ID [--wait]"); err != nil {
		return err
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	op, err := c.DeleteSnapshot(ctx, pos[0])
	if err != nil {
		return err
	}
	if *wait {
		if op, err = newProgressPrinter().watch(ctx, c, op.ID); err != nil {
			return err
		}
	}
	if cl.json {
		return cl.printJSON(op)
	}
	fmt.Fprintf(cl.out, "deleted %s\n", pos[0])
	return nil
}

func snapshotFork(args []string) error {
	fs, cl := newClientFlags("snapshot fork")
	count := fs.Int("count", 1, "how many sandboxes (1..20)")
	wait := fs.Bool("wait", true, "wait until they run")
	idem := fs.String("idempotency-key", "", "makes retrying this exact request safe")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "SNAPSHOT_ID [--count N]"); err != nil {
		return err
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	forks, ferr := c.ForkSnapshot(ctx, pos[0], client.ForkRequest{Count: *count}, *idem)
	if ferr != nil && len(forks) == 0 {
		return ferr
	}
	if *wait {
		for i, f := range forks {
			op, err := newProgressPrinter().watch(ctx, c, f.Operation.ID)
			if err != nil {
				return fmt.Errorf("sandbox %s: %w", f.Sandbox.ID, err)
			}
			forks[i].Operation = op
			var sb client.Sandbox
			if op.DecodeResult(&sb) == nil && sb.ID == f.Sandbox.ID {
				forks[i].Sandbox = sb
			}
		}
	}
	if cl.json {
		if err := cl.printJSON(map[string]any{"sandboxes": forks}); err != nil {
			return err
		}
		return ferr
	}
	for _, f := range forks {
		fmt.Fprintln(cl.out, f.Sandbox.ID)
	}
	return ferr
}

// runLogs prints a sandbox's command output: the newest command's by
// default, following it until it exits.
func runLogs(args []string) error {
	fs, cl := newClientFlags("logs")
	cmdID := fs.String("command", "", "this command's output (default: the newest command's)")
	all := fs.Bool("all", false, "every command's output in order, each after a header on stderr")
	after := fs.Uint64("after", 0, "start after this event number")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "SANDBOX_ID [--command ID | --all]"); err != nil {
		return err
	}
	if *all && *cmdID != "" {
		return usagef("give --command or --all, not both")
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	sc, err := c.Connect(ctx, pos[0])
	if err != nil {
		return err
	}
	var cmds []client.Command
	if *cmdID != "" {
		cmd, err := sc.GetCommand(ctx, *cmdID)
		if err != nil {
			return err
		}
		cmds = []client.Command{cmd}
	} else {
		if cmds, err = sc.ListCommands(ctx); err != nil {
			return err
		}
		sort.SliceStable(cmds, func(i, j int) bool { return cmdOrder(cmds[i].ID) < cmdOrder(cmds[j].ID) })
		if len(cmds) == 0 {
			return fmt.Errorf("sandbox %s has run no commands", pos[0])
		}
		if !*all {
			cmds = cmds[len(cmds)-1:]
		}
	}
	enc := newJSONLines(cl)
	for _, cmd := range cmds {
		if *all && !cl.json {
			fmt.Fprintf(cl.errOut, "==> command %s: %s <==\n", cmd.ID, strings.Join(cmd.Argv, " "))
		}
		exit, err := sc.Stream(ctx, cmd.ID, *after, func(ev client.Event) error {
			if cl.json {
				return enc(map[string]any{"command": cmd.ID, "seq": ev.Seq, "type": ev.Type, "data": string(ev.Data)})
			}
			w := cl.out
			switch ev.Type {
			case client.EventStderr:
				w = cl.errOut
			case client.EventDropped:
				fmt.Fprintln(cl.errOut, droppedNotice(ev))
				return nil
			}
			_, err := w.Write(ev.Data)
			return err
		})
		if err != nil {
			return err
		}
		if cl.json {
			if err := enc(map[string]any{"command": cmd.ID, "type": "exit", "exit": exit}); err != nil {
				return err
			}
		}
	}
	return nil
}

// cmdOrder sorts numeric command ids numerically, others after them.
func cmdOrder(id string) uint64 {
	if n, err := strconv.ParseUint(id, 10, 64); err == nil {
		return n
	}
	return 1 << 63
}

// newJSONLines writes one JSON object per line to the CLI's stdout.
func newJSONLines(cl *clientCLI) func(any) error {
	enc := json.NewEncoder(cl.out)
	return enc.Encode
}

// splitRemote splits "sbx-…:/path" into id and path.
func splitRemote(s string) (id, path string, ok bool) {
	id, path, ok = strings.Cut(s, ":")
	if !ok || !strings.HasPrefix(id, "sbx-") || !strings.HasPrefix(path, "/") {
		return "", "", false
	}
	return id, path, true
}

// copyProgress counts bytes and redraws one line on stderr at most ten
// times a second.
type copyProgress struct {
	label string
	size  int64
	show  bool
	n     atomic.Int64
	start time.Time
	last  time.Time
}

func newCopyProgress(label string, size int64, show bool) *copyProgress {
	return &copyProgress{label: label, size: size, show: show, start: time.Now()}
}

func (p *copyProgress) reader(r io.Reader) io.Reader { return &progressReader{r: r, p: p} }

type progressReader struct {
	r io.Reader
	p *copyProgress
}

func (pr *progressReader) Read(b []byte) (int, error) {
	n, err := pr.r.Read(b)
	pr.p.n.Add(int64(n))
	if pr.p.show && time.Since(pr.p.last) > 100*time.Millisecond {
		pr.p.last = time.Now()
		pr.p.draw()
	}
	return n, err
}

func (p *copyProgress) draw() {
	n := p.n.Load()
	line := fmt.Sprintf("%s: %s", p.label, humanBytes(n))
	if p.size > 0 {
		line += fmt.Sprintf(" / %s (%d%%)", humanBytes(p.size), 100*n/p.size)
	}
	if secs := time.Since(p.start).Seconds(); secs > 0.2 {
		line += fmt.Sprintf(" %s/s", humanBytes(int64(float64(n)/secs)))
	}
	fmt.Fprintf(os.Stderr, "\r\033[K%s", line)
}

// done draws the final line and returns the byte count.
func (p *copyProgress) done(err error) int64 {
	if p.show {
		p.draw()
		if err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprint(os.Stderr, " failed")
		}
		fmt.Fprintln(os.Stderr)
	}
	return p.n.Load()
}
