// Package docs runs the shell blocks of the documentation (README.md and
// every docs/*.md) against a fresh `space server`, with SPACE_URL and
// SPACE_API_KEY set, SPACE_DATA_DIR naming the server's data dir (as
// scripts/quickstart.sh reads it) and `space` on the PATH. Each file runs in its own bash,
// block by block, in order: variables, functions and the working directory
// carry from one block to the next as they would for a reader, and every
// failing block is reported as file:line with its output.
//
// Convention for blocks that are not run: put
//
//	<!-- no-test: TAG: why -->
//
// on the line(s) before the ```sh block, where TAG is one of noTestTags
// (needs-kvm, needs-k8s, needs-host, needs-network, needs-postgres,
// test-suite, placeholder, setup). Every other ```sh, ```bash or ```shell
// block is run. Needs root; the Debian `base` template too when
// SPACE_TEST_BASE=1.
package docs

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

// noTestTags are the reasons a block may give for not being run.
var noTestTags = map[string]string{
	"needs-kvm":      "needs /dev/kvm (firecracker, qemu with KVM)",
	"needs-k8s":      "needs a Kubernetes cluster",
	"needs-host":     "changes the host: installs packages, systemd units, starts long-running servers",
	"needs-network":  "needs the internet or a server started with --egress",
	"needs-postgres": "needs a PostgreSQL server",
	"test-suite":     "runs the Go test suite or benchmarks (CI runs those itself)",
	"placeholder":    "holds values the reader fills in (ids, keys, hosts)",
	"setup":          "builds, starts or keys what the docs test sets up itself",
}

// docFiles lists README.md and docs/*.md, relative to root.
func docFiles(root string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	out := []string{"README.md"}
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		out = append(out, rel)
	}
	return out, nil
}

// block is one fenced ```sh block.
type block struct {
	Line   int    // line of the opening fence
	Code   string // the block's text
	NoTest string // the reason given in a preceding <!-- no-test: ... -->
}

// extract returns the ```sh blocks of a Markdown document. A no-test comment
// applies to the block that follows it (blank lines between are allowed).
func extract(doc string) ([]block, error) {
	var out []block
	var cur *block
	var body []string
	pending := ""
	sc := bufio.NewScanner(strings.NewReader(doc))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	n := 0
	fence := ""
	for sc.Scan() {
		n++
		line := sc.Text()
		trim := strings.TrimSpace(line)
		if cur != nil {
			if trim == fence {
				cur.Code = strings.Join(body, "\n") + "\n"
				out = append(out, *cur)
				cur, body, fence = nil, nil, ""
				continue
			}
			body = append(body, line)
			continue
		}
		if fence != "" { // inside a non-sh fence
			if trim == fence {
				fence = ""
			}
			continue
		}
		switch {
		case strings.HasPrefix(trim, "<!-- no-test:") && strings.HasSuffix(trim, "-->"):
			pending = strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(trim, "<!-- no-test:"), "-->"))
			tag, _, _ := strings.Cut(pending, ":")
			if _, ok := noTestTags[strings.TrimSpace(tag)]; !ok {
				return nil, fmt.Errorf("line %d: no-test needs `TAG: reason` with TAG one of %s", n, tagList())
			}
		case strings.HasPrefix(trim, "```"):
			f := trim[:len(trim)-len(strings.TrimLeft(trim, "`"))]
			lang, _, _ := strings.Cut(strings.TrimSpace(strings.TrimPrefix(trim, f)), " ")
			if lang == "sh" || lang == "bash" || lang == "shell" {
				cur = &block{Line: n, NoTest: pending}
				fence = f
			} else {
				fence = f
				if pending != "" {
					return nil, fmt.Errorf("line %d: no-test comment before a %q block (only sh blocks are run)", n, lang)
				}
			}
			pending = ""
		case trim == "":
		default:
			if pending != "" {
				return nil, fmt.Errorf("line %d: no-test comment not followed by a block", n)
			}
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("line %d: unterminated code block", cur.Line)
	}
	return out, sc.Err()
}

func tagList() string {
	tags := make([]string, 0, len(noTestTags))
	for t := range noTestTags {
		tags = append(tags, t)
	}
	sort.Strings(tags)
	return strings.Join(tags, ", ")
}

