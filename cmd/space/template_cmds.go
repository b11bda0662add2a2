package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/tabwriter"

	"github.com/space-sandbox/space/pkg/client"
)

// taggedTemplateRE is the API's rule for names of build-file templates: a
// name with an optional :tag.
var taggedTemplateRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}(:[a-z0-9][a-z0-9._-]{0,63})?$`)

// hasBuildfileFlag reports whether a template build names a build file.
func hasBuildfileFlag(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "-f" || a == "--file" || a == "-file" || strings.HasPrefix(a, "-f=") || strings.HasPrefix(a, "--file=") || strings.HasPrefix(a, "-file=") {
			return true
		}
	}
	return false
}

// templateBuildFile is `space template build -f Buildfile [-t NAME[:TAG]] [DIR]`:
// DIR (default .) is sent as the build context; NAME defaults to DIR's
// base name.
func templateBuildFile(args []string) error {
	fs, cl := newClientFlags("template build")
	file := fs.String("f", "", "build file (FROM/RUN/COPY/ENV/WORKDIR/USER/START/READY)")
	fs.StringVar(file, "file", "", "same as -f")
	tag := fs.String("t", "", "template name, optionally with :tag (default: the context directory's name)")
	fs.StringVar(tag, "tag", "", "same as -t")
	wait := fs.Bool("wait", true, "wait for the build to finish")
	idem := fs.String("idempotency-key", "", "makes retrying this exact request safe")
	noContext := fs.Bool("no-context", false, "send no build context (a build file without COPY)")
	showLogs := fs.Bool("logs", false, "after the build, print the full log of every RUN step that ran")
	public := fs.Bool("public", false, "publish the template to every project (needs an admin key)")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("usage: space template build -f Buildfile [-t NAME[:TAG]] [DIR]")
	}
	dir := "."
	if len(pos) == 1 {
		dir = pos[0]
	}
	if *file == "" {
		return errors.New("-f Buildfile is required")
	}
	bf, err := os.ReadFile(*file)
	if err != nil {
		return err
	}
	name := *tag
	if name == "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return err
		}
		name = strings.ToLower(filepath.Base(abs))
	}
	if !taggedTemplateRE.MatchString(name) {
		return fmt.Errorf("template name %q must match %s (give one with -t)", name, taggedTemplateRE)
	}
	var ctxTar io.Reader
	if !*noContext {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return fmt.Errorf("build context %s is not a directory", dir)
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(client.WriteContextTar(dir, pw)) }()
		defer pr.Close()
		ctxTar = pr
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	build := c.BuildTemplateFile
	if *public {
		build = c.PublishTemplateFile
	}
	op, err := build(ctx, name, bf, ctxTar, *idem)
	if err != nil {
		return err
	}
	if !*wait {
		if cl.json {
			return cl.printJSON(op)
		}
		fmt.Fprintf(cl.out, "building %s (operation %s); follow with: space ops watch %s\n", name, op.ID, op.ID)
		return nil
	}
	sp := &stepPrinter{w: os.Stderr, tty: isTerminal(os.Stderr)}
	opID := op.ID
	op, err = c.WatchOperation(ctx, opID, sp.update)
	sp.done()
	var opErr *client.OperationError
	if errors.As(err, &opErr) {
		// A failed build keeps its steps' full logs (the error has a tail).
		if *showLogs {
			if steps, lerr := c.TemplateBuildLogSteps(ctx, opID); lerr == nil {
				for _, s := range steps {
					fmt.Fprintf(os.Stderr, "--- step %d\n", s.Step)
					printBuildLog(ctx, c, opID, s.Step, os.Stderr)
				}
			}
		} else {
			fmt.Fprintf(os.Stderr, "full step logs: space template logs %s\n", opID)
		}
	}
	if err != nil {
		return err
	}
	var res client.TemplateBuildResult
	if err := op.DecodeResult(&res); err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(res)
	}
	cached := 0
	for _, s := range res.Steps {
		if s.Cached {
			cached++
		}
	}
	t := res.Template
	fmt.Fprintf(cl.out, "built %s %s (%s, %d files; %d/%d steps cached)\n", t.Name, t.Digest, humanBytes(t.SizeBytes), t.Files, cached, len(res.Steps))
	// The live display starts when the event stream connects, so a fast
	// build may have finished steps before it; the result has them all.
	tw := tabwriter.NewWriter(cl.out, 0, 4, 2, ' ', 0)
	for _, s := range res.Steps {
		state := "ran"
		if s.Cached {
			state = "cached"
		}
		fmt.Fprintf(tw, "  %d/%d\t%s\t%.2fs\t%s\t%s\n", s.Step, len(res.Steps), state, s.Seconds, humanBytes(s.Bytes), s.Instruction)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if w := res.Warm; w != nil {
		fmt.Fprintf(cl.out, "pre-warmed: snapshot %s (%s): %s\n", w.Snapshot, w.Kind, w.Processes)
	}
	if *showLogs {
		for _, s := range res.Steps {
			if s.LogBytes == 0 {
				continue
			}
			fmt.Fprintf(cl.out, "--- step %d/%d %s\n", s.Step, len(res.Steps), s.Instruction)
			if err := printBuildLog(ctx, c, op.ID, s.Step, cl.out); err != nil {
				return err
			}
		}
	}
	return nil
}

func printBuildLog(ctx context.Context, c *client.Client, opID string, step int, w io.Writer) error {
	rc, err := c.TemplateBuildLog(ctx, opID, step)
	if err != nil {
		return err
	}
	defer rc.Close()
	_, err = io.Copy(w, rc)
	return err
}

// templateLogs prints a build's full step logs: one step with --step,
// else every step that has one.
func templateLogs(args []string) error {
	fs, cl := newClientFlags("template logs")
	step := fs.Int("step", 0, "print only this step's log (FROM is step 1)")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "OPERATION"); err != nil {
		return err
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	if *step > 0 {
		return printBuildLog(ctx, c, pos[0], *step, cl.out)
	}
	steps, err := c.TemplateBuildLogSteps(ctx, pos[0])
	if err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(steps)
	}
	if len(steps) == 0 {
		fmt.Fprintf(cl.out, "build %s has no step logs (only RUN steps that ran have one)\n", pos[0])
	}
	for _, s := range steps {
		fmt.Fprintf(cl.out, "--- step %d (%s)\n", s.Step, humanBytes(s.Bytes))
		if err := printBuildLog(ctx, c, pos[0], s.Step, cl.out); err != nil {
			return err
		}
	}
	return nil
}

// templateGC removes template layers nothing uses.
func templateGC(args []string) error {
	fs, cl := newClientFlags("template gc")
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
	removed, err := c.GCTemplates(ctx)
	if err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(map[string]any{"removed": removed})
	}
	for _, d := range removed {
		fmt.Fprintf(cl.out, "removed %s\n", d)
	}
	fmt.Fprintf(cl.out, "%d layers removed\n", len(removed))
	return nil
}

// stepPrinter shows a build's step messages ("step N/M INSTR: STATE …"):
// on a terminal, one line per step rewritten in place as it advances;
// otherwise every new message as its own line.
type stepPrinter struct {
	w        io.Writer
	tty      bool
	last     string
	lastStep string // "N/M" of the line on screen
}

func (p *stepPrinter) update(op client.Operation) {
	msg := op.Message
	if !strings.HasPrefix(msg, "step ") && !strings.HasPrefix(msg, "prewarm: ") || msg == p.last {
		return
	}
	p.last = msg
	step, _, _ := strings.Cut(strings.TrimPrefix(msg, "step "), " ")
	if !p.tty {
		fmt.Fprintln(p.w, msg)
		return
	}
	if p.lastStep != "" && step != p.lastStep {
		fmt.Fprintln(p.w)
	}
	p.lastStep = step
	fmt.Fprintf(p.w, "\r\033[K%s", msg)
}

func (p *stepPrinter) done() {
	if p.tty && p.lastStep != "" {
		fmt.Fprintln(p.w)
	}
}

func templateGet(args []string) error {
	fs, cl := newClientFlags("template get")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "NAME"); err != nil {
		return err
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	t, err := c.GetTemplate(ctx, pos[0])
	if err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(t)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "name:    %s\ndigest:  %s\nsource:  %s\nsize:    %s (%d files)\n", t.Name, t.Digest, t.Source, humanBytes(t.SizeBytes), t.Files)
	if t.Cwd != "" {
		fmt.Fprintf(&b, "cwd:     %s\n", t.Cwd)
	}
	if t.User != "" {
		fmt.Fprintf(&b, "user:    %s\n", t.User)
	}
	if len(t.Env) > 0 {
		fmt.Fprintf(&b, "env:     %s\n", joinKV(t.Env))
	}
	if len(t.Cmd) > 0 {
		fmt.Fprintf(&b, "cmd:     %q\n", t.Cmd)
	}
	if len(t.Ready) > 0 {
		fmt.Fprintf(&b, "ready:   %q\n", t.Ready)
	}
	if t.WarmSnapshot != "" {
		fmt.Fprintf(&b, "warm:    %s (%s)\n", t.WarmSnapshot, t.WarmProcesses)
	}
	_, err = cl.out.Write(b.Bytes())
	return err
}

func templateDelete(args []string) error {
	fs, cl := newClientFlags("template delete")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, "NAME"); err != nil {
		return err
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	if err := c.DeleteTemplate(ctx, pos[0]); err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(map[string]string{"deleted": pos[0]})
	}
	fmt.Fprintf(cl.out, "deleted %s\n", pos[0])
	return nil
}

func templateAlias(args []string) error {
	fs, cl := newClientFlags("template tag")
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 2, "NAME ALIAS"); err != nil {
		return err
	}
	c, err := cl.client()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	t, err := c.AliasTemplate(ctx, pos[0], pos[1])
	if err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(t)
	}
	fmt.Fprintf(cl.out, "%s -> %s\n", t.Name, t.Digest)
	return nil
}
