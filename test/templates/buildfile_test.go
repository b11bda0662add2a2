package templates

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// buildfileBody is the multipart body of POST /v1/templates/build.
func buildfileBody(t *testing.T, buildfile, contextDir string) (io.Reader, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	part, _ := mw.CreateFormFile("buildfile", "Buildfile")
	part.Write([]byte(buildfile))
	if contextDir != "" {
		part, _ := mw.CreateFormFile("context", "context.tar")
		if err := client.WriteContextTar(contextDir, part); err != nil {
			t.Fatal(err)
		}
	}
	mw.Close()
	return &buf, mw.FormDataContentType()
}

type stepResult struct {
	Step        int     `json:"step"`
	Instruction string  `json:"instruction"`
	Cached      bool    `json:"cached"`
	Seconds     float64 `json:"seconds"`
	Output      string  `json:"output"`
}

type buildResult struct {
	Template struct {
		Name, Digest, Source, Cwd, User string
		Env                             map[string]string
		Cmd, Ready                      []string
	} `json:"template"`
	Steps []stepResult `json:"steps"`
}

// stepMsgRE is the documented progress message form.
var stepMsgRE = regexp.MustCompile(`^step (\d+)/(\d+) (.+): (running|cached|done)( .*)?$`)

// buildFile runs one build over the API, checks its SSE stream is an
// ordered sequence of step events, and returns the result and the events.
func (s *server) buildFile(t *testing.T, name, buildfile, dir string) (buildResult, []opEvent, opEvent) {
	t.Helper()
	body, ctype := buildfileBody(t, buildfile, dir)
	st, m := s.call(t, "POST", "/v1/templates/build?name="+name, body, ctype)
	if st != 202 {
		t.Fatalf("build %s: %d %v", name, st, m)
	}
	// Resume from the start of the project's history: the build may have
	// run steps before the stream connected, and the test wants them all.
	evs := s.followFrom(t, m["operation"].(map[string]any)["id"].(string), "1")
	last := evs[len(evs)-1]
	var res buildResult
	if last.State == "succeeded" {
		if err := json.Unmarshal(last.Result, &res); err != nil {
			t.Fatalf("result %s: %v", last.Result, err)
		}
	}
	// Ordered: step numbers never go back, each step starts (running or
	// cached) before it ends, and every step of 1..M ends exactly once.
	lastStep, total, ended := 0, 0, map[int]string{}
	for _, e := range evs {
		sm := stepMsgRE.FindStringSubmatch(e.Message)
		if sm == nil {
			continue
		}
		n, _ := strconv.Atoi(sm[1])
		total, _ = strconv.Atoi(sm[2])
		if n < lastStep {
			t.Errorf("step %d reported after step %d: %q", n, lastStep, e.Message)
		}
		if n > lastStep+1 {
			t.Errorf("step %d reported before step %d: %q", n, lastStep+1, e.Message)
		}
		if sm[4] != "running" {
			if _, dup := ended[n]; dup {
				t.Errorf("step %d ended twice", n)
			}
			ended[n] = sm[4]
		}
		lastStep = n
	}
	if last.State == "succeeded" {
		if total == 0 || len(ended) != total || len(res.Steps) != total {
			t.Errorf("steps: total %d, ended %v, result %d", total, ended, len(res.Steps))
		}
		for _, r := range res.Steps {
			if want := map[bool]string{true: "cached", false: "done"}[r.Cached]; ended[r.Step] != want {
				t.Errorf("step %d: event says %q, result cached=%v", r.Step, ended[r.Step], r.Cached)
			}
		}
	}
	return res, evs, last
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for n, c := range files {
		p := filepath.Join(dir, n)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

const buildfileText = `# a build file exercising every instruction
FROM minimal
USER root
ENV GREETING=hello \
    APP_HOME=/srv/app
WORKDIR $APP_HOME
COPY app/ ./
COPY conf.txt /etc/conf.txt
RUN echo "built as $(id -u) in $(pwd) with $GREETING" > built.txt && \
    rm lib/remove-me.txt && \
    echo "runner:x:1234:1234::/srv/app:/bin/sh" >> /etc/passwd && \
    chown -R 1234 /srv/app && echo step-output-marker
USER runner
WORKDIR lib
START ["sh", "-c", "sleep 1000"]
READY test -f /srv/app/built.txt
`

func TestBuildfileEndToEnd(t *testing.T) {
	s := startServer(t)
	if err := s.WaitTemplate(s.key, "minimal", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"app/hello.txt":           "v1\n",
		"app/lib/data.txt":        "data\n",
		"app/lib/remove-me.txt":   "gone after RUN\n",
		"conf.txt":                "conf\n",
		"not-copied/secret.txt":   "never in the template\n",
		"app/lib/deeper/leaf.txt": "leaf\n",
	})
	name := "bf-" + suffix
	// The template cache outlives test runs and layers are content-
	// addressed: a per-run ENV before the first layer step makes this run's
	// first build really build.
	testBuildfile := strings.Replace(buildfileText, "USER root\n", "USER root\nENV RUN_ID="+suffix+"\n", 1)

	// 1. First build: every layer step runs.
	t0 := time.Now()
	res, _, last := s.buildFile(t, name, testBuildfile, dir)
	if last.State != "succeeded" {
		t.Fatalf("build failed: %+v", last.Error)
	}
	t.Logf("first build: %v", time.Since(t0))
	for _, r := range res.Steps {
		isLayer := strings.HasPrefix(r.Instruction, "COPY") || strings.HasPrefix(r.Instruction, "RUN")
		if isLayer && r.Cached {
			t.Errorf("first build: step %d %q cached", r.Step, r.Instruction)
		}
		if strings.HasPrefix(r.Instruction, "RUN") && !strings.Contains(r.Output, "step-output-marker") {
			t.Errorf("RUN output not kept: %q", r.Output)
		}
	}
	tp := res.Template
	if tp.Source != "buildfile" || tp.Cwd != "/srv/app/lib" || tp.User != "runner" || tp.Env["GREETING"] != "hello" ||
		tp.Env["PATH"] == "" || strings.Join(tp.Cmd, " ") != "sh -c sleep 1000" ||
		strings.Join(tp.Ready, " ") != "/bin/sh -c test -f /srv/app/built.txt" {
		t.Errorf("template defaults: %+v", tp)
	}

	// 2. A sandbox of it sees the files, env, workdir and user.
	check := func(tpl, wantHello string) {
		t.Helper()
		out, errOut, err := s.cli(t, "sandbox", "create", "--template", tpl)
		if err != nil {
			t.Fatalf("sandbox create: %v\n%s%s", err, out, errOut)
		}
		sb := strings.TrimSpace(out)
		defer s.cli(t, "sandbox", "rm", sb)
		out, errOut, err = s.cli(t, "sandbox", "exec", sb, "--shell",
			`pwd; id -u; echo "$GREETING"; cat ../hello.txt ../built.txt /etc/conf.txt; ls; ls ..; test -e remove-me.txt && echo present || echo removed; cat deeper/leaf.txt; test -e /srv/app/not-copied && echo leaked || true`)
		if err != nil {
			t.Fatalf("exec: %v\n%s%s", err, out, errOut)
		}
		want := "/srv/app/lib\n1234\nhello\n" + wantHello + "built as 0 in /srv/app with hello\nconf\n" +
			"data.txt\ndeeper\nbuilt.txt\nhello.txt\nlib\nremoved\nleaf\n"
		if out != want {
			t.Errorf("sandbox of %s sees:\n%s\nwant:\n%s", tpl, out, want)
		}
	}
	check(name, "v1\n")

	// 3. Unchanged inputs: a full cache hit, no step runs.
	t0 = time.Now()
	res2, _, last := s.buildFile(t, name, testBuildfile, dir)
	if last.State != "succeeded" {
		t.Fatalf("rebuild failed: %+v", last.Error)
	}
	took := time.Since(t0)
	for _, r := range res2.Steps {
		if !r.Cached {
			t.Errorf("rebuild: step %d %q not cached", r.Step, r.Instruction)
		}
	}
	if res2.Template.Digest != tp.Digest {
		t.Errorf("rebuild digest %s, first %s", res2.Template.Digest, tp.Digest)
	}
	if took > 10*time.Second {
		t.Errorf("cached rebuild took %v", took)
	}

	// 4. One COPY source changed: the steps before it are cached, it and
	// every layer step after it run again.
	writeFiles(t, dir, map[string]string{"app/hello.txt": "v2\n"})
	res3, _, last := s.buildFile(t, name+":v2", testBuildfile, dir)
	if last.State != "succeeded" {
		t.Fatalf("build after change failed: %+v", last.Error)
	}
	seenChanged := false
	for _, r := range res3.Steps {
		isLayer := strings.HasPrefix(r.Instruction, "COPY") || strings.HasPrefix(r.Instruction, "RUN")
		if r.Instruction == "COPY app/ ./" {
			seenChanged = true
		}
		switch {
		case !seenChanged && !r.Cached:
			t.Errorf("step %d %q before the change rebuilt", r.Step, r.Instruction)
		case seenChanged && isLayer && r.Cached:
			t.Errorf("step %d %q after the change cached", r.Step, r.Instruction)
		}
	}
	if !seenChanged || res3.Template.Digest == tp.Digest {
		t.Errorf("changed build: digest %s (first %s), steps %+v", res3.Template.Digest, tp.Digest, res3.Steps)
	}
	check(name+":v2", "v2\n")
	check(name, "v1\n") // the first template is immutable

	// 5. A failing RUN fails the operation with its output; no template.
	_, _, last = s.buildFile(t, name+"-bad", "FROM minimal\nRUN echo boom-marker; exit 3\n", "")
	if last.State != "failed" || last.Error == nil || last.Error.Code != "invalid_argument" ||
		!strings.Contains(last.Error.Message, "boom-marker") || !strings.Contains(last.Error.Message, "code 3") {
		t.Errorf("failing RUN: %+v", last)
	}
	if last.Error != nil {
		t.Logf("failed RUN: %s", last.Error.Message)
	}
	_, _, last = s.buildFile(t, name+"-bad", "FROM minimal\nUSER nosuchuser\nRUN true\n", "")
	if last.State != "failed" || last.Error == nil || last.Error.Code != "invalid_argument" || !strings.Contains(last.Error.Message, "nosuchuser") {
		t.Errorf("RUN as an unknown user: %+v", last.Error)
	}
	if st, _ := s.call(t, "GET", "/v1/templates/"+name+"-bad", nil, ""); st != 404 {
		t.Errorf("failed build left a template: %d", st)
	}
	if left, _ := os.ReadDir(filepath.Join(s.dataDir, "templates", "tmp")); len(left) > 0 {
		t.Errorf("staging left behind: %v", left)
	}

	// 6. Bad requests are refused up front with the error envelope.
	for _, bf := range []string{"RUN true\n", "FROM minimal\nADD x /x\n", "FROM minimal\nCOPY ../etc /x\n", "FROM a\nFROM b\n"} {
		body, ctype := buildfileBody(t, bf, "")
		if st, m := s.call(t, "POST", "/v1/templates/build?name=x", body, ctype); st != 400 || m["error"] == nil {
			t.Errorf("%q: %d %v", bf, st, m)
		}
	}
	if st, m := s.call(t, "POST", "/v1/templates/build?name=x", strings.NewReader("FROM minimal"), "text/plain"); st != 415 {
		t.Errorf("non-multipart: %d %v", st, m)
	}
	if st, m := s.call(t, "POST", "/v1/templates/build?name=Bad:Name:x", strings.NewReader(""), "text/plain"); st != 400 {
		t.Errorf("bad name: %d %v", st, m)
	}
	// A context tar that escapes is refused; nothing lands outside.
	victimDir := t.TempDir()
	var escBuf bytes.Buffer
	mw := multipart.NewWriter(&escBuf)
	part, _ := mw.CreateFormFile("buildfile", "Buildfile")
	part.Write([]byte("FROM minimal\nCOPY . /x\n"))
	part, _ = mw.CreateFormFile("context", "context.tar")
	part.Write(mkTar(t, []*tar.Header{{Name: "../../../../../../" + strings.TrimPrefix(victimDir, "/") + "/pwned"}}, map[string][]byte{}))
	mw.Close()
	if st, m := s.call(t, "POST", "/v1/templates/build?name=x", &escBuf, mw.FormDataContentType()); st != 400 {
		t.Errorf("escaping context: %d %v", st, m)
	}
	if ents, _ := os.ReadDir(victimDir); len(ents) > 0 {
		t.Errorf("escaping context wrote %v", ents)
	}
	big, bigType := buildfileBody(t, "FROM minimal\n"+strings.Repeat("# padding\n", 300<<10/10), "")
	if st, m := s.call(t, "POST", "/v1/templates/build?name=x", big, bigType); st != 413 {
		t.Errorf("huge build file: %d %v", st, m)
	}
	// A builtin is public: read-only to a project key (403); an admin key
	// may delete public templates, but not the builtins (409).
	if st, m := s.call(t, "DELETE", "/v1/templates/minimal", nil, ""); st != 403 {
		t.Errorf("delete builtin with a project key: %d %v", st, m)
	}
	admin, err := s.CreateKey("ops", "--admin")
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := s.raw(t, admin, "DELETE", "/v1/templates/minimal"); st != 409 {
		t.Errorf("delete builtin with an admin key: %d", st)
	}
	if left, _ := filepath.Glob(filepath.Join(os.TempDir(), "space-build-context-*")); len(left) > 0 {
		t.Errorf("context dirs left: %v", left)
	}

	// 7. Alias, and delete refused while a sandbox uses the template.
	alias := name + ":stable"
	if st, m := s.call(t, "POST", "/v1/templates/"+name+"/alias", strings.NewReader(`{"alias":"`+alias+`"}`), "application/json"); st != 200 || m["digest"] != tp.Digest {
		t.Fatalf("alias: %d %v", st, m)
	}
	out, errOut, err := s.cli(t, "sandbox", "create", "--template", alias)
	if err != nil {
		t.Fatalf("sandbox of alias: %v\n%s%s", err, out, errOut)
	}
	sb := strings.TrimSpace(out)
	if st, m := s.call(t, "DELETE", "/v1/templates/"+alias, nil, ""); st != 409 {
		t.Errorf("delete in use: %d %v", st, m)
	}
	if _, _, err := s.cli(t, "sandbox", "rm", "--wait", sb); err != nil {
		t.Fatal(err)
	}
	if _, errOut, err := s.cli(t, "template", "delete", alias); err != nil {
		t.Errorf("delete after rm: %v %s", err, errOut)
	}
	if st, _ := s.call(t, "GET", "/v1/templates/"+alias, nil, ""); st != 404 {
		t.Errorf("deleted alias still there: %d", st)
	}
	if st, _ := s.call(t, "GET", "/v1/templates/"+name, nil, ""); st != 200 {
		t.Errorf("deleting the alias removed the original: %d", st)
	}

	// 8. The CLI: plain progress lines off a terminal, --json result.
	bfPath := filepath.Join(t.TempDir(), "Buildfile")
	os.WriteFile(bfPath, []byte(testBuildfile), 0o644)
	out, errOut, err = s.cli(t, "template", "build", "-f", bfPath, "-t", name+":cli", dir)
	if err != nil {
		t.Fatalf("cli build: %v\n%s%s", err, out, errOut)
	}
	if strings.Contains(errOut, "\r") {
		t.Errorf("cli progress off a terminal has carriage returns:\n%q", errOut)
	}
	// Plain lines: a step that runs a while shows its running and done
	// lines (the stream is connected by then).
	slowPlain := filepath.Join(t.TempDir(), "Buildfile.slow")
	os.WriteFile(slowPlain, []byte("FROM minimal\nRUN sleep 2; echo plain # "+suffix+"\n"), 0o644)
	if _, plain, err := s.cli(t, "template", "build", "--no-context", "-f", slowPlain, "-t", name+":plain"); err != nil ||
		!strings.Contains(plain, "step 2/2 RUN sleep 2; echo plain # "+suffix+": running\n") ||
		!regexp.MustCompile(`(?m)^step 2/2 RUN sleep 2; echo plain # \d+: done in \d+\.\d+s \(6 bytes\)$`).MatchString(plain) {
		t.Errorf("cli plain progress: %v\n%s", err, plain)
	}
	if !strings.Contains(out, "built "+name+":cli") || !strings.Contains(out, fmt.Sprintf("%d/%d steps cached", len(res.Steps), len(res.Steps))) ||
		strings.Count(out, " cached ") != len(res.Steps) {
		t.Errorf("cli output %q", out)
	}
	// On a terminal (script(1) gives the CLI a pty) the step line is
	// rewritten in place. The step sleeps so that the CLI's event stream
	// is connected while it runs.
	if scriptBin, err := exec.LookPath("script"); err == nil {
		slow := filepath.Join(t.TempDir(), "Buildfile.slow")
		os.WriteFile(slow, []byte("FROM minimal\nRUN sleep 2 # "+suffix+"\n"), 0o644)
		cmdline := fmt.Sprintf("%s template build --no-context -f %s -t %s", s.bin, slow, name+":tty")
		cmd := exec.Command(scriptBin, "-qec", cmdline, "/dev/null")
		cmd.Env = append(os.Environ(), "SPACE_URL="+s.ctrl, "SPACE_API_KEY="+s.key)
		tty, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(tty), "\r\x1b[Kstep 2/2 RUN sleep 2 # "+suffix+": running") || !strings.Contains(string(tty), "built "+name+":tty") {
			t.Errorf("tty progress: %v %q", err, tty)
		}
	}
	out, errOut, err = s.cli(t, "template", "build", "--json", "-f", bfPath, "-t", name+":cli", dir)
	var jr buildResult
	if err != nil || json.Unmarshal([]byte(out), &jr) != nil || jr.Template.Digest != res3.Template.Digest {
		t.Errorf("cli --json: %v %q %s", err, out, errOut)
	}
}