func TestExtract(t *testing.T) {
	doc := "# t\n\n```sh\necho a\n```\n\n<!-- no-test: needs-kvm: firecracker -->\n\n```sh\nkvm\n```\n\n```go\nx := 1\n```\n````sh\necho '```'\n````\n"
	got, err := extract(doc)
	if err != nil {
		t.Fatal(err)
	}
	want := []block{{3, "echo a\n", ""}, {9, "kvm\n", "needs-kvm: firecracker"}, {16, "echo '```'\n", ""}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("extract = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"<!-- no-test: setup: x -->\ntext\n", "<!-- no-test: because -->\n```sh\nx\n```\n"} {
		if _, err := extract(bad); err == nil {
			t.Fatalf("%q must be an error", bad)
		}
	}
}

// prelude defines the state dump each block ends with: variables (less
// bash's own and read-only ones), functions and the working directory.
const prelude = `set -uo pipefail
__space_state=$(mktemp)
__space_dump() {
  declare -p | grep -Ev '^declare -[^ ]*r[^ ]* ' |
    grep -Ev '^declare -[^ ]* (BASH[A-Z_]*|EUID|PPID|UID|GROUPS|FUNCNAME|PIPESTATUS|SHELLOPTS|BASHOPTS|RANDOM|SRANDOM|SECONDS|LINENO|HISTCMD|EPOCHREALTIME|EPOCHSECONDS|DIRSTACK|COMP_WORDBREAKS|_|OPTIND|OPTERR|__space_state|__space_rc)='
  declare -f
  printf 'cd %q\n' "$PWD"
}
`

// script turns a document's runnable blocks into one bash script. Each block
// runs in a subshell with errexit, so a failure ends that block only; its
// state is carried into the next one. Markers delimit every block's output.
func script(name string, blocks []block) (string, int) {
	var b strings.Builder
	b.WriteString(prelude)
	ran := 0
	for _, bl := range blocks {
		if bl.NoTest != "" {
			continue
		}
		ran++
		fmt.Fprintf(&b, "echo '>>> %s:%d'\n(\nset -e\n%s__space_dump > \"$__space_state\"\n) </dev/null; __space_rc=$?\n", name, bl.Line, bl.Code)
		fmt.Fprintf(&b, "echo \"<<< %s:%d rc=$__space_rc\"\nif [ $__space_rc -eq 0 ]; then . \"$__space_state\"; fi\n", name, bl.Line)
	}
	b.WriteString("rm -f \"$__space_state\"\necho '>>> done'\n")
	return b.String(), ran
}

var endRE = regexp.MustCompile(`^<<< (\S+) rc=(\d+)$`)

// baseRE finds blocks that use the Debian base template.
var baseRE = regexp.MustCompile(`template"?[ :=]+"?base\b`)

// failures returns "file:line (exit N)" and the output of every failed
// block in out.
func failures(out string) (failed []string, outputs map[string]string) {
	outputs = map[string]string{}
	var cur []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, ">>> ") {
			cur = nil
			continue
		}
		if m := endRE.FindStringSubmatch(l); m != nil {
			if rc, _ := strconv.Atoi(m[2]); rc != 0 {
				key := fmt.Sprintf("%s (exit %d)", m[1], rc)
				failed = append(failed, key)
				outputs[key] = strings.Join(cur, "\n")
			}
			continue
		}
		cur = append(cur, l)
	}
	return failed, outputs
}

func TestScriptReportsEveryFailingBlock(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	blocks := []block{{1, "X=1\nf() { echo \"f$X\"; }\nmkdir -p sub; cd sub\n", ""}, {5, "false\necho not reached\n", ""},
		{9, "echo skipped\n", "setup: x"}, {12, "test \"$(f)\" = f1\ntest \"${PWD##*/}\" = sub\nY=2\n", ""}, {20, "exit 4\n", ""},
		{30, "test \"$Y\" = 2\n", ""}}
	sh, ran := script("doc.md", blocks)
	if ran != 5 {
		t.Fatalf("ran %d", ran)
	}
	cmd := exec.Command("bash", "-c", sh)
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), ">>> done") {
		t.Fatalf("script: %v\n%s", err, out)
	}
	failed, _ := failures(string(out))
	if fmt.Sprint(failed) != "[doc.md:5 (exit 1) doc.md:20 (exit 4)]" {
		t.Fatalf("failed = %v\n%s", failed, out)
	}
	if strings.Contains(string(out), "not reached") || strings.Contains(string(out), "skipped") {
		t.Fatalf("ran what it should not:\n%s", out)
	}
}

