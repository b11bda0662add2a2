package snapshot_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/criu"
)

// hostTraces lists what sandbox id has on the host: mounts, its cgroup,
// processes in it, its state dir and run-dir entries.
func (e *env) hostTraces(id string) []string {
	var out []string
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, id) {
			out = append(out, "mount: "+line)
		}
	}
	filepath.WalkDir("/sys/fs/cgroup", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if strings.Count(p, "/") > 10 {
			return filepath.SkipDir
		}
		if filepath.Base(filepath.Dir(p)) == e.CgroupBase() && filepath.Base(p) == id {
			out = append(out, "cgroup: "+p)
			return filepath.SkipDir
		}
		return nil
	})
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		if cg, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cgroup")); err == nil && strings.Contains(string(cg), "/"+e.CgroupBase()+"/"+id) {
			cmd, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
			out = append(out, fmt.Sprintf("process %s: %q", d.Name(), cmd))
		}
	}
	if _, err := os.Stat(filepath.Join(e.DataDir, "sandboxes", id)); err == nil {
		out = append(out, "file: state dir")
	}
	if m, _ := filepath.Glob(filepath.Join(e.RunDir, "*"+id+"*")); len(m) > 0 {
		out = append(out, fmt.Sprintf("run dir: %v", m))
	}
	return out
}

func (e *env) waitNoTraces(t *testing.T, id, when string) {
	t.Helper()
	var l []string
	for i := 0; i < 50; i++ {
		if l = e.hostTraces(id); len(l) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: sandbox %s left on the host:\n%s", when, id, strings.Join(l, "\n"))
}

// Hibernate snapshots the files and destroys the instance; the sandbox
// stays hibernated across a kill -9 of the server; resume restores the
// files byte for byte into the same id, with the old session; delete of a
// hibernated or resumed sandbox leaves nothing.
func TestHibernateRestartResume(t *testing.T) {
	e := need(t)
	sb := e.create(t, map[string]any{"timeout_seconds": 600})
	sb.ok(t, `mkdir -p /work/d && echo small > /work/small && dd if=/dev/urandom of=/work/big bs=1M count=20 2>/dev/null && ln -s small /work/link && chmod 0640 /work/small && echo x > /work/d/x`)
	before := sb.tree(t)
	sb.start(t, `sleep 1000`)
	if len(e.hostTraces(sb.ID)) == 0 {
		t.Fatalf("no host traces found for a running sandbox: the check is blind")
	}

	// With scripts/criu.sh's CRIU the namespace driver captures the
	// processes too; without it hibernation is filesystem-only.
	hib, resumed, sleeps := "filesystem-only", "afresh", "0"
	if _, _, err := criu.ProbeSandboxes(context.Background(), ""); err == nil {
		hib, resumed, sleeps = "process hibernation", "continues every process", "1"
	} else {
		t.Logf("no CRIU for the namespace driver (%v): filesystem-only hibernation", err)
	}
	t0 := time.Now()
	_, done := e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/hibernate", nil)
	hibLat := time.Since(t0)
	res := done["result"].(map[string]any)
	snapID := str(res, "hibernated_snapshot")
	if res["state"] != "hibernated" || snapID == "" || res["expires_at"] != nil || num(res, "paused_remaining_ms") < 590000 || !strings.Contains(str(res, "processes"), hib) {
		t.Fatalf("hibernated sandbox: %v", res)
	}
	e.waitNoTraces(t, sb.ID, "after hibernate")
	if st, m, _ := sb.dp("POST", "/commands", map[string]any{"shell": "true"}); st < 400 {
		t.Fatalf("command on a hibernated sandbox: %d %v", st, m)
	}
	// Its snapshot is held: deleting it is refused.
	if st, _, _ := e.call("DELETE", "/v1/snapshots/"+snapID, nil); st != 409 {
		t.Fatalf("delete of the hibernation snapshot: %d, want 409", st)
	}

	e.Kill9()
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	if got := e.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, nil); got["state"] != "hibernated" {
		t.Fatalf("after restart: %v", got)
	}
	if got := e.must(t, 200, "GET", "/v1/sandboxes?state=hibernated", nil); !strings.Contains(fmt.Sprint(got), sb.ID) {
		t.Fatalf("list state=hibernated: %v", got)
	}
	e.waitNoTraces(t, sb.ID, "after restart")

	t1 := time.Now()
	_, done = e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil)
	resLat := time.Since(t1)
	res = done["result"].(map[string]any)
	exp, _ := time.Parse(time.RFC3339Nano, str(res, "expires_at"))
	if res["state"] != "running" || res["hibernated_snapshot"] != nil || time.Until(exp) < 580*time.Second || !strings.Contains(str(res, "processes"), resumed) {
		t.Fatalf("resumed sandbox: %v", res)
	}
	// The old session still works; the files are the same, byte for byte.
	if after := sb.tree(t); after != before {
		t.Fatalf("files changed across hibernate:\n%s\n----\n%s", before, after)
	}
	// The old sleep is back with a process snapshot, gone without.
	if out := sb.ok(t, `echo again >> /work/small && cat /work/small && for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 1000' || true`); out != "small\nagain\n"+sleeps+"\n" {
		t.Fatalf("command after resume: %q", out)
	}
	if st, _, _ := e.call("POST", "/v1/sandboxes/"+sb.ID+"/resume", nil); st != 202 {
		t.Fatalf("resume of a running sandbox: %d", st)
	}

	// Hibernate again and delete while hibernated: nothing is left, and the
	// snapshots can then be deleted.
	_, done = e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/hibernate", nil)
	snap2 := str(done, "result", "hibernated_snapshot")
	sb.delete(t)
	e.waitNoTraces(t, sb.ID, "after delete")
	if _, err := os.Stat(filepath.Join(e.DataDir, "logs", sb.ID)); err == nil {
		t.Fatalf("logs of the deleted sandbox left")
	}
	e.op(t, "DELETE", "/v1/snapshots/"+snap2, nil)
	e.op(t, "DELETE", "/v1/snapshots/"+snapID, nil)
	t.Logf("hibernate %v, resume after restart %v (API round trips incl. operation wait; 20 MB tree)", hibLat, resLat)
}

