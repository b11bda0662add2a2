package k8s

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

// helmDocArgs returns the arguments of the n-th (from 0) `$HELM install`
// and `$HELM test` commands docs/install-kubernetes.md shows for this
// cluster (the single layout's, then the split layout's), so that the test
// runs what a reader runs.
func helmDocArgs(t *testing.T, n int) (install, test []string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs/install-kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(raw), "\\\n", " ")
	var installs, tests [][]string
	for _, m := range regexp.MustCompile(`(?m)^\$HELM (install|test) ([^\n]*)$`).FindAllStringSubmatch(text, -1) {
		args := append([]string{m[1]}, strings.Fields(strings.NewReplacer("'", "").Replace(m[2]))...)
		if m[1] == "install" {
			installs = append(installs, args)
		} else {
			tests = append(tests, args)
		}
	}
	if len(installs) <= n || len(tests) <= n {
		t.Fatalf("docs/install-kubernetes.md shows %d `$HELM install` and %d `$HELM test`, want %d", len(installs), len(tests), n+1)
	}
	return installs[n], tests[n]
}

// helmRun runs the helm scripts/k8s.sh built against the cluster.
func helmRun(helm, kcfg string, d time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, helm, append(args, "--kubeconfig", kcfg)...)
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// testChart installs the Helm chart as docs/install-kubernetes.md says and
// drives SPACE through its Service: an HTTP round trip, the e2b SDK
// (create, commands, files, pause and resume), a snapshot and its fork, a
// hibernated sandbox that outlives its server pod, and `helm test`.
func testChart(t *testing.T, k kube) {
	start := time.Now()
	helm, err := script(t, 30*time.Minute, "helm")
	if err != nil {
		t.Fatal(err)
	}
	install, test := helmDocArgs(t, 0)
	k.must(time.Minute, "create", "namespace", "space")
	k.must(time.Minute, "label", "namespace", "space", "pod-security.kubernetes.io/enforce=privileged")
	t.Cleanup(func() { helmRemove(helm, k) })
	if out, err := helmRun(helm, k.kcfg, 6*time.Minute, install...); err != nil {
		pods, _ := k.run(time.Minute, "-n", "space", "get", "pods", "-o", "wide")
		t.Fatalf("%v\npods:\n%s\nlogs:\n%s", err, pods, podLogs())
	} else {
		t.Logf("helm install in %v:\n%s", time.Since(start).Round(time.Second), tail(out, 600))
	}

	srv, ip, key := serve(t, k, "helm")
	var (
		live    testenv.Sandbox
		livePID string
	)
	drive(t, srv, "http://"+ip+":7071", key, func() {
		// A running sandbox outlives its server pod too (the single
		// layout's server is its host's node).
		live, livePID = startLive(t, srv, key)
		old := k.must(time.Minute, "-n", "space", "get", "pods", "-l", "app.kubernetes.io/name=space-server", "-o", "jsonpath={.items[0].metadata.name}")
		t0 := time.Now()
		k.must(3*time.Minute, "-n", "space", "delete", "pod", old, "--wait=true")
		if _, err := k.run(4*time.Minute, "-n", "space", "rollout", "status", "daemonset/space-server", "--timeout=3m"); err != nil {
			t.Fatalf("the server pod did not come back: %v\nlogs:\n%s", err, podLogs())
		}
		t.Logf("server pod %s replaced in %v", old, time.Since(t0).Round(time.Second))
	})
	liveAfter(t, srv, key, live, livePID)
	helmTest(t, helm, k, test)
	srv.DeleteSandboxes(key)
	// Make room for the split layout (testSplit) in the same namespace.
	if err := helmRemove(helm, k); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm part in %v", time.Since(start).Round(time.Second))
}

