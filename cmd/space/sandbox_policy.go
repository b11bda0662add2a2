package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// durationFlag is a duration flag whose error says what to type: Go's
// own says `missing unit in duration "30"`.
type durationFlag struct{ p *time.Duration }

func (d durationFlag) String() string {
	if d.p == nil || *d.p == 0 {
		return "0"
	}
	return d.p.String()
}

func (d durationFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err == nil {
		*d.p = v
		return nil
	}
	if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
		return fmt.Errorf("%q has no unit: use %ss (or m, h; e.g. 90s, 15m, 2h)", s, s)
	}
	return fmt.Errorf("%q is not a duration (e.g. 30s, 15m, 2h)", s)
}

// durationVar registers a duration flag with durationFlag's errors.
func durationVar(fs *flag.FlagSet, name string, def time.Duration, usage string) *time.Duration {
	p := new(time.Duration)
	*p = def
	fs.Var(durationFlag{p}, name, usage)
	return p
}

// policyFlags are the egress policy flags of create and `sandbox network`.
type policyFlags struct {
	mode    *string
	allow   listFlag
	presets listFlag
}

func addPolicyFlags(fs *flag.FlagSet) *policyFlags {
	p := &policyFlags{}
	p.mode = fs.String("network", "", "egress policy: blocked, allowlist or open (needs a server run with --egress; default blocked)")
	fs.Var(&p.allow, "allow", `allowlist rule "host[:ports][ METHODS][ PATHS]", e.g. pypi.org or "api.example.com:443 GET /v1/*" (repeatable; implies --network allowlist)`)
	fs.Var(&p.presets, "preset", "registry preset: debian, pypi, npm, goproxy (repeatable or comma-separated; implies --network allowlist)")
	return p
}

// policy returns the policy the flags ask for; nil when none was given.
func (p *policyFlags) policy() (*client.NetworkPolicy, error) {
	mode := *p.mode
	if mode == "" && (len(p.allow) > 0 || len(p.presets) > 0) {
		mode = "allowlist"
	}
	if mode == "" {
		return nil, nil
	}
	switch mode {
	case "blocked", "open":
		if len(p.allow) > 0 || len(p.presets) > 0 {
			return nil, usagef("--allow and --preset need --network allowlist, not %s", mode)
		}
	case "allowlist":
	default:
		return nil, usagef("--network must be blocked, allowlist or open, not %q", mode)
	}
	return &client.NetworkPolicy{Mode: mode, Allow: p.allow, Presets: p.presets}, nil
}

// sandboxTimeout sets when the server deletes (or, with on_timeout
// hibernate, hibernates) a sandbox: DURATION from now, 0 for never.
func sandboxTimeout(args []string) error {
	fs, cl := newClientFlags("sandbox timeout")
	pos, err := parseArgsN(fs, args, 2, "ID DURATION   (from now, e.g. 30m; 0: never)")
	if err != nil {
		return err
	}
	var d time.Duration
	if err := (durationFlag{&d}).Set(pos[1]); err != nil {
		return usagef("%v", err)
	}
	if d < 0 {
		return usagef("the timeout must not be negative")
	}
	c, ctx, stop, err := cl.connect()
	if err != nil {
		return err
	}
	defer stop()
	sb, err := c.SetTimeout(ctx, pos[0], d)
	if err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(sb)
	}
	if sb.ExpiresAt == nil {
		fmt.Fprintf(cl.out, "%s has no timeout\n", sb.ID)
	} else {
		fmt.Fprintf(cl.out, "%s expires %s (in %s)\n", sb.ID, sb.ExpiresAt.Local().Format(time.RFC3339), time.Until(*sb.ExpiresAt).Round(time.Second))
	}
	return nil
}

// sandboxSession prints a fresh data-plane session token: the credential
// for the data plane and for forwarded ports (X-Access-Token).
func sandboxSession(args []string) error {
	fs, cl := newClientFlags("sandbox session")
	pos, err := parseArgsN(fs, args, 1, "ID")
	if err != nil {
		return err
	}
	c, ctx, stop, err := cl.connect()
	if err != nil {
		return err
	}
	defer stop()
	s, err := c.NewSession(ctx, pos[0])
	if err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(s)
	}
	fmt.Fprintln(cl.out, s.Token)
	if f, ok := cl.out.(*os.File); ok && isTerminal(f) {
		fmt.Fprintf(cl.errOut, "(data plane %s; valid until %s; send it as the X-Access-Token header)\n",
			s.DataURL, s.ExpiresAt.Local().Format(time.RFC3339))
	}
	return nil
}

