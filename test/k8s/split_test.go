package k8s

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

// testSplit deploys the split layout on the cluster
// (deploy/kubernetes/local: two unprivileged `space server --remote-nodes`
// replicas, the privileged `space node` DaemonSet and PostgreSQL, from the
// image `scripts/k8s.sh postgres` builds) and drives it through the
// Service: the Python SDK's quickstart, a rolling restart of the servers
// under a stream of operations, the e2b SDK smoke (with a port preview
// URL), snapshot and fork, and the node pod deleted and recreated.
func testSplit(t *testing.T, k kube) {
	start := time.Now()
	// What docs/install-kubernetes.md tells a reader to run is what runs here.
	doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs/install-kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"sudo scripts/k8s.sh postgres\n", "kubectl apply -k deploy/kubernetes/local\n",
		"kubectl -n space rollout status statefulset/space-postgres\n", "kubectl -n space rollout status daemonset/space-node\n",
		"kubectl -n space rollout status deployment/space-server\n", "keys create --store \"$DSN\""} {
		if !strings.Contains(string(doc), line) {
			t.Errorf("docs/install-kubernetes.md does not show %q, which this test runs", line)
		}
	}
	if _, err := script(t, 15*time.Minute, "postgres"); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL image imported in %v", time.Since(start).Round(time.Second))
	dir := filepath.Join(testenv.RepoRoot(), "deploy/kubernetes/local")
	t.Cleanup(func() {
		// The node stops its sandboxes when its pod goes, before the cluster.
		k.run(4*time.Minute, "delete", "-k", dir, "--wait=true")
	})
	k.must(2*time.Minute, "apply", "-k", dir)
	for _, w := range []string{"statefulset/space-postgres", "daemonset/space-node", "deployment/space-server"} {
		if out, err := k.run(6*time.Minute, "-n", "space", "rollout", "status", w, "--timeout=5m"); err != nil {
			pods, _ := k.run(time.Minute, "-n", "space", "get", "pods", "-o", "wide")
			ev, _ := k.run(time.Minute, "-n", "space", "get", "events", "--sort-by=.lastTimestamp")
			t.Fatalf("%v\n%s\npods:\n%s\nevents:\n%s\nlogs:\n%s", err, out, pods, tail(ev, 4000), podLogs())
		}
	}
	t.Logf("split layout rolled out in %v", time.Since(start).Round(time.Second))

	srv, key := splitServe(t, k, "split")

	pythonQuickstart(t, srv.Ctrl, key)
	rollingRestart(t, k, srv, key)
	testEgress(t, k, srv, key)

	nodePod := func() (name, ip string) {
		out := k.must(time.Minute, "-n", "space", "get", "pods", "-l", "app.kubernetes.io/name=space-node", "-o", "jsonpath={.items[0].metadata.name} {.items[0].status.podIP}")
		name, ip, _ = strings.Cut(out, " ")
		return name, ip
	}
	_, nodeIP := nodePod()
	var (
		live    testenv.Sandbox
		livePID string
	)
	drive(t, srv, "http://"+nodeIP+":7071", key, func() {
		live, livePID = startLive(t, srv, key)
		old, _ := nodePod()
		t0 := time.Now()
		k.must(3*time.Minute, "-n", "space", "delete", "pod", old, "--wait=true")
		if _, err := k.run(4*time.Minute, "-n", "space", "rollout", "status", "daemonset/space-node", "--timeout=3m"); err != nil {
			t.Fatalf("the node pod did not come back: %v\nlogs:\n%s", err, podLogs())
		}
		t.Logf("node pod %s replaced in %v", old, time.Since(t0).Round(time.Second))
	})
	liveAfter(t, srv, key, live, livePID)
	srv.DeleteSandboxes(key)
	// Make room for the chart's split layout (testChartSplit).
	k.must(4*time.Minute, "delete", "-k", dir, "--wait=true")
	t.Logf("split part in %v", time.Since(start).Round(time.Second))
}

// splitServe waits for the split layout's servers behind the Service
// space and its minimal template, with an API key of project created in
// the shared store through the Service of PostgreSQL (the DSN of the
// Secret space-db names its ClusterIP).
func splitServe(t *testing.T, k kube, project string) (*testenv.Server, string) {
	t.Helper()
	raw := k.must(time.Minute, "-n", "space", "get", "secret", "space-db", "-o", "jsonpath={.data.dsn}")
	dsn, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(state, "image/space"), "keys", "create", "--store", string(dsn), "--data-dir", t.TempDir(), "--project", project).Output()
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	key := strings.TrimSpace(string(out))
	ip := k.must(time.Minute, "-n", "space", "get", "service", "space", "-o", "jsonpath={.spec.clusterIP}")
	srv := &testenv.Server{Ctrl: "http://" + ip + ":7070"}
	waitHealthy(t, srv)
	if err := srv.WaitTemplate(key, "minimal", 5*time.Minute); err != nil {
		t.Fatalf("%v\nlogs:\n%s", err, podLogs())
	}
	return srv, key
}

