package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/space-sandbox/space/test/testenv"
)

// cliServer is one real `space server` shared by the CLI tests, started on
// first use and stopped by TestMain.
var cliServer struct {
	once sync.Once
	srv  *testenv.Server
	key  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if s := cliServer.srv; s != nil {
		s.Stop()
		s.RemoveCgroupBase()
		s.Remove()
	}
	os.Exit(code)
}

func cliSrv(t *testing.T) (*testenv.Server, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces, cgroups, overlayfs) to run a real server")
	}
	cliServer.once.Do(func() {
		srv, err := testenv.New("space-cli-")
		cliServer.srv = srv
		if err != nil {
			cliServer.err = err
			return
		}
		srv.Args = []string{"--builtins", "minimal"}
		if cliServer.err = srv.Start(); cliServer.err != nil {
			return
		}
		if cliServer.key, cliServer.err = srv.CreateKey("cli"); cliServer.err != nil {
			return
		}
		cliServer.err = srv.WaitTemplate(cliServer.key, "minimal", 2*time.Minute)
	})
	if cliServer.err != nil {
		t.Fatal(cliServer.err)
	}
	return cliServer.srv, cliServer.key
}

// space runs the CLI binary the server was built with and returns stdout,
// stderr and the exit status.
// spaceCmd is the space CLI, set up against the test server.
func spaceCmd(t *testing.T, ctx context.Context, args ...string) *exec.Cmd {
	t.Helper()
	srv, key := cliSrv(t)
	cmd := exec.CommandContext(ctx, srv.Bin, args...)
	cmd.Env = append(os.Environ(), "SPACE_URL="+srv.Ctrl, "SPACE_API_KEY="+key)
	return cmd
}

func space(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	srv, key := cliSrv(t)
	cmd := exec.Command(srv.Bin, args...)
	cmd.Env = append(os.Environ(), "SPACE_URL="+srv.Ctrl, "SPACE_API_KEY="+key)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

func newSandbox(t *testing.T) string {
	t.Helper()
	out, errOut, code := space(t, "sandbox", "create", "--template", "minimal")
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "sbx-") {
		t.Fatalf("create: %d %q %s", code, out, errOut)
	}
	t.Cleanup(func() { space(t, "sandbox", "rm", id) })
	return id
}

// openPTY opens a pseudo-terminal pair with /dev/ptmx.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no /dev/ptmx: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlockpt: %v", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("ptsname: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return m, s
}

// ptyOutput collects what the master side reads.
type ptyOutput struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *ptyOutput) String() string { o.mu.Lock(); defer o.mu.Unlock(); return o.buf.String() }

func (o *ptyOutput) waitFor(t *testing.T, re *regexp.Regexp, d time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if re.MatchString(o.String()) {
			return
		}
	}
	t.Fatalf("no %s in the terminal output after %v:\n%q", re, d, o.String())
}