// drive runs what a client does through the Service: the e2b SDK (create,
// commands, files, pause and resume), a snapshot and its fork, and a
// hibernated sandbox that outlives its server: replace stops the server
// and starts a new one on the same host (the same node name and data
// directory), which resumes it with its files.
func drive(t *testing.T, srv *testenv.Server, data, key string, replace func()) {
	t.Helper()
	hdr := map[string]string{"X-API-Key": key}
	e2bSmoke(t, srv.Ctrl, data, key)

	// A snapshot of a sandbox, and a fork of it with its files.
	sb, err := srv.CreateSandbox(key, map[string]any{"template": "minimal"})
	if err != nil {
		t.Fatalf("%v\nlogs:\n%s", err, podLogs())
	}
	if got, code, err := sb.Run("echo forked-file > /tmp/f && cat /tmp/f", ""); err != nil || code != 0 || got != "forked-file\n" {
		t.Fatalf("run: %q exit %d %v", got, code, err)
	}
	st, m, err := testenv.DoJSON("POST", srv.Ctrl+"/v1/sandboxes/"+sb.ID+"/snapshots", hdr, nil)
	if err != nil || st != http.StatusAccepted {
		t.Fatalf("snapshot: %d %v %v", st, m, err)
	}
	waitOK(t, srv, key, m, "snapshot")
	snapID := m["snapshot"].(map[string]any)["id"].(string)
	st, m, err = testenv.DoJSON("POST", srv.Ctrl+"/v1/snapshots/"+snapID+"/fork", hdr, map[string]any{"count": 1})
	if err != nil || st != http.StatusAccepted {
		t.Fatalf("fork: %d %v %v", st, m, err)
	}
	f := m["sandboxes"].([]any)[0].(map[string]any)
	waitOK(t, srv, key, f, "fork")
	sess := f["session"].(map[string]any)
	fork := testenv.Sandbox{ID: f["sandbox"].(map[string]any)["id"].(string), Token: sess["token"].(string), Data: sess["data_url"].(string)}
	if got, code, err := fork.Run("cat /tmp/f", ""); err != nil || code != 0 || got != "forked-file\n" {
		t.Fatalf("the fork's /tmp/f: %q exit %d %v", got, code, err)
	}
	t.Logf("snapshot %s forked into %s", snapID, fork.ID)

	// A hibernated sandbox outlives its server pod: the new pod on the
	// host (same node name, same hostPath) resumes it with its files.
	st, m, err = testenv.DoJSON("POST", srv.Ctrl+"/v1/sandboxes/"+sb.ID+"/hibernate", hdr, nil)
	if err != nil || st != http.StatusAccepted {
		t.Fatalf("hibernate: %d %v %v", st, m, err)
	}
	waitOK(t, srv, key, m, "hibernate")
	replace()
	waitHealthy(t, srv)
	st, m, err = testenv.DoJSON("POST", srv.Ctrl+"/v1/sandboxes/"+sb.ID+"/resume", hdr, nil)
	if err != nil || st != http.StatusAccepted {
		t.Fatalf("resume after the pod's replacement: %d %v %v\nlogs:\n%s", st, m, err, podLogs())
	}
	waitOK(t, srv, key, m, "resume")
	st, m, err = testenv.DoJSON("POST", srv.Ctrl+"/v1/sandboxes/"+sb.ID+"/session", hdr, nil)
	if err != nil || st != http.StatusOK {
		t.Fatalf("session: %d %v %v", st, m, err)
	}
	sb.Token, sb.Data = m["token"].(string), m["data_url"].(string)
	if got, code, err := sb.Run("cat /tmp/f", ""); err != nil || code != 0 || got != "forked-file\n" {
		t.Fatalf("the resumed sandbox's /tmp/f: %q exit %d %v\nlogs:\n%s", got, code, err, podLogs())
	}
}

// serve waits for SPACE behind the Service space (kube-proxy's ClusterIP,
// as a client reaches it) and its minimal template, with an API key of
// project. The key goes into the server's SQLite store, in the pod's
// hostPath.
func serve(t *testing.T, k kube, project string) (srv *testenv.Server, ip, key string) {
	t.Helper()
	ip = k.must(time.Minute, "-n", "space", "get", "service", "space", "-o", "jsonpath={.spec.clusterIP}")
	srv = &testenv.Server{Ctrl: "http://" + ip + ":7070"}
	waitHealthy(t, srv)
	out, err := exec.Command(filepath.Join(state, "image/space"), "keys", "create", "--data-dir", dataDir, "--project", project).Output()
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	key = strings.TrimSpace(string(out))
	if err := srv.WaitTemplate(key, "minimal", 5*time.Minute); err != nil {
		t.Fatalf("%v\nlogs:\n%s", err, podLogs())
	}
	return srv, ip, key
}

// waitHealthy waits for the control API's /healthz through the Service.
func waitHealthy(t *testing.T, srv *testenv.Server) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, _, err := testenv.DoJSON("GET", srv.Ctrl+"/healthz", nil, nil)
		if err == nil && st == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/healthz: %d %v\nlogs:\n%s", srv.Ctrl, st, err, podLogs())
		}
		time.Sleep(time.Second)
	}
}

// waitOK waits for the operation of an accepted request to succeed.
func waitOK(t *testing.T, srv *testenv.Server, key string, m map[string]any, what string) {
	t.Helper()
	op, err := srv.WaitOp(key, m["operation"].(map[string]any)["id"].(string), 3*time.Minute)
	if err != nil || op["state"] != "succeeded" {
		t.Fatalf("%s: %v %v\nlogs:\n%s", what, op, err, podLogs())
	}
}

