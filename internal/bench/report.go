package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
)

// Targets (issue 25). The cold create is judged against `crun run` of the
// same rootfs in the same run, so host load cancels out; without a crun
// baseline the absolute TargetColdP50Ms applies.
const (
	TargetColdCrunRatio = 1.3
	TargetColdP50Ms     = 40.0
	TargetGVisorColdMs  = 150.0
	TargetWarmP50Ms     = 4.0
	TargetExecP50Ms     = 2.0
	TargetStdoutMBps    = 300.0
	TargetIdleMiB       = 1.3
	TargetIdleAlive     = 500
	TargetCyclesPerSec  = 100.0 // full cycles with TargetCyclesClients clients
	TargetRunningP50Ms  = 100.0 // create→running p50 with TargetCyclesClients clients
	TargetCyclesClients = 16
	notMeasured         = "not measured"
	checkStdoutSubtitle = "stdout throughput"
	checkColdName       = "cold create→ready p50"
	checkCyclesName     = "full cycles/s"
	checkRunningName    = "create→running p50"
)

// crunP50 is the crun baseline's p50 in ms, 0 if it was not measured.
func crunP50(r *Result) float64 {
	if r.Crun == nil || r.Crun.Skipped != "" || r.Crun.Run.N == 0 {
		return 0
	}
	return r.Crun.Run.P50
}

// ratio formats v/base as "1.23×", or "—" without a base.
func ratio(v, base float64) string {
	if base <= 0 || v <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", v/base)
}

func checks(r *Result) []Check {
	var out []Check
	add := func(name, target, value string, pass bool) {
		out = append(out, Check{Name: name, Target: target, Value: value, Pass: pass})
	}
	crun := crunP50(r)
	switch {
	case r.Cold == nil:
		add(checkColdName, "≤ 1.3 × crun", notMeasured, false)
	case r.Driver == "gvisor":
		add(checkColdName+" (gVisor)", fmt.Sprintf("≤ %.0f ms", TargetGVisorColdMs), fmtMs(r.Cold.Create.P50), r.Cold.Create.P50 <= TargetGVisorColdMs)
	case crun > 0:
		add(checkColdName, fmt.Sprintf("≤ %.1f × crun (%s)", TargetColdCrunRatio, fmtMs(crun)), fmtMs(r.Cold.Create.P50)+" = "+ratio(r.Cold.Create.P50, crun),
			r.Cold.Create.P50 <= TargetColdCrunRatio*crun)
	default:
		add(checkColdName, fmt.Sprintf("≤ %.0f ms (no crun baseline)", TargetColdP50Ms), fmtMs(r.Cold.Create.P50), r.Cold.Create.P50 <= TargetColdP50Ms)
	}
	if r.Warm != nil {
		add("warm create→ready p50", fmt.Sprintf("≤ %.1f ms", TargetWarmP50Ms), fmtMs(r.Warm.Create.P50), r.Warm.Create.P50 <= TargetWarmP50Ms)
	} else {
		add("warm create→ready p50", fmt.Sprintf("≤ %.1f ms", TargetWarmP50Ms), notMeasured, false)
	}
	if r.Exec != nil {
		v := fmtMs(r.Exec.P50)
		if r.ExecHost != nil && r.ExecHost.N > 0 {
			v += " (" + fmtMs(r.ExecHost.P50) + " of it is `true` itself, run on the host)"
		}
		add("exec `true` round trip p50", fmt.Sprintf("≤ %.0f ms", TargetExecP50Ms), v, r.Exec.P50 <= TargetExecP50Ms)
	} else {
		add("exec `true` round trip p50", fmt.Sprintf("≤ %.0f ms", TargetExecP50Ms), notMeasured, false)
	}
	if r.Stdout != nil {
		// Judged on the platform's best transport (binary frames) with a
		// producer that does not itself eat a CPU (dd, 1 MiB writes); the
		// report prints every combination.
		best := r.Stdout.FramesLargeMedian
		add(checkStdoutSubtitle+" (dd, frames)", fmt.Sprintf("≥ %.0f MB/s", TargetStdoutMBps), fmt.Sprintf("%.0f MB/s", best), best >= TargetStdoutMBps)
	} else {
		add(checkStdoutSubtitle, fmt.Sprintf("≥ %.0f MB/s", TargetStdoutMBps), notMeasured, false)
	}
	if r.Idle != nil && r.Idle.Created > 0 {
		add("memory per idle sandbox", fmt.Sprintf("≤ %.1f MiB", TargetIdleMiB), fmt.Sprintf("%.2f MiB", r.Idle.PerSandboxMiB), r.Idle.PerSandboxMiB <= TargetIdleMiB)
		add("idle sandboxes alive at once", fmt.Sprintf("%d", TargetIdleAlive), fmt.Sprintf("%d of %d", r.Idle.Alive, r.Idle.Wanted), r.Idle.Alive >= TargetIdleAlive)
	} else {
		add("memory per idle sandbox", fmt.Sprintf("≤ %.1f MiB", TargetIdleMiB), notMeasured, false)
		add("idle sandboxes alive at once", fmt.Sprintf("%d", TargetIdleAlive), notMeasured, false)
	}
	cyc := fmt.Sprintf("%s, %d clients", checkCyclesName, TargetCyclesClients)
	run := fmt.Sprintf("%s, %d clients", checkRunningName, TargetCyclesClients)
	if l := levelAt(r.Concurrency, TargetCyclesClients); l != nil {
		add(cyc, fmt.Sprintf("≥ %.0f", TargetCyclesPerSec), fmt.Sprintf("%.1f", l.CyclesPerSec), l.CyclesPerSec >= TargetCyclesPerSec)
		add(run, fmt.Sprintf("≤ %.0f ms", TargetRunningP50Ms), fmtMs(l.Running.P50), l.Running.P50 <= TargetRunningP50Ms)
	} else {
		add(cyc, fmt.Sprintf("≥ %.0f", TargetCyclesPerSec), notMeasured, false)
		add(run, fmt.Sprintf("≤ %.0f ms", TargetRunningP50Ms), notMeasured, false)
	}
	return out
}