// pythonQuickstart runs the first example of sdk/python/README.md as it is
// written (the repo's Python SDK, standard library only) against the
// Service: create, commands, stdin, files, pause and resume, snapshot and
// fork. Its template is minimal, which every node builds at start: base
// needs a Debian mirror, which the pods cannot reach (no masquerade on the
// pod network).
func pythonQuickstart(t *testing.T, ctrl, key string) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("SPACE_TEST_K8S") == "1" {
			t.Fatal("SPACE_TEST_K8S=1 but python3 is missing")
		}
		t.Log("skipping the Python quickstart: no python3")
		return
	}
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "sdk/python/README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```python\n(.*?)```").FindSubmatch(raw)
	if m == nil {
		t.Fatal("sdk/python/README.md has no Python example")
	}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", string(m[1]))
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(testenv.RepoRoot(), "sdk/python"), "SPACE_URL="+ctrl, "SPACE_API_KEY="+key)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "3 b'hello\\n' b'oops\\n'") || !strings.Contains(string(out), "not_found") {
		t.Fatalf("the Python SDK's README example: %v\n%s\nlogs:\n%s", err, out, podLogs())
	}
	t.Logf("Python SDK quickstart in %v", time.Since(t0).Round(time.Second))
}

// rollingRestart restarts the servers' Deployment (maxUnavailable 0: one
// new replica ready before an old one goes) while a client creates and
// deletes sandboxes through the Service without pause. Every operation a
// server accepted must succeed: none is lost or interrupted by its
// replica's going. A request that gets no answer (its connection cut by a
// replica going away) is sent again with the same Idempotency-Key, as a
// client should, and counts as one operation.
func rollingRestart(t *testing.T, k kube, srv *testenv.Server, key string) {
	t.Helper()
	hdr := func(idem string) map[string]string {
		return map[string]string{"X-API-Key": key, "Idempotency-Key": idem}
	}
	var (
		mu      sync.Mutex
		ops     []string
		retries int
	)
	// send posts until it gets an answer; transport errors are retried.
	send := func(method, url, idem string, body any) (int, map[string]any, error) {
		for i := 0; ; i++ {
			st, m, err := testenv.DoJSON(method, url, hdr(idem), body)
			if err == nil || i == 20 {
				return st, m, err
			}
			mu.Lock()
			retries++
			mu.Unlock()
			time.Sleep(250 * time.Millisecond)
		}
	}
	stop := make(chan struct{})
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			st, m, err := send("POST", srv.Ctrl+"/v1/sandboxes", fmt.Sprintf("rr-create-%d", n), map[string]any{"template": "minimal"})
			if err != nil || st != http.StatusAccepted {
				errs <- fmt.Errorf("create %d: %d %v %v", n, st, m, err)
				return
			}
			id := m["sandbox"].(map[string]any)["id"].(string)
			mu.Lock()
			ops = append(ops, m["operation"].(map[string]any)["id"].(string))
			mu.Unlock()
			if op, err := waitOpAcross(srv, key, m["operation"].(map[string]any)["id"].(string)); err != nil || op["state"] != "succeeded" {
				errs <- fmt.Errorf("create %d (%s): %v %v", n, id, op, err)
				return
			}
			st, m, err = send("DELETE", srv.Ctrl+"/v1/sandboxes/"+id, fmt.Sprintf("rr-delete-%d", n), nil)
			if err != nil || st != http.StatusAccepted {
				errs <- fmt.Errorf("delete %s: %d %v %v", id, st, m, err)
				return
			}
			mu.Lock()
			ops = append(ops, m["operation"].(map[string]any)["id"].(string))
			mu.Unlock()
		}
	}()
	t0 := time.Now()
	time.Sleep(2 * time.Second)
	k.must(time.Minute, "-n", "space", "rollout", "restart", "deployment/space-server")
	_, rerr := k.run(5*time.Minute, "-n", "space", "rollout", "status", "deployment/space-server", "--timeout=4m")
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	if rerr != nil {
		t.Fatalf("rollout restart: %v\nlogs:\n%s", rerr, podLogs())
	}
	select {
	case err := <-errs:
		t.Fatalf("during the rolling restart: %v\nlogs:\n%s", err, podLogs())
	default:
	}
	lost := 0
	for _, id := range ops {
		op, err := srv.WaitOp(key, id, 3*time.Minute)
		if err != nil || op["state"] != "succeeded" {
			lost++
			t.Errorf("operation %s after the rolling restart: %v %v", id, op, err)
		}
	}
	if len(ops) < 4 {
		t.Errorf("only %d operations during the rolling restart", len(ops))
	}
	t.Logf("rolling restart of the servers in %v: %d operations, %d of them not succeeded; %d requests sent again after a cut connection", time.Since(t0).Round(time.Second), len(ops), lost, retries)
}