// A sandbox with auto_pause_seconds is paused, not deleted, once it had no
// data-plane call and no running command for that long; a running command
// keeps it awake; an explicit resume continues it.
func TestAutoPauseIdle(t *testing.T) {
	e := need(t)
	sb := e.create(t, map[string]any{"auto_pause_seconds": 1, "timeout_seconds": 600})
	defer sb.delete(t)
	if got := e.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, nil); num(got, "auto_pause_seconds") != 1 {
		t.Fatalf("auto_pause_seconds not recorded: %v", got)
	}
	// A command that runs for 2.5 s is activity (control calls are not).
	t0 := time.Now()
	sb.start(t, "sleep 2.5; echo ok > /tmp/done")
	for time.Since(t0) < 2*time.Second {
		if got := e.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, nil); got["state"] != "running" {
			t.Fatalf("paused while a command ran: %v", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var got map[string]any
	for time.Since(t0) < 10*time.Second {
		if got = e.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, nil); got["state"] == "paused" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got["state"] != "paused" || got["expires_at"] != nil {
		t.Fatalf("not auto-paused after %v idle: %v", time.Since(t0), got)
	}
	idle := time.Since(t0)
	if idle < 3400*time.Millisecond {
		t.Fatalf("auto-paused %v after the start of a 2.5 s command: sooner than 1 s after its end", idle)
	}
	if st, m, _ := sb.dp("POST", "/commands", map[string]any{"shell": "true"}); st != 409 || str(m, "error", "code") != "sandbox_paused" {
		t.Fatalf("command on an auto-paused sandbox: %d %v", st, m)
	}
	e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil)
	if out := sb.ok(t, "cat /tmp/done"); out != "ok\n" {
		t.Fatalf("after resume: %q", out)
	}
	t.Logf("auto-paused %v after the start of a 2.5 s command (auto_pause_seconds 1, reaper tick 1 s)", idle.Round(10*time.Millisecond))
}

