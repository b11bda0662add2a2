// Package docs runs the shell blocks of the documentation against a fresh
// `space server`, in order, in one bash process per file (so exports carry
// from block to block, as they would for a reader), with SPACE_URL,
// SPACE_API_KEY set and `space` on the PATH. A block preceded by
// `<!-- no-test: reason -->` is skipped with that reason. Needs root.
package docs

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

// files are the documents whose ```sh blocks are tested.
var files = []string{"docs/getting-started.md"}

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
			if pending == "" {
				return nil, fmt.Errorf("line %d: no-test needs a reason", n)
			}
		case strings.HasPrefix(trim, "```"):
			f := trim[:len(trim)-len(strings.TrimLeft(trim, "`"))]
			lang := strings.TrimSpace(strings.TrimPrefix(trim, f))
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

func TestExtract(t *testing.T) {
	doc := "# t\n\n```sh\necho a\n```\n\n<!-- no-test: needs KVM -->\n\n```sh\nkvm\n```\n\n```go\nx := 1\n```\n````sh\necho '```'\n````\n"
	got, err := extract(doc)
	if err != nil {
		t.Fatal(err)
	}
	want := []block{{3, "echo a\n", ""}, {9, "kvm\n", "needs KVM"}, {16, "echo '```'\n", ""}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("extract = %+v, want %+v", got, want)
	}
	if _, err := extract("<!-- no-test: x -->\ntext\n"); err == nil {
		t.Fatal("a dangling no-test comment must be an error")
	}
}

// script turns a document's runnable blocks into one bash script that
// announces each block before running it.
func script(name string, blocks []block) (string, int) {
	var b strings.Builder
	b.WriteString("set -euo pipefail\n")
	ran := 0
	for _, bl := range blocks {
		if bl.NoTest != "" {
			continue
		}
		ran++
		fmt.Fprintf(&b, "echo '>>> %s:%d'\n%s", name, bl.Line, bl.Code)
	}
	b.WriteString("echo '>>> done'\n")
	return b.String(), ran
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
	srv, err := testenv.New("space-docs-")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Remove()
	defer srv.RemoveCgroupBase()
	srv.Args = []string{"--builtins", "minimal"}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	key, err := srv.CreateKey("docs")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitTemplate(key, "minimal", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		t.Run(filepath.Base(name), func(t *testing.T) {
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
					t.Logf("%s:%d skipped: %s", name, bl.Line, bl.NoTest)
				}
			}
			sh, ran := script(name, blocks)
			if ran == 0 {
				t.Fatalf("%s: no runnable sh blocks", name)
			}
			// The blocks run in a scratch copy of nothing: cwd is a temp dir
			// with the repository's sdk/ and examples/ reachable as relative paths.
			work := t.TempDir()
			for _, d := range []string{"sdk", "examples"} {
				if err := os.Symlink(filepath.Join(root, d), filepath.Join(work, d)); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", "-c", sh)
			cmd.Dir = work
			cmd.Env = append(os.Environ(), "SPACE_URL="+srv.Ctrl, "SPACE_API_KEY="+key,
				"PATH="+filepath.Dir(srv.Bin)+":"+os.Getenv("PATH"), "PYTHONDONTWRITEBYTECODE=1")
			out, err := cmd.CombinedOutput()
			t.Logf("%d blocks run:\n%s", ran, out)
			if err != nil {
				last := ""
				for _, l := range strings.Split(string(out), "\n") {
					if strings.HasPrefix(l, ">>> ") {
						last = strings.TrimPrefix(l, ">>> ")
					}
				}
				t.Fatalf("%s: the block at %s failed: %v", name, last, err)
			}
			// Everything the page creates, it deletes.
			st, m, err := testenv.DoJSON("GET", srv.Ctrl+"/v1/sandboxes?state=creating,running", map[string]string{"X-API-Key": key}, nil)
			if err != nil || st != 200 {
				t.Fatalf("list sandboxes: %d %v %v", st, m, err)
			}
			if left, _ := m["sandboxes"].([]any); len(left) != 0 {
				t.Errorf("%s leaves %d sandboxes running", name, len(left))
			}
		})
	}
}

// TestConfigurationListsEveryFlag checks that docs/configuration.md names
// every flag `space server -h` prints. Needs no root.
func TestConfigurationListsEveryFlag(t *testing.T) {
	root := testenv.RepoRoot()
	bin := filepath.Join(t.TempDir(), "space")
	build := exec.Command("go", "build", "-o", bin, "./cmd/space")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	help, _ := exec.Command(bin, "server", "-h").CombinedOutput() // exits 1 after printing
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
