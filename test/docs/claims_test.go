package docs

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/space-sandbox/space/internal/api"
	"github.com/space-sandbox/space/internal/node"
	"github.com/space-sandbox/space/test/testenv"
)

// readDocs returns README.md and docs/*.md by their path from the root.
func readDocs(t *testing.T) map[string]string {
	t.Helper()
	root := testenv.RepoRoot()
	files, err := docFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		out[f] = string(b)
	}
	return out
}

// serverHelp builds `space` and returns what `space server -h` prints: the
// flags the code really has, with their defaults.
func serverHelp(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "space")
	build := exec.Command("go", "build", "-o", bin, "./cmd/space")
	build.Dir = testenv.RepoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	help, _ := exec.Command(bin, "server", "-h").CombinedOutput()
	if !strings.Contains(string(help), "-data-dir") {
		t.Fatalf("space server -h printed no flags:\n%s", help)
	}
	return string(help)
}

// lineOf is the 1-based line of byte offset i in s.
func lineOf(s string, i int) int { return strings.Count(s[:i], "\n") + 1 }

// notYet returns the "Not yet" paragraphs and sections of a document: from
// a line starting "Not yet" or a "## Not yet" heading to the next blank
// line or heading.
func notYet(doc string) []string {
	var out []string
	lines := strings.Split(doc, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "Not yet") && !strings.HasPrefix(l, "## Not yet") {
			continue
		}
		var b strings.Builder
		for j := i; j < len(lines); j++ {
			if j > i && (strings.HasPrefix(lines[j], "#") || strings.TrimSpace(lines[j]) == "" && !strings.HasPrefix(l, "##")) {
				break
			}
			b.WriteString(lines[j] + "\n")
		}
		out = append(out, b.String())
	}
	return out
}

// TestDocClaims checks what the documents say about limits, defaults and
// missing features against the code, for the claims that once drifted
// (issue 30): disk limits exist, kept output is bounded per sandbox by
// --max-output-bytes with node.DefaultMaxLogBytes as the default, admin
// keys list across projects, pause works with egress. Needs no root.
func TestDocClaims(t *testing.T) {
	docs := readDocs(t)
	help := serverHelp(t)
	hasFlag := func(name string) bool {
		return strings.Contains(help, "  -"+name+" ") || strings.Contains(help, "  -"+name+"\n")
	}
	diskLimits := hasFlag("max-disk-bytes") && hasFlag("default-disk-bytes")
	if !hasFlag("max-output-bytes") {
		t.Fatalf("space server -h has no --max-output-bytes; update this test and the docs")
	}
	outMiB := node.DefaultMaxLogBytes >> 20

	var openapi struct {
		Paths map[string]map[string]struct {
			Parameters []struct{ Name string } `json:"parameters"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI(), &openapi); err != nil {
		t.Fatal(err)
	}
	allProjects := false
	for _, p := range openapi.Paths["/v1/sandboxes"]["get"].Parameters {
		allProjects = allProjects || p.Name == "all_projects"
	}

	// Sentences that contradict the code when its fact holds.
	forbidden := []struct {
		re   *regexp.Regexp
		fact bool
		why  string
	}{
		{regexp.MustCompile(`(?i)no per-sandbox (disk )?(quota|limit)`), diskLimits,
			"space server has --default-disk-bytes/--max-disk-bytes: per-sandbox disk limits exist"},
		{regexp.MustCompile(`(?i)(writable layers? (have|has) no size limit|nothing yet: the writable)`), diskLimits,
			"disk limits exist (--default-disk-bytes/--max-disk-bytes)"},
		{regexp.MustCompile(`(?i)(capped at|at most) \d+ ?[KMG]i?B per command|each command keeps at most`), true,
			"kept output is bounded per sandbox, all its commands together (node.Options.MaxLogBytes, --max-output-bytes)"},
		{regexp.MustCompile(`(?i)no cross-project (admin )?view`), allProjects,
			"GET /v1/sandboxes takes ?all_projects=true for admin keys"},
		{regexp.MustCompile(`(?i)(pause|snapshots?)[^.|]*do(es)? not work yet with .?--egress`), true,
			"pause, hibernate and snapshots work with --egress (test/integration's egress and snapshot tests run them together)"},
		{regexp.MustCompile(`(?i)run without egress for now`), true,
			"pause and snapshots work with --egress"},
	}
	for file, doc := range docs {
		for _, f := range forbidden {
			if !f.fact {
				continue
			}
			for _, m := range f.re.FindAllStringIndex(doc, -1) {
				t.Errorf("%s:%d says %q, but %s", file, lineOf(doc, m[0]), doc[m[0]:m[1]], f.why)
			}
		}
		for _, para := range notYet(doc) {
			if diskLimits && regexp.MustCompile(`(?i)disk (quota|limit)`).MatchString(para) {
				t.Errorf("%s: a \"Not yet\" list names disk quotas or limits, which exist (--max-disk-bytes):\n%s", file, para)
			}
		}
		// Every default stated for --max-output-bytes is the code's.
		stated := regexp.MustCompile("`--max-output-bytes`[^|\n]{0,40}?\\(?(?:default )?(\\d+) ?(MiB|M)\\b")
		for _, m := range stated.FindAllStringSubmatchIndex(doc, -1) {
			n, _ := strconv.Atoi(doc[m[2]:m[3]])
			if n != outMiB {
				t.Errorf("%s:%d gives --max-output-bytes a default of %d MiB; the code's is %d MiB (node.DefaultMaxLogBytes)", file, lineOf(doc, m[0]), n, outMiB)
			}
		}
	}

	// Rows that must say what the code does.
	row := func(file, start string) string {
		for _, l := range strings.Split(docs[file], "\n") {
			if strings.HasPrefix(l, start) {
				return l
			}
		}
		t.Errorf("%s has no row starting %q", file, start)
		return ""
	}
	outDefault := fmt.Sprintf("%d MiB", outMiB)
	for _, c := range []struct{ file, row, want string }{
		{"docs/troubleshooting.md", "| `410 events_gone`", "`--max-output-bytes`, default " + outDefault},
		{"docs/troubleshooting.md", "| `410 events_gone`", "`dropped`"},
		{"docs/configuration.md", "| `--max-output-bytes`", fmt.Sprintf("| `%dM` |", outMiB)},
		{"docs/configuration.md", "| `<data-dir>/logs/", "`--max-output-bytes` (default " + outDefault + ")"},
		{"docs/troubleshooting.md", "| `loop_devices`", "disk limits"},
	} {
		if r := row(c.file, c.row); r != "" && !strings.Contains(r, c.want) {
			t.Errorf("%s: the row %s… should say %q:\n%s", c.file, c.row, c.want, r)
		}
	}
	sec := docs["docs/security.md"]
	if i := strings.Index(sec, "**Disk space.**"); i < 0 {
		t.Error("docs/security.md has no **Disk space.** item")
	} else if item := sec[i:min(len(sec), i+800)]; !strings.Contains(item, "--max-disk-bytes") || !strings.Contains(item, "(default "+outDefault+")") {
		t.Errorf("docs/security.md's disk item should name the disk limit flags and the %s output bound:\n%s", outDefault, item)
	}
}