func TestDocs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces, cgroups, overlayfs) to run a real server")
	}
	for _, tool := range []string{"bash", "curl", "jq", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not on PATH: the documented commands need it", tool)
		}
	}
	root := testenv.RepoRoot()
	files, err := docFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := testenv.New("space-docs-")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Remove()
	defer srv.RemoveCgroupBase()
	builtins := "minimal"
	if os.Getenv("SPACE_TEST_BASE") == "1" {
		builtins = "minimal,base"
	}
	srv.Args = []string{"--builtins", builtins}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	key, err := srv.CreateKey("docs")
	if err != nil {
		t.Fatal(err)
	}
	for _, tmpl := range strings.Split(builtins, ",") {
		if err := srv.WaitTemplate(key, tmpl, 10*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range files {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(root, name))
			if err != nil {
				t.Fatal(err)
			}
			blocks, err := extract(string(raw))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			for _, bl := range blocks {
				if bl.NoTest != "" {
					t.Logf("%s:%d not run: %s", name, bl.Line, bl.NoTest)
				}
			}
			sh, ran := script(name, blocks)
			if ran == 0 {
				t.Skipf("%s: no runnable sh blocks", name)
			}
			if baseRE.MatchString(sh) && !strings.Contains(builtins, "base") {
				t.Skipf("%s uses the Debian base template: set SPACE_TEST_BASE=1 to run it", name)
			}
			// The blocks run in a temp dir with the repository's sdk/,
			// examples/ and scripts/ reachable as relative paths.
			work := t.TempDir()
			for _, d := range []string{"sdk", "examples", "scripts"} {
				if err := os.Symlink(filepath.Join(root, d), filepath.Join(work, d)); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", "-c", sh)
			cmd.Dir = work
			cmd.Env = append(os.Environ(), "SPACE_URL="+srv.Ctrl, "SPACE_API_KEY="+key, "SPACE_DATA_DIR="+srv.DataDir,
				"PATH="+filepath.Dir(srv.Bin)+":"+os.Getenv("PATH"), "PYTHONDONTWRITEBYTECODE=1")
			out, err := cmd.CombinedOutput()
			t.Logf("%d blocks run:\n%s", ran, out)
			failed, outputs := failures(string(out))
			for _, f := range failed {
				t.Errorf("block %s failed; its output:\n%s", f, outputs[f])
			}
			if err != nil || !strings.Contains(string(out), ">>> done") {
				t.Errorf("%s: the script did not finish: %v", name, err)
			}
			// Everything a page creates, it deletes.
			st, m, err := testenv.DoJSON("GET", srv.Ctrl+"/v1/sandboxes?state=creating,running,paused,hibernated", map[string]string{"X-API-Key": key}, nil)
			if err != nil || st != 200 {
				t.Fatalf("list sandboxes: %d %v %v", st, m, err)
			}
			if left, _ := m["sandboxes"].([]any); len(left) != 0 {
				t.Errorf("%s leaves %d sandboxes behind", name, len(left))
				for _, sb := range left {
					if id, _ := sb.(map[string]any)["id"].(string); id != "" {
						testenv.DoJSON("DELETE", srv.Ctrl+"/v1/sandboxes/"+id, map[string]string{"X-API-Key": key}, nil)
					}
				}
			}
		})
	}
}

// TestConfigurationListsEveryFlag checks that docs/configuration.md names
// every flag `space server -h` prints. Needs no root.
func TestConfigurationListsEveryFlag(t *testing.T) {
	root := testenv.RepoRoot()
	help := serverHelp(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(help), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(line, "  -") {
			continue
		}
		flag := "--" + strings.TrimPrefix(f[0], "-")
		n++
		if !strings.Contains(string(doc), "`"+flag+"`") {
			t.Errorf("docs/configuration.md does not document %s", flag)
		}
	}
	if n < 10 {
		t.Fatalf("found only %d flags in `space server -h`:\n%s", n, help)
	}
}
