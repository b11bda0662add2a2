package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCopyLikeDockerCp: a file into an existing directory lands under its
// own name, a directory copies recursively both ways, and --user decides
// who owns what is created and what may be written.
func TestCopyLikeDockerCp(t *testing.T) {
	id := newSandbox(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "one.txt")
	if err := os.WriteFile(file, []byte("one\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(dir, "tree")
	for p, body := range map[string]string{"a.txt": "a\n", "sub/b.txt": "b\n", "sub/deeper/c.txt": "c\n"} {
		os.MkdirAll(filepath.Dir(filepath.Join(tree, p)), 0o755)
		if err := os.WriteFile(filepath.Join(tree, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// File to an existing directory (was 400 is_a_directory).
	if _, errOut, code := space(t, "sandbox", "cp", file, id+":/tmp"); code != 0 {
		t.Fatalf("cp file to dir: %d %s", code, errOut)
	}
	if out, _, _ := space(t, "sandbox", "exec", id, "--", "cat", "/tmp/one.txt"); out != "one\n" {
		t.Fatalf("/tmp/one.txt: %q", out)
	}
	// Directory to an existing directory: under its own name, recursively.
	if _, errOut, code := space(t, "sandbox", "cp", tree, id+":/tmp"); code != 0 {
		t.Fatalf("cp dir to dir: %d %s", code, errOut)
	}
	out, _, _ := space(t, "sandbox", "exec", id, "--", "sh", "-c", "cd /tmp/tree && find . -type f | sort && cat sub/deeper/c.txt")
	if out != "./a.txt\n./sub/b.txt\n./sub/deeper/c.txt\nc\n" {
		t.Fatalf("uploaded tree: %q", out)
	}
	// Directory to a new local path, then into an existing local directory.
	back := filepath.Join(dir, "back")
	if _, errOut, code := space(t, "sandbox", "cp", id+":/tmp/tree", back); code != 0 {
		t.Fatalf("cp dir out: %d %s", code, errOut)
	}
	if b, err := os.ReadFile(filepath.Join(back, "sub", "deeper", "c.txt")); err != nil || string(b) != "c\n" {
		t.Fatalf("downloaded tree: %v %q", err, b)
	}
	into := filepath.Join(dir, "into")
	os.Mkdir(into, 0o755)
	if _, errOut, code := space(t, "sandbox", "cp", id+":/tmp/one.txt", into); code != 0 {
		t.Fatalf("cp file out to dir: %d %s", code, errOut)
	}
	if b, err := os.ReadFile(filepath.Join(into, "one.txt")); err != nil || string(b) != "one\n" {
		t.Fatalf("file copied into a local dir: %v %q", err, b)
	}
	// --user: the default user cannot write under a root-owned directory;
	// root can, and owns what it creates.
	space(t, "sandbox", "exec", "--user", "root", id, "--", "sh", "-c", "mkdir -p /srv/root-only && chmod 755 /srv/root-only")
	def, _, _ := space(t, "sandbox", "exec", id, "--", "id", "-un")
	if strings.TrimSpace(def) != "root" {
		if _, errOut, code := space(t, "sandbox", "cp", file, id+":/srv/root-only/x"); code != 1 || !strings.Contains(errOut, "permission") {
			t.Fatalf("cp as the default user (%s) into a root-only dir: %d %s", def, code, errOut)
		}
	}
	if _, errOut, code := space(t, "sandbox", "cp", "--user", "root", file, id+":/srv/root-only/x"); code != 0 {
		t.Fatalf("cp --user root: %d %s", code, errOut)
	}
	if out, _, _ := space(t, "sandbox", "exec", id, "--", "stat", "-c", "%U", "/srv/root-only/x"); out != "root\n" {
		t.Fatalf("owner of a file copied with --user root: %q", out)
	}
	// A missing source says so once, with no URL.
	_, errOut, code := space(t, "sandbox", "cp", id+":/no/such", dir)
	if code != 1 || strings.Count(errOut, "http") > 0 {
		t.Fatalf("cp of a missing file: %d %q", code, errOut)
	}
}

// TestSessionTimeoutAndPolicyFlags covers the verbs and create flags that
// reach API features the CLI had no way to use.
func TestSessionTimeoutAndPolicyFlags(t *testing.T) {
	srv, key := cliSrv(t)
	id := newSandbox(t)

	// session: a token that opens the data plane.
	tok, errOut, code := space(t, "sandbox", "session", id)
	tok = strings.TrimSpace(tok)
	if code != 0 || tok == "" || strings.Contains(tok, key) {
		t.Fatalf("session: %d %q %s", code, tok, errOut)
	}
	out, _, code := space(t, "sandbox", "session", "--json", id)
	var sess struct {
		Token   string `json:"token"`
		DataURL string `json:"data_url"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &sess) != nil || sess.DataURL == "" {
		t.Fatalf("session --json: %d %q", code, out)
	}
	req, _ := http.NewRequest("GET", sess.DataURL+"/v1/sandboxes/"+id+"/files/stat?path=/tmp", nil)
	req.Header.Set("X-Access-Token", tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("data plane with the printed token: %d", resp.StatusCode)
	}

	// timeout: extend, then clear.
	out, errOut, code = space(t, "sandbox", "timeout", id, "45m")
	if code != 0 || !strings.Contains(out, "expires") {
		t.Fatalf("timeout 45m: %d %q %s", code, out, errOut)
	}
	var sb struct {
		ExpiresAt        *time.Time `json:"expires_at"`
		AutoPauseSeconds int64      `json:"auto_pause_seconds"`
		OnTimeout        string     `json:"on_timeout"`
		AutoResume       bool       `json:"auto_resume"`
		ProjectID        string     `json:"project_id"`
	}
	out, _, _ = space(t, "sandbox", "get", "--json", id)
	if json.Unmarshal([]byte(out), &sb) != nil || sb.ExpiresAt == nil || time.Until(*sb.ExpiresAt) < 40*time.Minute {
		t.Fatalf("after timeout 45m: %s", out)
	}
	if out, _, code = space(t, "sandbox", "timeout", id, "0"); code != 0 || !strings.Contains(out, "no timeout") {
		t.Fatalf("timeout 0: %d %q", code, out)
	}
	if _, errOut, code = space(t, "sandbox", "timeout", id, "30"); code != 2 || !strings.Contains(errOut, "use 30s") {
		t.Fatalf("timeout 30: %d %q", code, errOut)
	}
	if _, errOut, code = space(t, "sandbox", "create", "--timeout", "30"); code != 2 || !strings.Contains(errOut, "use 30s") {
		t.Fatalf("create --timeout 30: %d %q", code, errOut)
	}

	// create: auto-pause, auto-resume and on-timeout reach the server.
	out, errOut, code = space(t, "sandbox", "create", "--template", "minimal", "--auto-pause", "10m", "--auto-resume", "--timeout", "1h", "--json")
	var created struct{ Sandbox struct{ ID string } }
	if code != 0 || json.Unmarshal([]byte(out), &created) != nil {
		t.Fatalf("create --auto-pause: %d %q %s", code, out, errOut)
	}
	defer space(t, "sandbox", "rm", created.Sandbox.ID)
	out, _, _ = space(t, "sandbox", "get", "--json", created.Sandbox.ID)
	sb.AutoPauseSeconds, sb.AutoResume = 0, false
	if json.Unmarshal([]byte(out), &sb) != nil || sb.AutoPauseSeconds != 600 || !sb.AutoResume {
		t.Fatalf("auto-pause/auto-resume not applied: %s", out)
	}
	if _, errOut, code = space(t, "sandbox", "create", "--on-timeout", "later"); code != 2 {
		t.Fatalf("create --on-timeout later: %d %s", code, errOut)
	}

	// Network flags: this server runs without --egress, so a policy other
	// than blocked is refused by the server, which proves it was sent.
	_, errOut, code = space(t, "sandbox", "create", "--template", "minimal", "--allow", "pypi.org")
	if code != 1 || !strings.Contains(errOut, "egress") {
		t.Fatalf("create --allow on a server without egress: %d %s", code, errOut)
	}
	if _, errOut, code = space(t, "sandbox", "create", "--network", "sometimes"); code != 2 {
		t.Fatalf("create --network sometimes: %d %s", code, errOut)
	}
	if _, errOut, code = space(t, "sandbox", "create", "--network", "open", "--allow", "x.org"); code != 2 {
		t.Fatalf("create --network open --allow: %d %s", code, errOut)
	}
	_, errOut, code = space(t, "sandbox", "network", id, "--network", "open")
	if code != 1 || !strings.Contains(errOut, "egress") {
		t.Fatalf("sandbox network on a server without egress: %d %s", code, errOut)
	}
	if out, errOut, code = space(t, "sandbox", "network", id, "--network", "blocked"); code != 0 || !strings.Contains(out, "blocked") {
		t.Fatalf("sandbox network --network blocked: %d %q %s", code, out, errOut)
	}

	// --all-projects needs an admin key; an admin key sees the PROJECT column.
	if _, errOut, code = space(t, "sandbox", "list", "--all-projects"); code != 1 || !strings.Contains(errOut, "admin") {
		t.Fatalf("list --all-projects with a project key: %d %s", code, errOut)
	}
	admin, err := srv.CreateKey("ops", "--admin")
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code = space(t, "sandbox", "list", "--all-projects", "--api-key", admin)
	if code != 0 || !strings.HasPrefix(out, "PROJECT") || !strings.Contains(out, id) {
		t.Fatalf("list --all-projects with an admin key: %d %q %s", code, out, errOut)
	}

	// Template names complete (the shell scripts call this for --template).
	if out, _, code = space(t, "completion", "__ids", "templates"); code != 0 || !strings.Contains("\n"+out, "\nminimal\n") {
		t.Fatalf("completion __ids templates: %d %q", code, out)
	}

	// metrics answers (possibly with no samples yet).
	if out, errOut, code = space(t, "sandbox", "metrics", id); code != 0 || !strings.HasPrefix(out, "TIME") {
		t.Fatalf("metrics: %d %q %s", code, out, errOut)
	}

	// rm takes several ids; a bad one is reported and sets the status.
	a, b := newSandbox(t), newSandbox(t)
	out, errOut, code = space(t, "sandbox", "rm", "--wait", a, "sbx-0000000000000000", b)
	if code != 1 || !strings.Contains(out, "deleted "+a) || !strings.Contains(out, "deleted "+b) || !strings.Contains(errOut, "sbx-0000000000000000") {
		t.Fatalf("rm with several ids: %d %q %q", code, out, errOut)
	}

	// rm --all deletes every live sandbox of the project.
	c1, c2 := newSandbox(t), newSandbox(t)
	if out, errOut, code = space(t, "sandbox", "rm", "--all", "--wait"); code != 0 || !strings.Contains(out, "deleted "+c1) || !strings.Contains(out, "deleted "+c2) {
		t.Fatalf("rm --all: %d %q %q", code, out, errOut)
	}
	if out, _, _ = space(t, "sandbox", "list", "--state", "running", "--json"); strings.Contains(out, "sbx-") {
		t.Fatalf("sandboxes left after rm --all: %s", out)
	}
	if _, _, code = space(t, "sandbox", "rm", "--all", c1); code != 2 {
		t.Fatalf("rm --all with an id: exit %d, want 2", code)
	}

	// version --server names the server's build.
	out, errOut, code = space(t, "version", "--server", "--json")
	var v struct {
		Client struct{ Version string }
		Server struct{ Version string }
	}
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.Server.Version == "" || v.Server.Version != v.Client.Version {
		t.Fatalf("version --server: %d %q %s", code, out, errOut)
	}
	// health needs no API key (the Helm chart's helm test pod has none);
	// a server that does not answer is an error.
	srv, _ = cliSrv(t)
	cmd := exec.Command(srv.Bin, "health", "--url", srv.Ctrl)
	cmd.Env = append(os.Environ(), "SPACE_API_KEY=")
	if b, err := cmd.CombinedOutput(); err != nil || string(b) != srv.Ctrl+": ok\n" {
		t.Fatalf("health without a key: %v %q", err, b)
	}
	if _, errOut, code := space(t, "health", "--url", "http://127.0.0.1:1", "--timeout", "2s"); code == 0 {
		t.Fatalf("health of a closed port: exit 0 %s", errOut)
	}
}

// TestEvents follows the project's lifecycle events while a sandbox is
// created: its create operation and its running state show up.
func TestEvents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := spaceCmd(t, ctx, "events")
	stdout, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); cmd.Wait() }()
	id := newSandbox(t)
	want := map[string]bool{"sandbox.create " + id + ": succeeded 100%": false, id + " is running": false}
	sc := bufio.NewScanner(stdout)
	var seen []string
	for sc.Scan() {
		seen = append(seen, sc.Text())
		for w := range want {
			want[w] = want[w] || strings.Contains(sc.Text(), w)
		}
		if want["sandbox.create "+id+": succeeded 100%"] && want[id+" is running"] {
			return
		}
	}
	t.Fatalf("space events never showed %v; it printed:\n%s", want, strings.Join(seen, "\n"))
}