// sandboxNetwork replaces a running sandbox's egress policy.
func sandboxNetwork(args []string) error {
	fs, cl := newClientFlags("sandbox network")
	pf := addPolicyFlags(fs)
	pos, err := parseArgsN(fs, args, 1, "ID --network blocked|allowlist|open [--allow RULE]... [--preset NAME]...")
	if err != nil {
		return err
	}
	p, err := pf.policy()
	if err != nil {
		return err
	}
	if p == nil {
		return usagef("give --network, --allow or --preset")
	}
	c, ctx, stop, err := cl.connect()
	if err != nil {
		return err
	}
	defer stop()
	sb, err := c.SetNetwork(ctx, pos[0], *p)
	if err != nil {
		return err
	}
	if cl.json {
		return cl.printJSON(sb)
	}
	return writeFields(cl.out, policyRows(sb.Network))
}

func policyRows(p *client.NetworkPolicy) [][2]string {
	if p == nil {
		return [][2]string{{"network", "blocked"}}
	}
	return [][2]string{{"network", p.Mode}, {"allow", strings.Join(p.Allow, ", ")}, {"passthrough", strings.Join(p.Passthrough, ", ")},
		{"credentials", strings.Join(p.Credentials, ", ")}}
}

// sandboxNetLog prints a sandbox's egress decisions.
func sandboxNetLog(args []string) error {
	fs, cl := newClientFlags("sandbox netlog")
	after := fs.Uint64("after", 0, "only decisions after this sequence number")
	limit := fs.Int("limit", 100, "at most this many (1..1000)")
	pos, err := parseArgsN(fs, args, 1, "ID [--after N] [--limit N]")
	if err != nil {
		return err
	}
	if *limit < 1 || *limit > 1000 {
		return usagef("--limit must be 1..1000")
	}
	c, ctx, stop, err := cl.connect()
	if err != nil {
		return err
	}
	defer stop()
	l, err := c.NetworkLog(ctx, pos[0], *after, *limit)
	if err != nil {
		return err
	}
	if cl.json {
		if l.Decisions == nil {
			l.Decisions = []client.NetworkDecision{}
		}
		return cl.printJSON(l)
	}
	tw := tabwriter.NewWriter(cl.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tVERDICT\tPROTO\tDEST\tRULE/REASON")
	for _, d := range l.Decisions {
		dest := d.Name
		if dest == "" {
			dest = d.Dest
		}
		if d.Port != 0 {
			dest += ":" + strconv.Itoa(int(d.Port))
		}
		why := d.Rule
		if d.Reason != "" {
			why = d.Reason
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", d.Seq, d.Time.Local().Format("15:04:05"), d.Verdict, d.Proto, dest, why)
	}
	return tw.Flush()
}

// sandboxMetrics prints a sandbox's resource-usage samples.
func sandboxMetrics(args []string) error {
	fs, cl := newClientFlags("sandbox metrics")
	since := durationVar(fs, "since", 0, "samples of this last stretch, e.g. 10m (default: the server's)")
	pos, err := parseArgsN(fs, args, 1, "ID [--since 10m]")
	if err != nil {
		return err
	}
	c, ctx, stop, err := cl.connect()
	if err != nil {
		return err
	}
	defer stop()
	var start time.Time
	if *since > 0 {
		start = time.Now().Add(-*since)
	}
	list, err := c.Metrics(ctx, pos[0], start, time.Time{})
	if err != nil {
		return err
	}
	if cl.json {
		if list == nil {
			list = []client.Metric{}
		}
		return cl.printJSON(map[string]any{"metrics": list})
	}
	tw := tabwriter.NewWriter(cl.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tCPU\tMEMORY\tDISK")
	for _, m := range list {
		fmt.Fprintf(tw, "%s\t%.1f%% of %d\t%s / %s\t%s / %s\n", m.Timestamp.Local().Format("15:04:05"), m.CPUUsedPct, m.CPUCount,
			humanBytes(m.MemUsed), humanBytes(m.MemTotal), humanBytes(m.DiskUsed), humanBytes(m.DiskTotal))
	}
	return tw.Flush()
}

// networkSummary is a policy in one line for `sandbox get`.
func networkSummary(p *client.NetworkPolicy) string {
	if p == nil {
		return "blocked"
	}
	if p.Mode == "allowlist" && len(p.Allow) > 0 {
		return "allowlist: " + strings.Join(p.Allow, ", ")
	}
	return p.Mode
}

func autoPauseText(secs int64) string {
	if secs <= 0 {
		return "never"
	}
	return (time.Duration(secs) * time.Second).String()
}

// parseArgsN parses a verb's flags and wants n positional arguments.
func parseArgsN(fs *flag.FlagSet, args []string, n int, usage string) ([]string, error) {
	pos, err := parseClientArgs(fs, args)
	if err != nil {
		return nil, err
	}
	return pos, wantArgs(fs, pos, n, usage)
}