// e2bSmoke runs test/e2b/k8s.test.mjs (the e2b npm SDK, installed by
// scripts/e2b-deps.sh) against SPACE on the cluster.
func e2bSmoke(t *testing.T, ctrl, data, key string) {
	t.Helper()
	node, err := exec.LookPath("node")
	dir := filepath.Join(testenv.RepoRoot(), "test/e2b")
	if _, serr := os.Stat(filepath.Join(dir, "node_modules/e2b/package.json")); err != nil || serr != nil {
		if os.Getenv("SPACE_TEST_K8S") == "1" {
			t.Fatal("SPACE_TEST_K8S=1 but node or the e2b SDK is missing (scripts/e2b-deps.sh)")
		}
		t.Log("skipping the e2b SDK smoke: node or the e2b SDK is missing (scripts/e2b-deps.sh)")
		return
	}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "k8s.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+ctrl, "E2B_SANDBOX_URL="+data, "E2B_API_KEY="+key, "SPACE_E2B_TEMPLATE=minimal")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test k8s.test.mjs: %v\n%s\nlogs:\n%s", err, out, podLogs())
	}
	t.Logf("e2b SDK smoke in %v", time.Since(t0).Round(time.Second))
}

// testChartSplit installs the chart's split layout (servers, nodes and
// the in-cluster PostgreSQL) as docs/install-kubernetes.md says, in place
// of the kustomize one, runs the Python SDK's quickstart through its
// Service and `helm test`, and uninstalls it.
func testChartSplit(t *testing.T, k kube) {
	start := time.Now()
	helm, err := script(t, 30*time.Minute, "helm")
	if err != nil {
		t.Fatal(err)
	}
	install, test := helmDocArgs(t, 1)
	local := filepath.Join(testenv.RepoRoot(), "deploy/kubernetes/local")
	k.must(time.Minute, "create", "namespace", "space")
	k.must(time.Minute, "label", "namespace", "space", "pod-security.kubernetes.io/enforce=privileged")
	t.Cleanup(func() { helmRemove(helm, k, filepath.Join(local, "volume.yaml")) })
	k.must(time.Minute, "-n", "space", "apply", "-f", filepath.Join(local, "secret.yaml"))
	k.must(time.Minute, "apply", "-f", filepath.Join(local, "volume.yaml"))
	if out, err := helmRun(helm, k.kcfg, 6*time.Minute, install...); err != nil {
		pods, _ := k.run(time.Minute, "-n", "space", "get", "pods", "-o", "wide")
		t.Fatalf("%v\npods:\n%s\nlogs:\n%s", err, pods, podLogs())
	} else {
		t.Logf("helm install (split) in %v:\n%s", time.Since(start).Round(time.Second), tail(out, 300))
	}
	srv, key := splitServe(t, k, "helm-split")
	pythonQuickstart(t, srv.Ctrl, key)
	helmTest(t, helm, k, test)
	srv.DeleteSandboxes(key)
	if err := helmRemove(helm, k, filepath.Join(local, "volume.yaml")); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm split part in %v", time.Since(start).Round(time.Second))
}

// helmTest runs `helm test` with the arguments the docs show and checks
// that its pod succeeded.
func helmTest(t *testing.T, helm string, k kube, args []string) {
	t.Helper()
	out, err := helmRun(helm, k.kcfg, 4*time.Minute, args...)
	if err != nil {
		testLog, _ := k.run(time.Minute, "-n", "space", "logs", "space-test-healthz")
		desc, _ := k.run(time.Minute, "-n", "space", "describe", "pod", "space-test-healthz")
		t.Fatalf("%v\ntest pod log:\n%s\ntest pod:\n%s\nlogs:\n%s", err, testLog, tail(desc, 3000), podLogs())
	}
	if !strings.Contains(out, "Succeeded") {
		t.Errorf("helm test:\n%s", out)
	}
}

// helmRemove uninstalls the release, deletes the namespace and then the
// files given (cluster-scoped objects such as a PersistentVolume).
func helmRemove(helm string, k kube, files ...string) error {
	_, err := helmRun(helm, k.kcfg, 3*time.Minute, "uninstall", "space", "--namespace", "space", "--wait")
	if _, nerr := k.run(3*time.Minute, "delete", "namespace", "space", "--wait=true"); err == nil {
		err = nerr
	}
	for _, f := range files {
		if _, ferr := k.run(time.Minute, "delete", "-f", f, "--wait=true"); err == nil {
			err = ferr
		}
	}
	return err
}