// TestExecInteractivePTY drives `space sandbox exec -it ID -- sh` on a real
// pseudo-terminal: typed keys reach the remote shell, the remote terminal
// has the local size and follows a resize, and the exit code comes back.
func TestExecInteractivePTY(t *testing.T) {
	srv, key := cliSrv(t)
	id := newSandbox(t)
	master, slave := openPTY(t)
	defer master.Close()
	if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 40, Col: 100}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(srv.Bin, "sandbox", "exec", "-it", id, "--", "sh")
	cmd.Env = append(os.Environ(), "SPACE_URL="+srv.Ctrl, "SPACE_API_KEY="+key, "TERM=xterm")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	out := &ptyOutput{}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		b := make([]byte, 4096)
		for {
			n, err := master.Read(b)
			out.mu.Lock()
			out.buf.Write(b[:n])
			out.mu.Unlock()
			if err != nil {
				return // EIO once the process and its terminal are gone
			}
		}
	}()
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	defer cmd.Process.Kill()

	out.waitFor(t, regexp.MustCompile(`[#$] (\x1b\[6n)?$`), 20*time.Second) // the prompt (busybox then asks for the cursor position)
	// The local terminal is raw now: the echo comes from the remote one,
	// and `h''i` echoes as typed but prints as hi.
	master.WriteString("echo h''i; stty size\r")
	out.waitFor(t, regexp.MustCompile(`\r\nhi\r\n40 100\r\n`), 10*time.Second)
	if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 50, Col: 120}); err != nil {
		t.Fatal(err)
	}
	resized := regexp.MustCompile(`\r\n50 120\r\n`)
	for i := 0; i < 50 && !resized.MatchString(out.String()); i++ {
		master.WriteString("stty size\r") // SIGWINCH → resize is asynchronous
		time.Sleep(200 * time.Millisecond)
	}
	out.waitFor(t, resized, time.Second)
	master.WriteString("exit 3\r")
	select {
	case err := <-waited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Fatalf("exit: %v, want status 3; terminal:\n%q", err, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("space exec did not exit; terminal:\n%q", out.String())
	}
	<-readDone
}

// TestExecStdinAndSignal: `space sandbox exec -i` forwards piped stdin to
// the command (the id it forwards to comes from the start event of the
// one-request exec), and a SIGTERM to the CLI reaches the command.
func TestExecStdinAndSignal(t *testing.T) {
	id := newSandbox(t)
	ctx := context.Background()
	cmd := spaceCmd(t, ctx, "sandbox", "exec", "-i", id, "--", "sh", "-c", "tr a-z A-Z; echo done")
	cmd.Stdin = strings.NewReader("piped through\n")
	out, err := cmd.Output()
	if err != nil || string(out) != "PIPED THROUGH\ndone\n" {
		t.Fatalf("exec -i: %q, %v", out, err)
	}

	cmd = spaceCmd(t, ctx, "sandbox", "exec", id, "--", "sh", "-c", "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.1; done")
	stdout, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	rd := bufio.NewReader(stdout)
	if line, err := rd.ReadString('\n'); line != "ready\n" {
		t.Fatalf("before the signal: %q, %v", line, err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	rest, _ := io.ReadAll(rd)
	err = cmd.Wait()
	var ee *exec.ExitError
	if string(rest) != "got-term\n" || !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("after SIGTERM: %q, %v", rest, err)
	}
}

func TestExitCodes(t *testing.T) {
	id := newSandbox(t)
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"sandbox", "exec", id, "--", "sh", "-c", "exit 3"}, 3},
		{[]string{"sandbox", "exec", "--shell", "kill -TERM $$", id}, 128 + 15},
		{[]string{"sandbox", "exec", id, "--", "/no/such/program"}, 127},
		{[]string{"sandbox", "exec", id, "--", "true"}, 0},
		{[]string{"sandbox", "get", id}, 0},
		{[]string{"sandbox", "get", "sbx-0000000000000000"}, 1},         // not found
		{[]string{"sandbox", "get"}, 2},                                 // missing argument
		{[]string{"sandbox", "get", "--bogus", id}, 2},                  // unknown flag
		{[]string{"sandbox", "frobnicate"}, 2},                          // unknown verb
		{[]string{"sandbox"}, 2},                                        // no verb
		{[]string{"no-such-command"}, 2},                                // unknown command
		{[]string{"sandbox", "exec", id}, 2},                            // no command
		{[]string{"ops", "get", "op-0000000000000000"}, 1},              // not found
		{[]string{"sandbox", "list", "--state", "bogus"}, 1},            // refused by the server
		{[]string{"sandbox", "list", "--url", "http://127.0.0.1:9"}, 1}, // no server
	} {
		_, errOut, code := space(t, c.args...)
		if code != c.want {
			t.Errorf("space %s: exit %d, want %d (stderr %q)", strings.Join(c.args, " "), code, c.want, errOut)
		}
	}
	// --json on exec keeps stdout the command's and reports the exit on stderr.
	out, errOut, code := space(t, "sandbox", "exec", "--json", id, "--", "sh", "-c", "echo out; exit 5")
	var exit struct {
		Code int `json:"exit_code"`
	}
	if code != 5 || out != "out\n" || json.Unmarshal([]byte(errOut), &exit) != nil || exit.Code != 5 {
		t.Fatalf("exec --json: %d %q %q", code, out, errOut)
	}
}

