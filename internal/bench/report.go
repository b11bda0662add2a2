package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Targets (from the performance issue).
const (
	TargetColdP50Ms     = 40.0
	TargetWarmP50Ms     = 5.0
	TargetExecP50Ms     = 3.0
	TargetStdoutMBps    = 300.0
	TargetIdleMiB       = 5.0
	TargetIdleAlive     = 500
	notMeasured         = "not measured"
	checkStdoutSubtitle = "stdout throughput"
)

func checks(r *Result) []Check {
	var out []Check
	add := func(name, target, value string, pass bool) {
		out = append(out, Check{Name: name, Target: target, Value: value, Pass: pass})
	}
	if r.Cold != nil {
		add("cold create→ready p50", fmt.Sprintf("≤ %.0f ms", TargetColdP50Ms), fmtMs(r.Cold.Create.P50), r.Cold.Create.P50 <= TargetColdP50Ms)
	} else {
		add("cold create→ready p50", fmt.Sprintf("≤ %.0f ms", TargetColdP50Ms), notMeasured, false)
	}
	if r.Warm != nil {
		add("warm create→ready p50", fmt.Sprintf("≤ %.0f ms", TargetWarmP50Ms), fmtMs(r.Warm.Create.P50), r.Warm.Create.P50 <= TargetWarmP50Ms)
	} else {
		add("warm create→ready p50", fmt.Sprintf("≤ %.0f ms", TargetWarmP50Ms), notMeasured, false)
	}
	if r.Exec != nil {
		add("exec `true` round trip p50", fmt.Sprintf("≤ %.0f ms", TargetExecP50Ms), fmtMs(r.Exec.P50), r.Exec.P50 <= TargetExecP50Ms)
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
		add("memory per idle sandbox", fmt.Sprintf("≤ %.0f MiB", TargetIdleMiB), fmt.Sprintf("%.2f MiB", r.Idle.PerSandboxMiB), r.Idle.PerSandboxMiB <= TargetIdleMiB)
		add("idle sandboxes alive at once", fmt.Sprintf("%d", TargetIdleAlive), fmt.Sprintf("%d of %d", r.Idle.Alive, r.Idle.Wanted), r.Idle.Alive >= TargetIdleAlive)
	} else {
		add("memory per idle sandbox", fmt.Sprintf("≤ %.0f MiB", TargetIdleMiB), notMeasured, false)
		add("idle sandboxes alive at once", fmt.Sprintf("%d", TargetIdleAlive), notMeasured, false)
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
	fmt.Fprintf(&b, "host: %s, kernel %s, %d CPUs (%s), %s RAM, cgroups %s, %s, load average at start %s\n\n",
		m.OS, m.Kernel, m.CPUs, m.CPUModel, m.MemTotal, m.Cgroups, m.Go, m.LoadAvg)
	tw := tabwriter.NewWriter(&b, 2, 8, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(tw, "latency (ms)\tn\tp50\tp95\tp99\tmax\t")
	row := func(name string, s Summary) {
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t\n", name, s.N, s.P50, s.P95, s.P99, s.Max)
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
	if c := r.Crun; c != nil && c.Skipped == "" {
		row("baseline: crun run /bin/true", c.Run)
	}
	tw.Flush()
	if c := r.Cold; c != nil {
		bd := c.Breakdown
		fmt.Fprintf(&b, "\ncold create breakdown (driver, p50 ms): namespaces %.2f, overlay %.2f, cgroups %.2f, network %.2f, agent ready %.2f (since clone, includes the steps before it), driver total %.2f; API/store/agent-config overhead ≈ %.2f\n",
			bd.Namespaces, bd.Overlay, bd.Cgroups, bd.Network, bd.AgentReady, bd.Total, c.Create.P50-bd.Total)
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
