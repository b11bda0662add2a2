// Package attrs holds the table of security attributes by creation path
// (issue 22): what each way of making a sandbox does with each attribute.
// docs/security.md shows Markdown() (test/docs checks it is current);
// attrs_test.go (native API) and test/e2b's attrs.test.mjs (the e2b SDK)
// test every cell.
package attrs

import "strings"

// Paths are the table's columns: every way a sandbox comes to run.
func Paths() []string {
	return []string{
		"create (native and E2B)",
		"warm-pool hand-out",
		"fork of a snapshot (native)",
		"create from a snapshot (E2B v1/v2)",
		"hibernate → resume",
		"auto-resume",
		"template-build `RUN`",
	}
}

// Row is one attribute and its rule on every path, in Paths' order.
type Row struct {
	Attribute string
	Cells     []string
}

// Table is the rule set. "request, else source's": a value the request
// sets wins, an unset one is the snapshot's source sandbox's (server
// defaults when that record was pruned). "kept": the sandbox keeps its
// record, so nothing changes.
func Table() []Row {
	return []Row{
		{"public ports (and E2B's traffic token)", []string{
			"request: native private unless `public_ports`; E2B public unless `allowPublicTraffic: false`, which returns a `trafficAccessToken`",
			"as create", "request, else source's", "request's `allowPublicTraffic`, else source's (private answers a `trafficAccessToken`)",
			"kept", "kept (a public one also wakes for a request without a token)", "none: a build sandbox has no session and no forwarded ports",
		}},
		{"network policy", []string{
			"request, else blocked", "as create (blocked until handed out)", "request, else source's", "request, else source's",
			"kept (applied to the new instance before it runs)", "kept", "blocked (`RUN` has no network)",
		}},
		{"credentials", []string{
			"request (`network.credentials`)", "as create", "with the network policy: request, else source's", "with the network policy: request, else source's",
			"kept", "kept", "none",
		}},
		{"limits (cpu, memory, pids, disk)", []string{
			"request, else server defaults", "as create (a disk size other than the default skips the pool)", "request field by field, else source's",
			"source's (E2B sets none)", "kept", "kept", "server defaults",
		}},
		{"default user", []string{
			"template's", "template's", "snapshot's template's", "snapshot's template's", "kept", "kept", "the build file's `USER`",
		}},
		{"timeout, on-timeout, auto-pause, auto-resume", []string{
			"request, else server default timeout and none of the others", "as create", "request, else source's",
			"request (the SDK always sends a timeout), else source's", "kept; the clock restarts with the time that was left", "kept", "1 h per step; none of the others",
		}},
	}
}

// Markdown renders the table as docs/security.md carries it.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| attribute | " + strings.Join(Paths(), " | ") + " |\n|---|")
	b.WriteString(strings.Repeat("---|", len(Paths())) + "\n")
	for _, r := range Table() {
		b.WriteString("| " + r.Attribute + " | " + strings.Join(r.Cells, " | ") + " |\n")
	}
	return b.String()
}