// TestTimeoutHibernateAutoResume: a sandbox created with on_timeout
// "hibernate" is hibernated (not deleted) when its timeout is reached, and
// with auto_resume the next data-plane call brings it back, files intact
// and with its whole timeout again.
func TestTimeoutHibernateAutoResume(t *testing.T) {
	e := need(t)
	if st, m, _ := e.call("POST", "/v1/sandboxes", map[string]any{"template": "minimal", "on_timeout": "sleep"}); st != 400 {
		t.Fatalf("bad on_timeout accepted: %d %v", st, m)
	}
	sb := e.create(t, map[string]any{"timeout_seconds": 2, "on_timeout": "hibernate", "auto_resume": true})
	defer e.call("DELETE", "/v1/sandboxes/"+sb.ID, nil) // the test deletes it; this is for early failures
	sb.ok(t, "echo kept > /root/mark")
	var got map[string]any
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if got = e.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, nil); got["state"] == "hibernated" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got["state"] != "hibernated" || str(got, "hibernated_snapshot") == "" {
		t.Fatalf("not hibernated at its timeout: %v", got)
	}
	e.waitNoTraces(t, sb.ID, "after timeout hibernation")
	// The data plane resumes it instead of answering 409 sandbox_paused.
	t0 := time.Now()
	if out := sb.ok(t, "cat /root/mark"); out != "kept\n" {
		t.Fatalf("after auto-resume: %q", out)
	}
	took := time.Since(t0)
	got = e.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, nil)
	if got["state"] != "running" {
		t.Fatalf("state after auto-resume: %v", got)
	}
	exp, err := time.Parse(time.RFC3339Nano, str(got, "expires_at"))
	if err != nil || time.Until(exp) < time.Second {
		t.Fatalf("woken without its timeout again: expires_at %v (%v)", got["expires_at"], err)
	}
	t.Logf("timeout hibernation, then auto-resume on the first command: %v", took.Round(time.Millisecond))
	// The snapshot the timeout took is the server's own: deleting the
	// sandbox deletes it.
	list := e.must(t, 200, "GET", "/v1/snapshots?sandbox_id="+sb.ID, nil)
	snaps, _ := list["snapshots"].([]any)
	if len(snaps) != 1 || snaps[0].(map[string]any)["auto"] != true {
		t.Fatalf("timeout snapshots of %s: %v", sb.ID, list)
	}
	snap := snaps[0].(map[string]any)["id"].(string)
	e.op(t, "DELETE", "/v1/sandboxes/"+sb.ID, nil)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if st, _, _ := e.call("GET", "/v1/snapshots/"+snap, nil); st == 404 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the timeout's snapshot %s outlived its sandbox: %d", snap, st)
		}
	}
}

// TestAutoResumePaused: an idle-paused sandbox with auto_resume continues
// on the next data-plane call; without auto_resume it answers 409.
func TestAutoResumePaused(t *testing.T) {
	e := need(t)
	sb := e.create(t, map[string]any{"timeout_seconds": 600, "auto_resume": true})
	defer sb.delete(t)
	sb.start(t, "i=0; while true; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.05; done")
	e.op(t, "POST", "/v1/sandboxes/"+sb.ID+"/pause", nil)
	if got := e.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, nil); got["state"] != "paused" || got["auto_resume"] != true {
		t.Fatalf("after pause: %v", got)
	}
	if out := sb.ok(t, "cat /tmp/n"); strings.TrimSpace(out) == "" {
		t.Fatalf("counter after auto-resume: %q", out)
	}
	if got := e.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, nil); got["state"] != "running" {
		t.Fatalf("not running after auto-resume: %v", got)
	}
	plain := e.create(t, map[string]any{"timeout_seconds": 600})
	defer plain.delete(t)
	e.op(t, "POST", "/v1/sandboxes/"+plain.ID+"/pause", nil)
	if st, m, _ := plain.dp("POST", "/commands", map[string]any{"shell": "true"}); st != 409 || str(m, "error", "code") != "sandbox_paused" {
		t.Fatalf("paused sandbox without auto_resume: %d %v", st, m)
	}
}