// TestJSONEverywhere checks that every client verb prints one JSON document
// with --json.
func TestJSONEverywhere(t *testing.T) {
	id := newSandbox(t)
	out, _, code := space(t, "sandbox", "create", "--template", "minimal", "--json")
	var created struct {
		Sandbox   struct{ ID string }
		Operation struct{ ID string }
	}
	if code != 0 || json.Unmarshal([]byte(out), &created) != nil || created.Sandbox.ID == "" {
		t.Fatalf("create --json: %d %q", code, out)
	}
	for _, args := range [][]string{
		{"sandbox", "list"}, {"sandbox", "get", id}, {"template", "list"},
		{"ops", "get", created.Operation.ID}, {"ops", "watch", created.Operation.ID},
		{"sandbox", "rm", created.Sandbox.ID, "--wait"},
		{"keys", "list", "--data-dir", cliServer.srv.DataDir}, {"version"},
	} {
		out, errOut, code := space(t, append(args, "--json")...)
		if code != 0 {
			t.Errorf("space %v --json: exit %d: %s", args, code, errOut)
			continue
		}
		dec := json.NewDecoder(strings.NewReader(out))
		for n := 0; ; n++ {
			var v any
			if err := dec.Decode(&v); err != nil {
				if n == 0 || err.Error() != "EOF" {
					t.Errorf("space %v --json: not JSON (%v): %q", args, err, out)
				}
				break
			}
		}
	}
}

// buildCLI builds this package's binary without a server.
func buildCLI(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "space")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// TestCompletionTableMatchesFlags checks the completion table against the
// flags each client verb really takes (its -h output).
func TestCompletionTableMatchesFlags(t *testing.T) {
	bin := buildCLI(t)
	for key, v := range completionTable {
		if !v.client && !strings.HasPrefix(key, "keys ") && key != "doctor" {
			continue
		}
		out, _ := exec.Command(bin, append(strings.Fields(key), "-h")...).CombinedOutput()
		var got []string
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(line, "  -") {
				got = append(got, strings.TrimLeft(f[0], "-"))
			}
		}
		var want []string
		for _, f := range v.allFlags() {
			want = append(want, strings.TrimLeft(f, "-"))
		}
		sort.Strings(got)
		sort.Strings(want)
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: -h lists %v, the completion table %v", key, got, want)
		}
	}
}