func fmtMs(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.2f ms", v)
}

func fmtCPU(c CPUUse) string {
	return fmt.Sprintf("command %.2f s, sandbox agent %.2f s, server+client %.2f s = %.2f CPU-s in %.2f s wall",
		c.Command, c.Agent, c.Host, c.Total(), c.Wall)
}

func passMiss(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// WriteText prints the human report.
func WriteText(w io.Writer, r *Result) error {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "SPACE bench — %s driver — %s\n", r.Driver, r.Date.Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "host: %s, kernel %s, %d CPUs (%s), %s RAM, cgroups %s, %s, load average at start %s\n",
		m.OS, m.Kernel, m.CPUs, m.CPUModel, m.MemTotal, m.Cgroups, m.Go, m.LoadAvg)
	if m.DataFS != "" {
		fmt.Fprintf(&b, "data dir: %s\n", m.DataFS)
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 2, 8, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	crun := crunP50(r)
	fmt.Fprintln(tw, "latency (ms)\tn\tp50\tp95\tp99\tmax\tp50 / crun p50\t")
	row := func(name string, s Summary) {
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t\n", name, s.N, s.P50, s.P95, s.P99, s.Max, ratio(s.P50, crun))
	}
	if c := r.Cold; c != nil {
		row("cold create→ready (POST → op succeeded)", c.Create)
		row("  cold: create operation, server clock", c.ServerOp)
		row("first exec after create", c.FirstExec)
		row("delete (DELETE → op succeeded)", c.Delete)
		row("create→exec→delete cycle", c.Cycle)
	}
	if r.Warm != nil {
		row(fmt.Sprintf("warm create→ready (pool %d)", r.Warm.Pool), r.Warm.Create)
		row("  warm: create operation, server clock", r.Warm.ServerOp)
	}
	if r.Exec != nil {
		row("exec `/bin/true` round trip (POST + SSE to exit)", *r.Exec)
	}
	if r.ExecHost != nil {
		row("  floor: the same /bin/true run on the host", *r.ExecHost)
	}
	if c := r.Crun; c != nil && c.Skipped == "" {
		row("baseline: crun run /bin/true", c.Run)
	}
	tw.Flush()
	if c := r.Cold; c != nil {
		bd := c.Breakdown
		hard := ""
		if bd.Hardening > 0 {
			hard = fmt.Sprintf("; of it the agent's hardening + seccomp install %.2f", bd.Hardening)
		}
		fmt.Fprintf(&b, "\ncold create breakdown (driver, p50 ms): namespaces %.2f, overlay %.2f, cgroups %.2f, network %.2f, agent ready %.2f (since clone, includes the steps before it%s), driver total %.2f; API/store/agent-config overhead ≈ %.2f\n",
			bd.Namespaces, bd.Overlay, bd.Cgroups, bd.Network, bd.AgentReady, hard, bd.Total, c.Create.P50-bd.Total)
	}
	if r.Warm != nil {
		fmt.Fprintf(&b, "warm pool: %s\n", r.Warm.Mode)
	}
	if s := r.Stdout; s != nil {
		fmt.Fprintf(&b, "stdout: %q, %d MiB per run, streamed over SSE and base64-decoded by the client: %v MB/s (median %.0f MB/s; MB = 10^6 bytes; %d bytes per event)\n",
			strings.Join(s.Argv, " "), s.Bytes>>20, s.MBps, s.Median, s.AvgEvent)
		fmt.Fprintf(&b, "  CPU per run: %s\n", fmtCPU(s.CPU))
		fmt.Fprintf(&b, "  the halves apart: command → node's output log %.0f MB/s (no reader), node's log → client %.0f MB/s (replay)\n",
			s.ProduceMBps, s.ReplayMBps)
		if len(s.LargeWritesArgv) > 0 {
			fmt.Fprintf(&b, "  same bytes written 1 MiB at a time (%q): %.0f MB/s (%d bytes per event); CPU: %s\n",
				strings.Join(s.LargeWritesArgv, " "), s.LargeWritesMBps, s.LargeWritesAvgEvent, fmtCPU(s.LargeWritesCPU))
		}
		if len(s.FramesMBps) > 0 {
			fmt.Fprintf(&b, "  binary frame stream (Accept: application/x-space-events, no base64): head %v MB/s (median %.0f), dd %v MB/s (median %.0f)\n",
				s.FramesMBps, s.FramesMedian, s.FramesLargeWritesMBps, s.FramesLargeMedian)
		}
	}
	if i := r.Idle; i != nil {
		fmt.Fprintf(&b, "idle: %d created (%.1f s), %d answered a command; MemAvailable %d → %d KiB = %.2f MiB per sandbox; deleted in %.1f s\n",
			i.Created, i.CreateSeconds, i.Alive, i.MemAvailBefore, i.MemAvailAfter, i.PerSandboxMiB, i.DeleteSeconds)
		var parts []string
		for _, k := range meminfoKeys {
			if v, ok := i.MeminfoKiB[k]; ok {
				parts = append(parts, fmt.Sprintf("%s %.0f", k, v))
			}
		}
		fmt.Fprintf(&b, "  per sandbox: charged to its cgroups %.2f MiB, to the server's cgroup %.2f MiB; server RSS growth %.2f MiB; meminfo KiB: %s; agent (PID 1) RSS %d KiB, PSS %d KiB, %.1f threads\n",
			i.CgroupPerMiB, i.ParentPerMiB, i.ServerRSSPerMiB, strings.Join(parts, ", "), i.AgentRSSKiB, i.AgentPSSKiB, i.AgentThreads)
	}
	if c := r.Crun; c != nil {
		if c.Skipped != "" {
			fmt.Fprintf(&b, "baseline: %s\n", c.Skipped)
		} else {
			fmt.Fprintf(&b, "baseline: %s, cgroups %s; same rootfs read-only, namespaces pid,net,ipc,uts,mount (no user namespace)\n", c.Version, c.Cgroups)
			if c.Notes != "" {
				fmt.Fprintf(&b, "baseline note: %s\n", c.Notes)
			}
		}
	}
	if p := r.Ports; p != nil {
		writePorts(&b, p)
	}
	if len(r.Concurrency) > 0 {
		writeConcurrency(&b, r.Concurrency, crun)
	}
	fmt.Fprintln(&b, "\ntargets:")
	tw = tabwriter.NewWriter(&b, 2, 8, 2, ' ', 0)
	for _, c := range r.Checks {
		fmt.Fprintf(tw, "  %s\t%s\ttarget %s\t%s\n", c.Name, c.Value, c.Target, passMiss(c.Pass))
	}
	tw.Flush()
	for _, e := range r.Errors {
		fmt.Fprintf(&b, "error: %s\n", e)
	}
	fmt.Fprintf(&b, "took %.0f s\n", r.Duration)
	_, err := io.WriteString(w, b.String())
	return err
}

// writePorts prints the port benchmark's table.
func writePorts(b *strings.Builder, p *PortsResult) {
	fmt.Fprintf(b, "\nforwarded port vs direct (%d small requests, %d of 1 MiB; %d keep-alive clients for the concurrent phase; sandbox CPU limit %.0f):\n",
		p.Requests, p.Direct.Large.Sequential.N, p.Clients, p.SandboxCPUs)
	tw := tabwriter.NewWriter(b, 2, 8, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(tw, "path\tseq p50 ms\tseq p99 ms\tconc p50 ms\tconc p99 ms\treq/s\tMB/s\tbench CPU µs/req\tagent µs/req\tserver µs/req\t")
	row := func(name string, l PortLoad) {
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.3f\t%.3f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t\n", name, l.Sequential.P50, l.Sequential.P99,
			l.Concurrent.P50, l.Concurrent.P99, l.RequestsPS, l.MBps, l.HostCPUUs, l.AgentCPUUs, l.ServerCPUUs)
	}
	row("direct, small", p.Direct.Small)
	row("forwarded, small", p.Forwarded.Small)
	row("direct, 1 MiB", p.Direct.Large)
	row("forwarded, 1 MiB", p.Forwarded.Large)
	tw.Flush()
	fmt.Fprintf(b, "  added sequential p50: %.3f ms small, %.3f ms 1 MiB\n  %s\n", p.AddedP50Small, p.AddedP50Large, p.Notes)
}

// figure is one number of a Result that --compare follows.
type figure struct {
	name        string
	unit        string
	value       float64
	lowerBetter bool
}

// figures lists a Result's comparable numbers; a part that was not
// measured gives none.
func figures(r *Result) []figure {
	var out []figure
	lat := func(name string, v float64) {
		if v > 0 {
			out = append(out, figure{name, "ms", v, true})
		}
	}
	if c := r.Cold; c != nil {
		lat("cold create→ready p50", c.Create.P50)
		lat("cold create→ready p95", c.Create.P95)
		lat("  create operation (server) p50", c.ServerOp.P50)
		lat("  driver: namespaces p50", c.Breakdown.Namespaces)
		lat("  driver: overlay p50", c.Breakdown.Overlay)
		lat("  driver: cgroups p50", c.Breakdown.Cgroups)
		lat("  driver: network p50", c.Breakdown.Network)
		lat("  driver: agent ready p50", c.Breakdown.AgentReady)
		lat("  agent: hardening + seccomp p50", c.Breakdown.Hardening)
		lat("  driver: total p50", c.Breakdown.Total)
		lat("first exec after create p50", c.FirstExec.P50)
		lat("delete p50", c.Delete.P50)
		lat("create→exec→delete cycle p50", c.Cycle.P50)
	}
	if r.Warm != nil {
		lat("warm create→ready p50", r.Warm.Create.P50)
	}
	if r.Exec != nil {
		lat("exec `true` round trip p50", r.Exec.P50)
	}
	if r.ExecHost != nil {
		lat("  `true` on the host p50", r.ExecHost.P50)
	}
	crun := crunP50(r)
	lat("crun run p50", crun)
	if r.Cold != nil && crun > 0 {
		out = append(out, figure{"cold create p50 / crun p50", "×", round2(r.Cold.Create.P50 / crun), true})
	}
	if s := r.Stdout; s != nil {
		out = append(out, figure{"stdout SSE (head) median", "MB/s", s.Median, false},
			figure{"stdout frames (dd) median", "MB/s", s.FramesLargeMedian, false})
	}
	if i := r.Idle; i != nil && i.Created > 0 {
		out = append(out, figure{"memory per idle sandbox", "MiB", i.PerSandboxMiB, true},
			figure{"  charged to its cgroups", "MiB", i.CgroupPerMiB, true},
			figure{"  agent PSS", "KiB", float64(i.AgentPSSKiB), true})
	}
	for _, l := range r.Concurrency {
		out = append(out, figure{fmt.Sprintf("%d clients: cycles/s", l.Clients), "/s", l.CyclesPerSec, false})
		lat(fmt.Sprintf("%d clients: create→running p50", l.Clients), l.Running.P50)
		lat(fmt.Sprintf("%d clients: first command p50", l.Clients), l.FirstCommand.P50)
		lat(fmt.Sprintf("%d clients: first command p99", l.Clients), l.FirstCommand.P99)
		if l.CPUPerCycleMS > 0 {
			out = append(out, figure{fmt.Sprintf("%d clients: CPU per cycle", l.Clients), "ms", l.CPUPerCycleMS, true})
		}
	}
	if p := r.Ports; p != nil {
		lat("forwarded port small p50", p.Forwarded.Small.Sequential.P50)
	}
	return out
}

// WriteCompare prints each figure of now beside the same figure of an
// earlier report, with the change; figures only one of them has are left
// out.
func WriteCompare(w io.Writer, earlier, now *Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "change against the report of %s (load %s; now load %s):\n",
		earlier.Date.Format("2006-01-02 15:04 MST"), orDash(earlier.Machine.LoadAvg), orDash(now.Machine.LoadAvg))
	old := map[string]figure{}
	for _, f := range figures(earlier) {
		old[f.name] = f
	}
	tw := tabwriter.NewWriter(&b, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  figure\tearlier\tnow\tchange\t")
	rows := 0
	for _, f := range figures(now) {
		o, ok := old[f.name]
		if !ok || o.value == 0 {
			continue
		}
		rows++
		pct := 100 * (f.value - o.value) / o.value
		verdict := ""
		switch {
		case pct > 5 && f.lowerBetter, pct < -5 && !f.lowerBetter:
			verdict = " worse"
		case pct < -5 && f.lowerBetter, pct > 5 && !f.lowerBetter:
			verdict = " better"
		}
		fmt.Fprintf(tw, "  %s\t%s %s\t%s %s\t%+.1f %%%s\t\n", f.name, fmtNum(o.value), o.unit, fmtNum(f.value), f.unit, pct, verdict)
	}
	tw.Flush()
	if rows == 0 {
		fmt.Fprintln(&b, "  (no figure in common)")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// ReadResult reads a report `space bench --out` (or --json) wrote.
func ReadResult(path string) (*Result, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	var r Result
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("bench: %s: %w", path, err)
	}
	if r.Date.IsZero() {
		return nil, fmt.Errorf("bench: %s is not a `space bench` report", path)
	}
	return &r, nil
}
