package templates

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/space-sandbox/space/test/testenv"
)

// startPrivateServer is startServer with its own template directory (GC
// must not touch the shared cache other suites use) and
// --allow-private-registries (the test registry is on loopback).
func startPrivateServer(t *testing.T) *server {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces, overlayfs, chown to the shifted range)")
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("needs /bin/busybox (busybox-static)")
	}
	srv, err := testenv.New("space-tplw-")
	if err != nil {
		t.Fatal(err)
	}
	srv.TemplateDir = filepath.Join(srv.Work, "templates")
	srv.Args = []string{"--builtins", "minimal", "--allow-private-registries", "--template-ready-timeout", "3s"}
	t.Cleanup(func() {
		srv.Stop()
		if t.Failed() {
			t.Logf("server log tail:\n%s", srv.LogTail(10000))
		}
		srv.Remove()
	})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// An operator key: these tests also publish templates and run GC.
	key, err := srv.CreateKey("p1", "--admin")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{Server: srv, bin: srv.Bin, dataDir: srv.DataDir, ctrl: srv.Ctrl, key: key}
	if err := s.WaitTemplate(s.key, "minimal", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	return s
}

type warmBuild struct {
	Template struct {
		Name          string `json:"name"`
		Digest        string `json:"digest"`
		WarmSnapshot  string `json:"warm_snapshot"`
		WarmProcesses string `json:"warm_processes"`
	} `json:"template"`
	Steps []struct {
		Step         int    `json:"step"`
		Instruction  string `json:"instruction"`
		Cached       bool   `json:"cached"`
		Output       string `json:"output"`
		LogBytes     int64  `json:"log_bytes"`
		LogTruncated bool   `json:"log_truncated"`
	} `json:"steps"`
	Warm *struct {
		Snapshot    string `json:"snapshot"`
		Kind        string `json:"kind"`
		Processes   string `json:"processes"`
		ReadyChecks int    `json:"ready_checks"`
		Cached      bool   `json:"cached"`
	} `json:"warm"`
}

// build runs a build-file build and returns its operation id and last event.
func (s *server) build(t *testing.T, tname, file, dir string) (string, opEvent, warmBuild) {
	t.Helper()
	body, ctype := buildfileBody(t, file, dir)
	st, m := s.call(t, "POST", "/v1/templates/build?name="+tname, body, ctype)
	if st != 202 {
		t.Fatalf("build %s: %d %v", tname, st, m)
	}
	id := m["operation"].(map[string]any)["id"].(string)
	evs := s.followFrom(t, id, "1")
	last := evs[len(evs)-1]
	var res warmBuild
	if last.State == "succeeded" {
		if err := json.Unmarshal(last.Result, &res); err != nil {
			t.Fatalf("result %s: %v", last.Result, err)
		}
	}
	return id, last, res
}