func TestCompletionScripts(t *testing.T) {
	bin := buildCLI(t)
	for _, sh := range []string{"bash", "zsh", "fish"} {
		out, err := exec.Command(bin, "completion", sh).Output()
		if err != nil || !strings.Contains(string(out), "sandbox") {
			t.Fatalf("completion %s: %v\n%s", sh, err, out)
		}
		if p, err := exec.LookPath(sh); err == nil && sh != "fish" {
			if o, err := exec.Command(p, "-n", "-c", string(out)).CombinedOutput(); err != nil {
				t.Errorf("%s -n: %v\n%s", sh, err, o)
			}
		}
	}
	if err := exec.Command(bin, "completion", "tcsh").Run(); err == nil || err.(*exec.ExitError).ExitCode() != 2 {
		t.Errorf("completion tcsh: %v, want exit 2", err)
	}
	if _, err := exec.LookPath("bash"); err != nil {
		return
	}
	// Ask bash's own machinery what it completes after `space sa` and
	// `space sandbox ex`, and `space sandbox exec --t`.
	for line, want := range map[string]string{
		"space sa":                           "sandbox",
		"space sandbox ex":                   "exec",
		"space sandbox exec --t":             "--tty",
		"space snapshot ":                    "fork",
		"space completion ":                  "fish",
		"space sandbox ti":                   "timeout",
		"space sandbox create --network ":    "allowlist",
		"space sandbox create --on-timeout ": "hibernate",
		"space keys ":                        "help",
	} {
		script := fmt.Sprintf(`source <(%q completion bash)
COMP_LINE=%q; COMP_POINT=${#COMP_LINE}; read -ra COMP_WORDS <<<"$COMP_LINE"
[[ "$COMP_LINE" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
_space_complete; printf '%%s\n' "${COMPREPLY[@]}"`, bin, line)
		out, err := exec.Command("bash", "-c", script).CombinedOutput()
		if err != nil || !strings.Contains("\n"+string(out), "\n"+want+"\n") {
			t.Errorf("completing %q: %v, got %q, want %q among them", line, err, out, want)
		}
	}
}

