package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/space-sandbox/space/internal/doctor"
	"github.com/space-sandbox/space/internal/server"
)

func runDoctor(args []string) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	dataDir := fs.String("data-dir", server.DefaultConfig().DataDir, "the data dir whose filesystem the disk-quota and journal checks look at")
	runsc := fs.String("runsc", "", "runsc binary, as space server --runsc (default: scripts/runsc.sh's pinned build, then PATH)")
	criuBin := fs.String("criu", "", "CRIU binary (default: $SPACE_CRIU, scripts/criu.sh's pinned build, then PATH)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("usage: space doctor [--data-dir DIR] [--runsc PATH] [--criu PATH] [--json]")
	}
	rep := doctor.Probe(context.Background(), doctor.Options{DataDir: *dataDir, Runsc: *runsc, CRIU: *criuBin})
	name, reason, logs, err := server.ExplainAuto(*runsc)
	rep.Driver = doctor.Driver{Auto: name, Reason: reason, Log: logs}
	if err != nil {
		rep.Driver.Error = err.Error()
	}
	if *asJSON {
		return printJSONTo(os.Stdout, rep)
	}
	printDoctor(os.Stdout, rep)
	return nil
}

func printDoctor(w io.Writer, r doctor.Report) {
	fmt.Fprintf(w, "host: Linux %s %s, %d CPUs, data dir %s\n\n", r.Host.Kernel, r.Host.Arch, r.Host.CPUs, r.Host.DataDir)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tOK\tDETAIL")
	for _, c := range r.Checks {
		ok := "yes"
		if !c.OK {
			ok = "no"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, ok, c.Detail)
	}
	tw.Flush()
	fmt.Fprintln(w)
	if r.Driver.Auto == "" {
		fmt.Fprintf(w, "driver auto: none works here: %s\n", r.Driver.Error)
	} else {
		fmt.Fprintf(w, "driver auto: %s\n", r.Driver.Auto)
	}
	fmt.Fprintf(w, "  why: %s\n", r.Driver.Reason)
}