func (s *server) raw(t *testing.T, key, method, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, s.ctrl+path, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPrewarm: a build file with START and READY is pre-warmed (start
// command run, ready check polled, snapshot taken); sandboxes of the
// template start from that snapshot with the state the start command
// prepared; a start command that fails fails the build and leaves nothing.
func TestPrewarm(t *testing.T) {
	s := startPrivateServer(t)
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
	// The stamp is written once, by the first run of the start command
	// (during the pre-warm): every sandbox of the template must see that
	// same value, whether or not the start command runs again at create.
	file := `FROM minimal
USER root
ENV RUN_ID=` + suffix + `
RUN mkdir -p /srv/state && echo built > /srv/state/built
START /bin/sh -c '[ -f /srv/state/stamp ] || { cat /proc/sys/kernel/random/uuid > /srv/state/stamp; echo $$ > /srv/state/pid; }; echo ready > /srv/state/ready; while true; do sleep 1; done'
READY test -f /srv/state/ready
`
	t0 := time.Now()
	// Published (an admin key, public=true), so other projects may use it.
	_, last, res := s.build(t, "warm-"+suffix+"&public=true", file, "")
	if last.State != "succeeded" {
		t.Fatalf("build: %+v %+v", last.Error, last)
	}
	t.Logf("build with pre-warm: %v", time.Since(t0))
	if res.Warm == nil || res.Warm.Snapshot == "" || res.Warm.ReadyChecks < 1 || res.Template.WarmSnapshot != res.Warm.Snapshot {
		t.Fatalf("no pre-warm in the result: %+v", res)
	}
	t.Logf("warm: %+v", *res.Warm)
	_, tm := s.call(t, "GET", "/v1/templates/warm-"+suffix, nil, "")
	if tm["warm_snapshot"] != res.Warm.Snapshot || tm["warm_processes"] == "" {
		t.Errorf("template info: %v", tm)
	}
	// The snapshot went through the normal path: a ready snapshot of the
	// builder's project; the pre-warm sandbox is gone.
	_, sn := s.call(t, "GET", "/v1/snapshots/"+res.Warm.Snapshot, nil, "")
	if sn["state"] != "ready" {
		t.Errorf("warm snapshot: %v", sn)
	}
	if _, l := s.call(t, "GET", "/v1/sandboxes", nil, ""); len(l["sandboxes"].([]any)) != 0 {
		t.Errorf("pre-warm sandbox left: %v", l)
	}

	var stamps []string
	for i := 0; i < 2; i++ {
		t1 := time.Now()
		out, errOut, err := s.cli(t, "sandbox", "create", "--template", "warm-"+suffix)
		if err != nil {
			t.Fatalf("create: %v %s%s", err, out, errOut)
		}
		id := strings.TrimSpace(out)
		t.Logf("create from the warm template: %v", time.Since(t1))
		_, sb := s.call(t, "GET", "/v1/sandboxes/"+id, nil, "")
		if sb["snapshot"] != res.Warm.Snapshot {
			t.Errorf("sandbox did not start from the warm snapshot: %v", sb)
		}
		out, errOut, err = s.cli(t, "sandbox", "exec", id, "--shell", "cat /srv/state/built /srv/state/stamp")
		if err != nil {
			t.Fatalf("exec: %v %s%s", err, out, errOut)
		}
		lines := strings.Fields(out)
		if len(lines) != 2 || lines[0] != "built" {
			t.Fatalf("sandbox state: %q", out)
		}
		stamps = append(stamps, lines[1])
		// Exactly one start command runs: re-run at create (files only,
		// namespace) or the pre-warm's own process, restored (gvisor).
		out, _, _ = s.cli(t, "sandbox", "exec", id, "--shell", "ps -o pid,args 2>/dev/null || ps")
		if n := strings.Count(out, "while true"); n != 1 {
			t.Errorf("%d start commands running: %q", n, out)
		}
		if res.Warm.Kind == "process" {
			// The very process the pre-warm started lives on.
			if out, errOut, err := s.cli(t, "sandbox", "exec", id, "--shell", "kill -0 $(cat /srv/state/pid)"); err != nil {
				t.Errorf("pre-warm process not restored: %v %s%s", err, out, errOut)
			}
		}
		if out, errOut, err := s.cli(t, "sandbox", "rm", "--wait", id); err != nil {
			t.Fatalf("rm: %v %s%s", err, out, errOut)
		}
	}
	if stamps[0] != stamps[1] {
		t.Errorf("sandboxes saw different stamps (not from one snapshot): %v", stamps)
	}
	// Another project's sandboxes start from the public template too (the
	// snapshot record stays the builder's).
	key2, err := s.CreateKey("p2")
	if err != nil {
		t.Fatal(err)
	}
	other := &server{Server: s.Server, bin: s.bin, dataDir: s.dataDir, ctrl: s.ctrl, key: key2}
	out, errOut, err := other.cli(t, "sandbox", "create", "--template", "warm-"+suffix)
	if err != nil {
		t.Fatalf("create in p2: %v %s%s", err, out, errOut)
	}
	id2 := strings.TrimSpace(out)
	if out, _, _ := other.cli(t, "sandbox", "exec", id2, "--shell", "cat /srv/state/stamp"); strings.TrimSpace(out) != stamps[0] {
		t.Errorf("p2 sandbox state: %q, want %q", out, stamps[0])
	}
	if st, _ := other.raw(t, key2, "GET", "/v1/snapshots/"+res.Warm.Snapshot); st != 404 {
		t.Errorf("p2 can read p1's warm snapshot record: %d", st)
	}
	if out, errOut, err := other.cli(t, "sandbox", "rm", "--wait", id2); err != nil {
		t.Fatalf("rm: %v %s%s", err, out, errOut)
	}

	// A rebuild with unchanged inputs keeps the warm snapshot.
	_, last, res2 := s.build(t, "warm-"+suffix+"&public=true", file, "")
	if last.State != "succeeded" || res2.Warm == nil || !res2.Warm.Cached || res2.Warm.Snapshot != res.Warm.Snapshot {
		t.Errorf("rebuild: %+v %+v", last.Error, res2.Warm)
	}

	// Deleting the template drops its warm snapshot.
	if st, m := s.call(t, "DELETE", "/v1/templates/warm-"+suffix, nil, ""); st != 204 {
		t.Fatalf("delete: %d %v", st, m)
	}
	if st, _ := s.call(t, "GET", "/v1/snapshots/"+res.Warm.Snapshot, nil, ""); st != 404 {
		t.Errorf("warm snapshot outlived its template: %d", st)
	}

	// A start command that exits fails the build with its output; the name
	// is not created and no sandbox or snapshot is left.
	bad := `FROM minimal
START /bin/sh -c 'echo start-failure-marker; exit 3'
READY test -f /nope
`
	_, last, _ = s.build(t, "warm-bad-"+suffix, bad, "")
	if last.State != "failed" || last.Error == nil || !strings.Contains(last.Error.Message, "start-failure-marker") ||
		last.Error.Code != "invalid_argument" {
		t.Errorf("failing start: %+v", last.Error)
	}
	if st, _ := s.call(t, "GET", "/v1/templates/warm-bad-"+suffix, nil, ""); st != 404 {
		t.Errorf("failed pre-warm left the name: %d", st)
	}
	// A ready check that never passes (the server's --template-ready-timeout
	// is 3s here) fails the build with the check's output.
	never := `FROM minimal
START /bin/sh -c 'while true; do sleep 1; done'
READY /bin/sh -c 'echo not-ready-marker; exit 1'
`
	t2 := time.Now()
	_, last, _ = s.build(t, "warm-never-"+suffix, never, "")
	if last.State != "failed" || last.Error == nil || !strings.Contains(last.Error.Message, "not-ready-marker") ||
		!strings.Contains(last.Error.Message, "did not pass within 3s") || last.Error.Code != "invalid_argument" {
		t.Errorf("never ready: %+v", last.Error)
	}
	if d := time.Since(t2); d > 30*time.Second {
		t.Errorf("never-ready build took %v", d)
	}
	if st, _ := s.call(t, "GET", "/v1/templates/warm-never-"+suffix, nil, ""); st != 404 {
		t.Errorf("failed pre-warm left the name: %d", st)
	}
	// A rebuild of an existing name whose pre-warm fails puts the old
	// template back.
	_, last, okRes := s.build(t, "warm-keep-"+suffix, "FROM minimal\nENV V=1\n", "")
	if last.State != "succeeded" {
		t.Fatalf("plain build: %+v", last.Error)
	}
	if _, last, _ = s.build(t, "warm-keep-"+suffix, never, ""); last.State != "failed" {
		t.Errorf("never ready over an existing name: %+v", last)
	}
	if _, tm := s.call(t, "GET", "/v1/templates/warm-keep-"+suffix, nil, ""); tm["digest"] != okRes.Template.Digest {
		t.Errorf("old template not restored: %v, want %s", tm, okRes.Template.Digest)
	}
	_, l := s.call(t, "GET", "/v1/sandboxes", nil, "")
	_, sl := s.call(t, "GET", "/v1/snapshots", nil, "")
	if len(l["sandboxes"].([]any)) != 0 || len(sl["snapshots"].([]any)) != 0 {
		t.Errorf("left after a failed pre-warm: %v %v", l, sl)
	}
}

// TestBuildLogsGCAndPrivateRegistry: full step logs over the API and CLI,
// template GC, and image pulls from a loopback registry with
// --allow-private-registries.
func TestBuildLogsGCAndPrivateRegistry(t *testing.T) {
	s := startPrivateServer(t)
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)

	// 1. A RUN step writing 300 KiB: the result keeps 64 KiB, the log all.
	file := `FROM minimal
ENV RUN_ID=` + suffix + `
RUN i=0; while [ $i -lt 3000 ]; do printf 'line %05d %090d\n' $i 0; i=$((i+1)); done; echo first-step-end
RUN echo second
`
	op, last, res := s.build(t, "logs-"+suffix, file, "")
	if last.State != "succeeded" {
		t.Fatalf("build: %+v", last.Error)
	}
	if len(res.Steps) != 4 || res.Steps[2].LogBytes != int64(3000*102+len("first-step-end\n")) || res.Steps[2].LogTruncated {
		t.Fatalf("steps: %d, step 3 log %d bytes (truncated %v)", len(res.Steps), res.Steps[2].LogBytes, res.Steps[2].LogTruncated)
	}
	st, body := s.raw(t, s.key, "GET", "/v1/templates/builds/"+op+"/logs?step=3")
	if st != 200 || !strings.HasPrefix(body, "line 00000 ") || !strings.HasSuffix(body, "first-step-end\n") || int64(len(body)) != res.Steps[2].LogBytes {
		t.Errorf("step log: %d, %d bytes", st, len(body))
	}
	st, body = s.raw(t, s.key, "GET", "/v1/templates/builds/"+op+"/logs")
	if st != 200 || !strings.Contains(body, `"step":3`) || !strings.Contains(body, `"step":4`) {
		t.Errorf("log list: %d %s", st, body)
	}
	out, errOut, err := s.cli(t, "template", "logs", op, "--step", "4")
	if err != nil || out != "second\n" {
		t.Errorf("cli logs: %v %q %s", err, out, errOut)
	}
	bf := filepath.Join(t.TempDir(), "Buildfile")
	if err := os.WriteFile(bf, []byte("FROM minimal\nENV RUN_ID="+suffix+"\nRUN echo cli-log-marker\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = s.cli(t, "template", "build", "-f", bf, "-t", "clilogs-"+suffix, "--no-context", "--logs")
	if err != nil || !strings.Contains(out, "--- step 3/3 RUN echo cli-log-marker\ncli-log-marker\n") {
		t.Errorf("build --logs: %v %q %s", err, out, errOut)
	}
	key2, err := s.CreateKey("p2")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key, path string
		want      int
	}{
		{key2, "/v1/templates/builds/" + op + "/logs?step=3", 404},  // another project's build
		{s.key, "/v1/templates/builds/" + op + "/logs?step=1", 404}, // FROM has no log
		{s.key, "/v1/templates/builds/" + op + "/logs?step=x", 400},
		{s.key, "/v1/templates/builds/" + op + "/logs?step=0", 400},
		{s.key, "/v1/templates/builds/op-zz/logs", 404},
		{s.key, "/v1/templates/builds/op-0000000000000000/logs", 404},
	} {
		if st, body := s.raw(t, c.key, "GET", c.path); st != c.want || !strings.Contains(body, `"error"`) {
			t.Errorf("%s: %d %s", c.path, st, body)
		}
	}

	// 2. GC: the layers of a deleted template go; named ones stay.
	tdir := s.Server.TemplateDir
	d1 := filepath.Join(tdir, "rootfs", strings.TrimPrefix(res.Template.Digest, "sha256:"))
	if _, err := os.Stat(d1); err != nil {
		t.Fatalf("layer dir: %v", err)
	}
	out, errOut, err = s.cli(t, "template", "gc")
	if err != nil || strings.Contains(out, res.Template.Digest) {
		t.Errorf("gc removed a named layer: %v %q %s", err, out, errOut)
	}
	if st, m := s.call(t, "DELETE", "/v1/templates/logs-"+suffix, nil, ""); st != 204 {
		t.Fatalf("delete: %d %v", st, m)
	}
	st, m := s.call(t, "POST", "/v1/templates/gc", nil, "")
	removed := fmt.Sprint(m["removed"])
	if st != 200 || !strings.Contains(removed, res.Template.Digest) {
		t.Errorf("gc: %d %v", st, m)
	}
	if _, err := os.Stat(d1); !os.IsNotExist(err) {
		t.Errorf("layer still on disk: %v", err)
	}
	if st, _ := s.call(t, "GET", "/v1/templates/minimal", nil, ""); st != 200 {
		t.Errorf("gc removed minimal: %d", st)
	}
	// A rebuild makes the layers again.
	if _, last, _ := s.build(t, "logs-"+suffix, file, ""); last.State != "succeeded" {
		t.Errorf("rebuild after gc: %+v", last.Error)
	}

	// 3. A loopback registry works with --allow-private-registries, as an
	// image source and as a build file's FROM.
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref := strings.TrimPrefix(reg.URL, "http://") + "/e2e/img:1"
	r, _ := name.ParseReference(ref)
	if err := remote.Write(r, busyboxImage(t, "RUN_ID="+suffix)); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"name": "reg-" + suffix, "source": "image", "image": ref})
	st, m = s.call(t, "POST", "/v1/templates", strings.NewReader(string(b)), "application/json")
	if st != 202 {
		t.Fatalf("image build: %d %v", st, m)
	}
	evs := s.follow(t, m["operation"].(map[string]any)["id"].(string))
	if l := evs[len(evs)-1]; l.State != "succeeded" {
		t.Errorf("private registry image: %+v", l.Error)
	}
	_, last, _ = s.build(t, "regfrom-"+suffix, "FROM "+ref+"\nRUN cat /app/hello > /app/copy\n", "")
	if last.State != "succeeded" {
		t.Errorf("FROM a private registry: %+v", last.Error)
	}
}