func TestSplitShortFlags(t *testing.T) {
	for in, want := range map[string]string{
		"-it ID -- sh":               "-i -t ID -- sh",
		"-ti --shell -it ID":         "-t -i --shell -it ID",
		"ID -it ls -it":              "ID -i -t ls -it",
		"--cwd /x -t ID -- -it":      "--cwd /x -t ID -- -it",
		"-it=true ID sh":             "-it=true ID sh",
		"ID sh -c 'x'":               "ID sh -c 'x'",
		"--env A=B -it ID vi -it -x": "--env A=B -i -t ID vi -it -x",
	} {
		if got := strings.Join(splitShortFlags(strings.Fields(in)), " "); got != want {
			t.Errorf("splitShortFlags(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCopyProgressAndLogs copies a file both ways with a progress display
// and reads a command's output back with `space logs`.
func TestCopyProgressAndLogs(t *testing.T) {
	id := newSandbox(t)
	dir := t.TempDir()
	src, back := filepath.Join(dir, "up.bin"), filepath.Join(dir, "down.bin")
	data := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB
	if err := os.WriteFile(src, data, 0o640); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := space(t, "sandbox", "cp", "--progress", src, id+":/tmp/up.bin")
	if code != 0 || !strings.Contains(errOut, "upload "+id+":/tmp/up.bin: 3.0MiB / 3.0MiB (100%)") {
		t.Fatalf("upload: %d %q", code, errOut)
	}
	out, _, _ := space(t, "sandbox", "exec", id, "--", "stat", "-c", "%s %a", "/tmp/up.bin")
	if out != "3145728 640\n" {
		t.Fatalf("uploaded file: %q", out)
	}
	_, errOut, code = space(t, "sandbox", "cp", "--progress", id+":/tmp/up.bin", back)
	if got, _ := os.ReadFile(back); code != 0 || !bytes.Equal(got, data) || !strings.Contains(errOut, "(100%)") {
		t.Fatalf("download: %d %q, %d bytes", code, errOut, len(got))
	}
	if _, _, code = space(t, "sandbox", "cp", src, back); code != 2 {
		t.Fatalf("cp with two local paths: exit %d, want 2", code)
	}
	if _, _, code = space(t, "sandbox", "cp", id+":/no/such", back); code != 1 {
		t.Fatalf("cp of a missing file: exit %d, want 1", code)
	}

	space(t, "sandbox", "exec", id, "--", "sh", "-c", "echo first")
	space(t, "sandbox", "exec", id, "--", "sh", "-c", "echo second; echo err >&2; exit 2")
	out, errOut, code = space(t, "logs", id)
	if code != 0 || out != "second\n" || errOut != "err\n" {
		t.Fatalf("logs: %d %q %q", code, out, errOut)
	}
	out, _, code = space(t, "sandbox", "logs", "--all", id)
	if code != 0 || !strings.Contains(out, "first\n") || !strings.HasSuffix(out, "second\n") {
		t.Fatalf("logs --all: %d %q", code, out)
	}
	out, _, code = space(t, "logs", "--json", id)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var last struct {
		Type string
		Exit struct {
			Code int `json:"exit_code"`
		}
	}
	if code != 0 || len(lines) < 3 || json.Unmarshal([]byte(lines[len(lines)-1]), &last) != nil || last.Type != "exit" || last.Exit.Code != 2 {
		t.Fatalf("logs --json: %d %q", code, out)
	}
}

func TestPortsAndURL(t *testing.T) {
	id := newSandbox(t)
	if _, errOut, code := space(t, "sandbox", "exec", id, "--", "sh", "-c", "mkdir -p /tmp/www && echo cli page > /tmp/www/index.html && httpd -p 8000 -h /tmp/www"); code != 0 {
		t.Fatalf("start httpd: %d %s", code, errOut)
	}
	out, errOut, code := space(t, "sandbox", "ports", id, "--wait", "8000", "--timeout", "20s", "--json")
	var list struct {
		Ports []struct {
			Port int
			URL  string
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Ports) == 0 {
		t.Fatalf("ports --wait: %d %q %s", code, out, errOut)
	}
	found := false
	for _, p := range list.Ports {
		found = found || p.Port == 8000 && strings.Contains(p.URL, "://8000-"+id+".")
	}
	if !found {
		t.Fatalf("port 8000 not listed: %s", out)
	}
	if out, _, code = space(t, "sandbox", "ports", id); code != 0 || !strings.Contains(out, "8000") || !strings.HasPrefix(out, "PORT") {
		t.Fatalf("ports table: %d %q", code, out)
	}
	if out, _, code = space(t, "sandbox", "url", id, "8000"); code != 0 || !strings.HasPrefix(out, "http://8000-"+id+".") {
		t.Fatalf("url: %d %q", code, out)
	}
	if out, _, code = space(t, "sandbox", "url", "--path", id, "8000"); code != 0 || !strings.HasSuffix(out, "/v1/sandboxes/"+id+"/ports/8000/\n") {
		t.Fatalf("url --path: %d %q", code, out)
	}
	// The signed path-form URL opens the port with nothing else.
	out, errOut, code = space(t, "sandbox", "url", "--signed", "--ttl", "5m", "--path", id, "8000")
	if code != 0 || !strings.Contains(out, "space_token=") {
		t.Fatalf("url --signed: %d %q %s", code, out, errOut)
	}
	resp, err := http.Get(strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "cli page\n" {
		t.Fatalf("GET the signed URL: %d %q", resp.StatusCode, body)
	}
	for _, args := range [][]string{
		{"sandbox", "url", id, "0"}, {"sandbox", "url", id, "http"}, {"sandbox", "url", "--signed", "--ttl", "0s", id, "8000"},
		{"sandbox", "ports", id, "--wait", "70000"}, {"sandbox", "url", id},
	} {
		if _, _, code := space(t, args...); code != 2 {
			t.Errorf("space %v: exit %d, want 2", args, code)
		}
	}
	if _, errOut, code := space(t, "sandbox", "ports", id, "--wait", "8001", "--timeout", "500ms"); code != 1 || !strings.Contains(errOut, "nothing listened on port 8001") {
		t.Fatalf("ports --wait on a closed port: %d %s", code, errOut)
	}
	out, _, code = space(t, "sandbox", "create", "--template", "minimal", "--public-ports", "--json")
	var created struct {
		Sandbox struct {
			ID          string
			PublicPorts bool `json:"public_ports"`
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &created) != nil || !created.Sandbox.PublicPorts {
		t.Fatalf("create --public-ports: %d %q", code, out)
	}
	space(t, "sandbox", "rm", created.Sandbox.ID)
}
