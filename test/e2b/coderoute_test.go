package e2btest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// TestCodeRoute runs code through SPACE's own API on a code-interpreter-v1
// sandbox: the data plane's POST /v1/sandboxes/{id}/code with the Go SDK
// (languages, state, rich results, errors, timeouts), `space sandbox
// run-code`, and the round trips docs/PERFORMANCE.md quotes.
func TestCodeRoute(t *testing.T) {
	e := needInterp(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := client.New(e.Ctrl, e.key)
	t0 := time.Now()
	sc := createConn(ctx, t, c, "code-interpreter-v1")
	created := time.Since(t0)
	t1 := time.Now()
	ex, err := sc.RunCode(ctx, client.CodeRequest{Code: "x = 1; x + 1"}, nil)
	first := time.Since(t1)
	if err != nil || ex.Text() != "2" {
		t.Fatalf("first run: %+v %v", ex, err)
	}

	t.Run("python", func(t *testing.T) {
		var seen []string
		ex, err := sc.RunCode(ctx, client.CodeRequest{Code: "import os, sys\nprint('out'); print('err', file=sys.stderr)\nos.environ['PER_RUN'] + str(x)",
			EnvVars: map[string]string{"PER_RUN": "env-"}}, func(ev client.CodeEvent) error { seen = append(seen, ev.Type); return nil })
		if err != nil || ex.Text() != "env-1" || !slices.Equal(ex.Stdout, []string{"out\n"}) || !slices.Equal(ex.Stderr, []string{"err\n"}) || ex.ExecutionCount < 2 {
			t.Errorf("%+v %v", ex, err)
		}
		if seen[0] != client.CodeEventExecutionCount || seen[len(seen)-1] != client.CodeEventEnd {
			t.Errorf("events %v", seen)
		}
		ex, err = sc.RunCode(ctx, client.CodeRequest{Code: "1/0"}, nil)
		if err != nil || ex.Error == nil || ex.Error.Name != "ZeroDivisionError" || !strings.Contains(ex.Error.Traceback, "ZeroDivisionError") {
			t.Errorf("1/0: %+v %v", ex, err)
		}
		ex, err = sc.RunCode(ctx, client.CodeRequest{Code: "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\nplt.show()\n" +
			"import pandas as pd\npd.DataFrame({'a': [1, 2]})"}, nil)
		if err != nil || len(ex.Results) != 2 || len(ex.Results[0].PNG) < 1000 || !strings.Contains(ex.Results[1].HTML, "<table") || string(ex.Results[1].Data) != `{"a":[1,2]}` {
			t.Errorf("plot and table: %v %v", err, ex.Results)
		}
	})
	t.Run("javascript, typescript, r, bash", func(t *testing.T) {
		for _, tc := range []struct{ lang, code, want string }{
			{"javascript", "let j = 20; j * 2", "40"},
			{"javascript", "j + 1", "21"},
			{"typescript", "interface P { n: number }\nconst p: P = { n: 20 }; p.n * 2", "40"},
			{"ts", "p.n + 1", "21"},
			{"r", "r <- 20; r * 2", "[1] 40"},
			{"r", "r + 1", "[1] 21"},
		} {
			ex, err := sc.RunCode(ctx, client.CodeRequest{Code: tc.code, Language: tc.lang}, nil)
			if err != nil || ex.Text() != tc.want || ex.Error != nil {
				t.Errorf("%s %q: %+v %v, want %q", tc.lang, tc.code, ex, err, tc.want)
			}
		}
		ex, err := sc.RunCode(ctx, client.CodeRequest{Code: "let bad: = 1", Language: "typescript"}, nil)
		if err != nil || ex.Error == nil || ex.Error.Name != "SyntaxError" {
			t.Errorf("typescript syntax error: %+v %v", ex, err)
		}
		ex, err = sc.RunCode(ctx, client.CodeRequest{Code: "B=5; cd /tmp; echo \"b=$B\"", Language: "bash"}, nil)
		if err != nil || !slices.Equal(ex.Stdout, []string{"b=5\n"}) {
			t.Errorf("bash: %+v %v", ex, err)
		}
		ex, err = sc.RunCode(ctx, client.CodeRequest{Code: "echo $B $PWD; exit_with() { return $1; }; exit_with 3", Language: "bash"}, nil)
		if err != nil || !slices.Equal(ex.Stdout, []string{"5 /tmp\n"}) || ex.Error == nil || ex.Error.Name != "ExitCode" || ex.Error.Value != "3" {
			t.Errorf("bash state and exit status: %+v %v", ex, err)
		}
	})
	t.Run("timeout interrupts", func(t *testing.T) {
		start := time.Now()
		ex, err := sc.RunCode(ctx, client.CodeRequest{Code: "import time\ntime.sleep(60)", Timeout: time.Second}, nil)
		if err != nil || ex.Error == nil || ex.Error.Name != "TimeoutError" || time.Since(start) > 20*time.Second {
			t.Errorf("timeout: %+v %v after %s", ex, err, time.Since(start))
		}
		if ex, err := sc.RunCode(ctx, client.CodeRequest{Code: "x"}, nil); err != nil || ex.Text() != "1" {
			t.Errorf("after the timeout: %+v %v", ex, err)
		}
	})
	t.Run("refusals", func(t *testing.T) {
		var ae *client.APIError
		if _, err := sc.RunCode(ctx, client.CodeRequest{Code: "1", Language: "cobol"}, nil); !errors.As(err, &ae) || ae.Status != 400 || ae.Code != "unsupported_language" {
			t.Errorf("cobol: %v", err)
		}
		if _, err := sc.RunCode(ctx, client.CodeRequest{Code: "1", ContextID: "nope"}, nil); !errors.As(err, &ae) || ae.Status != 404 {
			t.Errorf("unknown context: %v", err)
		}
		base := createConn(ctx, t, c, e.template)
		if _, err := base.RunCode(ctx, client.CodeRequest{Code: "1"}, nil); !errors.As(err, &ae) || ae.Status != 409 || ae.Code != "no_interpreter" {
			t.Errorf("%s sandbox: %v", e.template, err)
		}
	})
	t.Run("cli", func(t *testing.T) {
		run := func(stdin string, args ...string) (string, string, int) {
			cmd := exec.CommandContext(ctx, e.Bin, append([]string{"sandbox", "run-code", "--url", e.Ctrl}, args...)...)
			cmd.Env = append(os.Environ(), "SPACE_API_KEY="+e.key)
			cmd.Stdin = strings.NewReader(stdin)
			var out, errOut strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &errOut
			err := cmd.Run()
			var xe *exec.ExitError
			if err != nil && !errors.As(err, &xe) {
				t.Fatal(err)
			}
			return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
		}
		id := sc.Session().SandboxID
		if out, errOut, code := run("", id, "print('hi'); 6 * 7"); out != "hi\n42\n" || code != 0 {
			t.Errorf("python: %q %q %d", out, errOut, code)
		}
		if out, _, code := run("echo from stdin", "--language", "bash", id, "-"); out != "from stdin\n" || code != 0 {
			t.Errorf("bash from stdin: %q %d", out, code)
		}
		if _, errOut, code := run("", id, "undefined_name"); code != 1 || !strings.Contains(errOut, "NameError") {
			t.Errorf("error: %q %d", errOut, code)
		}
		dir := t.TempDir()
		if _, errOut, code := run("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()", "--save-images", dir, id); code != 0 {
			t.Errorf("plot: %q %d", errOut, code)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "result-1.png")); err != nil || !strings.HasPrefix(string(b), "\x89PNG") {
			t.Errorf("saved plot: %v", err)
		}
	})
	t.Run("python sdk", func(t *testing.T) {
		py, err := exec.LookPath("python3")
		if err != nil {
			t.Skip("python3 not on PATH")
		}
		dir := filepath.Join(repoRoot(), "sdk", "python")
		cmd := exec.CommandContext(ctx, py, "-m", "unittest", "-v", "tests.test_integration.CodeInterpreterTest")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONPATH="+dir, "SPACE_URL="+e.Ctrl, "SPACE_API_KEY="+e.key,
			"SPACE_TEST_CODE_TEMPLATE=code-interpreter-v1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "OK") || strings.Contains(string(out), "skipped") {
			t.Fatalf("python SDK run_code: %v\n%s", err, out)
		}
	})
	t.Run("round trips", func(t *testing.T) {
		const n = 50
		var code, cmd []time.Duration
		for range n {
			s := time.Now()
			if ex, err := sc.RunCode(ctx, client.CodeRequest{Code: "x+1"}, nil); err != nil || ex.Text() != "2" {
				t.Fatalf("x+1: %+v %v", ex, err)
			}
			code = append(code, time.Since(s))
		}
		for range n {
			s := time.Now()
			if _, err := sc.Run(ctx, client.ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil {
				t.Fatal(err)
			}
			cmd = append(cmd, time.Since(s))
		}
		slices.Sort(code)
		slices.Sort(cmd)
		t.Logf("native API: create %s, first RunCode %s, RunCode(x+1) p50 %s p90 %s, Run(true) p50 %s p90 %s",
			created.Round(time.Millisecond), first.Round(time.Millisecond), code[n/2].Round(10*time.Microsecond), code[n*9/10].Round(10*time.Microsecond),
			cmd[n/2].Round(10*time.Microsecond), cmd[n*9/10].Round(10*time.Microsecond))
	})
}

// createConn creates a sandbox, waits until it runs and connects to it;
// the test deletes it at the end.
func createConn(ctx context.Context, t *testing.T, c *client.Client, template string) *client.SandboxConn {
	t.Helper()
	res, err := c.CreateSandbox(ctx, client.CreateRequest{Template: template}, "")
	if err != nil {
		t.Fatalf("create %s: %v", template, err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), res.Sandbox.ID) })
	if _, err := c.WaitOperation(ctx, res.Operation.ID); err != nil {
		t.Fatalf("create %s: %v", template, err)
	}
	return c.Sandbox(res.Session)
}
