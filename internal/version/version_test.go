package version

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestInfoString(t *testing.T) {
	if Get().Version == "" {
		t.Fatal("no version")
	}
	if got := (Info{Version: "1", Commit: "abc"}).String(); got != "1 (commit abc)" {
		t.Fatalf("String: %q", got)
	}
	if got := (Info{Version: "1"}).String(); got != "1" {
		t.Fatalf("String without commit: %q", got)
	}
}

// TestBuildCarriesCommit builds `space` the way scripts/quickstart.sh does
// (-ldflags -X …Commit=$(git rev-parse HEAD)) and checks that `space
// version` and `space version --json` report the commit. (Go's own VCS
// stamp, vcs.revision, is not made in a git worktree or with
// -buildvcs=false, so the scripts set the commit themselves.)
func TestBuildCarriesCommit(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "space")
	build := exec.Command("go", "build", "-o", bin, "-ldflags",
		"-X github.com/space-sandbox/space/internal/version.Commit=feedface0123", "github.com/space-sandbox/space/cmd/space")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || strings.TrimSpace(string(out)) != Version+" (commit feedface0123)" {
		t.Fatalf("space version: %v %q", err, out)
	}
	if out, err = exec.Command(bin, "version", "--json").Output(); err != nil || !strings.Contains(string(out), `"commit": "feedface0123"`) ||
		!strings.Contains(string(out), `"version": "`+Version+`"`) {
		t.Fatalf("space version --json: %v %q", err, out)
	}
}