// waitOpAcross waits for an operation like testenv's WaitOp, asking again
// when a replica going away cuts the long poll.
func waitOpAcross(srv *testenv.Server, key, id string) (map[string]any, error) {
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		st, m, err := testenv.DoJSON("GET", srv.Ctrl+"/v1/operations/"+id+"?wait=10s", map[string]string{"X-API-Key": key}, nil)
		if err != nil {
			time.Sleep(250 * time.Millisecond)
			continue
		}
		if st != http.StatusOK {
			return m, fmt.Errorf("get operation %s: %d %v", id, st, m)
		}
		if s := m["state"]; s == "succeeded" || s == "failed" || s == "cancelled" {
			return m, nil
		}
	}
	return nil, fmt.Errorf("operation %s not done after 3m", id)
}

// startLive creates a running sandbox with a process in the background
// and a file, for liveAfter once its pod has been replaced; it returns the
// sandbox and the process's pid.
func startLive(t *testing.T, srv *testenv.Server, key string) (testenv.Sandbox, string) {
	t.Helper()
	live, err := srv.CreateSandbox(key, map[string]any{"template": "minimal"})
	if err != nil {
		t.Fatalf("%v\nlogs:\n%s", err, podLogs())
	}
	out, code, err := live.Run("echo kept > /tmp/kept; sleep 3600 >/dev/null 2>&1 </dev/null & echo $!", "")
	if err != nil || code != 0 {
		t.Fatalf("background process: %q exit %d %v", out, code, err)
	}
	pid := strings.TrimSpace(out)
	if out, code, err := live.Run("kill -0 "+pid+" && cat /tmp/kept", ""); err != nil || code != 0 || out != "kept\n" {
		t.Fatalf("the background process %s before its pod goes: %q exit %d %v", pid, out, code, err)
	}
	return live, pid
}

// liveAfter checks that a sandbox that was running when its pod was
// replaced was re-adopted by the new pod: still running, it answers
// commands, its background process pid is the same process (its start
// time in /proc is older than the new pod) and its files are there; then
// it is deleted like any other.
func liveAfter(t *testing.T, srv *testenv.Server, key string, live testenv.Sandbox, pid string) {
	t.Helper()
	hdr := map[string]string{"X-API-Key": key}
	deadline := time.Now().Add(time.Minute)
	for {
		st, m, err := testenv.DoJSON("GET", srv.Ctrl+"/v1/sandboxes/"+live.ID, hdr, nil)
		if err != nil || st != http.StatusOK {
			t.Fatalf("get %s: %d %v %v", live.ID, st, m, err)
		}
		if m["state"] != "running" {
			t.Fatalf("the sandbox running when its pod was replaced: %v (%v), want running (re-adopted)\nlogs:\n%s", m["state"], m["state_reason"], podLogs())
		}
		st, s, err := testenv.DoJSON("POST", srv.Ctrl+"/v1/sandboxes/"+live.ID+"/session", hdr, nil)
		if err == nil && st == http.StatusOK {
			live.Token, live.Data = s["token"].(string), s["data_url"].(string)
			out, code, err := live.Run("kill -0 "+pid+" && cat /proc/"+pid+"/cmdline | tr '\\0' ' ' && cat /tmp/kept", "")
			if err == nil && code == 0 && out == "sleep 3600 kept\n" {
				t.Logf("the sandbox running when its pod was replaced: re-adopted, its background process %s and /tmp/kept are there", pid)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the re-adopted sandbox: %q exit %d %v\nlogs:\n%s", out, code, err, podLogs())
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox running when its pod was replaced is reported running but does not answer: %d %v %v\nlogs:\n%s", st, s, err, podLogs())
		}
		time.Sleep(time.Second)
	}
	st, m, err := testenv.DoJSON("DELETE", srv.Ctrl+"/v1/sandboxes/"+live.ID, hdr, nil)
	if err != nil || st != http.StatusAccepted {
		t.Fatalf("delete the re-adopted sandbox: %d %v %v", st, m, err)
	}
	waitOK(t, srv, key, m, "delete the re-adopted sandbox")
}
