// Package k8s runs SPACE on a real single-node Kubernetes cluster that
// scripts/k8s.sh builds from source and starts on this host: the SPACE
// image imported into its containerd, deploy/kubernetes/local-single
// applied with kubectl, and a sandbox created and run through the Service;
// then the Helm chart installed in its place and driven through the
// Service (helm_test.go); then the split layout, deploy/kubernetes/local
// (split_test.go).
package k8s

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/space-sandbox/space/test/testenv"
)

// The cluster's fixed places (scripts/k8s.sh defaults; the local-single
// overlay names the data directory).
const (
	cache   = "/var/cache/space/k8s"
	state   = "/var/lib/space-k8s"
	dataDir = state + "/space-data"
	cgName  = "space-k8s"
	bridge  = "spk8s0"
)

// script runs scripts/k8s.sh with args and returns its stdout.
func script(t *testing.T, d time.Duration, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(testenv.RepoRoot(), "scripts/k8s.sh")}, args...)...)
	cmd.Dir = testenv.RepoRoot()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("k8s.sh %s: %w\n%s", strings.Join(args, " "), err, tail(errb.String(), 4000))
	}
	return strings.TrimSpace(out.String()), nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// built reports whether every component is in the cache (DONE markers).
func built() bool {
	for _, c := range []string{"etcd", "containerd", "cni", "kubernetes"} {
		m, _ := filepath.Glob(filepath.Join(cache, c, "*", "DONE"))
		if len(m) == 0 {
			return false
		}
	}
	return true
}

type kube struct {
	t         *testing.T
	bin, kcfg string
}

func (k kube) run(d time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, k.bin, append([]string{"--kubeconfig", k.kcfg}, args...)...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s%s", strings.Join(args, " "), err, out, errb.Bytes())
	}
	return strings.TrimSpace(string(out)), nil
}

func (k kube) must(d time.Duration, args ...string) string {
	k.t.Helper()
	out, err := k.run(d, args...)
	if err != nil {
		k.t.Fatal(err)
	}
	return out
}

// TestCluster is the reproduction: SPACE had never run on a
// cluster. SPACE_TEST_K8S=1 (scripts/test.sh, after building the cluster's
// binaries) makes a missing prerequisite a failure instead of a skip.
func TestCluster(t *testing.T) {
	required := os.Getenv("SPACE_TEST_K8S") == "1"
	skip := func(why string) {
		t.Helper()
		if required {
			t.Fatalf("SPACE_TEST_K8S=1 but %s", why)
		}
		t.Skip(why)
	}
	if os.Geteuid() != 0 {
		skip("needs root (the cluster runs on this host)")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		skip("runc is not installed (scripts/deps.sh --test installs it)")
	}
	if !built() {
		skip("the cluster's binaries are not in " + cache + " (scripts/k8s.sh build, ~30 min the first time; scripts/test.sh runs it)")
	}
	if _, err := os.Stat(state); err == nil {
		if apiserverRunning() {
			skip("a cluster of scripts/k8s.sh is up on this host (scripts/k8s.sh down)")
		}
		// What a killed run left: the state dir is the script's alone.
		if _, err := script(t, 5*time.Minute, "down"); err != nil {
			t.Fatal(err)
		}
	}

	start := time.Now()
	before := hostSysctls()
	t.Cleanup(func() { down(t, before) })
	kcfg, err := script(t, 15*time.Minute, "up")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster up in %v", time.Since(start).Round(time.Second))
	env, err := script(t, time.Minute, "env")
	if err != nil {
		t.Fatal(err)
	}
	k := kube{t: t, kcfg: kcfg}
	for _, f := range strings.Fields(env) {
		if p, ok := strings.CutPrefix(f, "PATH="); ok {
			k.bin = filepath.Join(strings.Split(p, ":")[0], "kubectl")
		}
	}

	// The binaries carry their release, not v0.0.0-master.
	var ver struct {
		Server struct {
			GitVersion string `json:"gitVersion"`
		} `json:"serverVersion"`
	}
	if err := json.Unmarshal([]byte(k.must(time.Minute, "version", "-o", "json")), &ver); err != nil {
		t.Fatal(err)
	}
	if ver.Server.GitVersion != "v1.37.2" {
		t.Errorf("kube-apiserver reports %q, want v1.37.2", ver.Server.GitVersion)
	}
	info := k.must(time.Minute, "get", "node", "-o", "jsonpath={.items[0].status.nodeInfo.kubeletVersion} {.items[0].status.nodeInfo.containerRuntimeVersion}")
	if !strings.HasPrefix(info, "v1.37.2 containerd://2.") {
		t.Errorf("node reports %q, want kubelet v1.37.2 on containerd v2", info)
	}

	t0 := time.Now()
	if _, err := script(t, 10*time.Minute, "image"); err != nil {
		t.Fatal(err)
	}
	t.Logf("image built and imported in %v", time.Since(t0).Round(time.Second))
	t0 = time.Now()
	t.Cleanup(func() {
		// Sandboxes end with their pod; deleting the workload first lets the
		// server stop them before the cluster goes.
		k.run(3*time.Minute, "delete", "-k", filepath.Join(testenv.RepoRoot(), "deploy/kubernetes/local-single"), "--wait=true")
	})
	k.must(2*time.Minute, "apply", "-k", filepath.Join(testenv.RepoRoot(), "deploy/kubernetes/local-single"))
	if out, err := k.run(6*time.Minute, "-n", "space", "rollout", "status", "daemonset/space-server", "--timeout=5m"); err != nil {
		pods, _ := k.run(time.Minute, "-n", "space", "get", "pods", "-o", "wide")
		ev, _ := k.run(time.Minute, "-n", "space", "get", "events", "--sort-by=.lastTimestamp")
		t.Fatalf("%v\n%s\npods:\n%s\nevents:\n%s\nlogs:\n%s", err, out, pods, tail(ev, 4000), podLogs())
	}

	// Through the Service (kube-proxy's ClusterIP), as a client would.
	srv, _, key := serve(t, k, "k8s")
	sb, err := srv.CreateSandbox(key, map[string]any{"template": "minimal"})
	if err != nil {
		t.Fatalf("%v\nlogs:\n%s", err, podLogs())
	}
	podIP := k.must(time.Minute, "-n", "space", "get", "pods", "-l", "app.kubernetes.io/name=space-server", "-o", "jsonpath={.items[0].status.podIP}")
	if sb.Data != "http://"+podIP+":7071" {
		t.Errorf("session data_url %q, want the pod's http://%s:7071", sb.Data, podIP)
	}
	got, code, err := sb.Run("echo hello from $(hostname); cat /proc/1/cgroup | head -3", "")
	if err != nil || code != 0 || !strings.Contains(got, "hello from") {
		t.Fatalf("run: %q exit %d %v\nlogs:\n%s", got, code, err, podLogs())
	}
	t.Logf("sandbox %s: %s", sb.ID, got)
	st, m, err := testenv.DoJSON("DELETE", srv.Ctrl+"/v1/sandboxes/"+sb.ID, map[string]string{"X-API-Key": key}, nil)
	if err != nil || st != http.StatusAccepted {
		t.Fatalf("delete: %d %v %v", st, m, err)
	}
	op, err := srv.WaitOp(key, m["operation"].(map[string]any)["id"].(string), 2*time.Minute)
	if err != nil || op["state"] != "succeeded" {
		t.Fatalf("delete op: %v %v", op, err)
	}
	t.Logf("kustomize part in %v", time.Since(t0).Round(time.Second))

	// The Helm chart with local-single's values, in its place (the same
	// host directory: the store and templates carry over).
	t0 = time.Now()
	k.must(4*time.Minute, "delete", "-k", filepath.Join(testenv.RepoRoot(), "deploy/kubernetes/local-single"), "--wait=true")
	t.Logf("kustomization deleted in %v", time.Since(t0).Round(time.Second))
	testChart(t, k)

	// The split layout: servers, a node DaemonSet and PostgreSQL.
	testSplit(t, k)
	// The same with the Helm chart (layout=split).
	testChartSplit(t, k)
	t.Logf("whole run %v", time.Since(start).Round(time.Second))
}

// podLogs is the tail of every container log in the namespace space
// (kubectl logs would need the apiserver to reach the kubelet, which
// listens on loopback).
func podLogs() string {
	files, _ := filepath.Glob(filepath.Join(state, "pod-logs", "space_*", "*", "*.log"))
	var b strings.Builder
	for _, f := range files {
		raw, _ := os.ReadFile(f)
		fmt.Fprintf(&b, "== %s\n%s\n", f, tail(string(raw), 3000))
	}
	return b.String()
}

// apiserverRunning reports whether the kube-apiserver that up recorded runs.
func apiserverRunning() bool {
	b, err := os.ReadFile(filepath.Join(state, "pids", "kube-apiserver"))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return err == nil && pid > 0 && syscall.Kill(pid, 0) == nil
}

// sysctls are the host settings the cluster's components change.
var sysctls = []string{"net/ipv4/ip_forward", "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

func hostSysctls() map[string]string {
	m := map[string]string{}
	for _, k := range sysctls {
		b, _ := os.ReadFile("/proc/sys/" + k)
		m[k] = strings.TrimSpace(string(b))
	}
	return m
}

// down stops the cluster and checks that nothing of it is left on the host.
func down(t *testing.T, before map[string]string) {
	t.Helper()
	if _, err := script(t, 5*time.Minute, "down"); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(state); err == nil {
		t.Errorf("%s left after down", state)
	}
	left, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgName)
	if len(left) > 0 {
		t.Errorf("cgroups left after down: %v", left)
	}
	if _, err := os.Stat("/sys/class/net/" + bridge); err == nil {
		t.Errorf("bridge %s left after down", bridge)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if bytes.Contains(mounts, []byte(" "+state+"/")) {
		t.Errorf("mounts under %s left after down", state)
	}
	if out, _ := exec.Command("nft", "list", "tables").Output(); bytes.Contains(out, []byte("kube-proxy")) {
		t.Errorf("nftables tables of kube-proxy left after down:\n%s", out)
	}
	if out, _ := exec.Command("nft", "list", "ruleset").Output(); bytes.Contains(out, []byte("KUBE-")) {
		t.Errorf("KUBE- chains in the host's ruleset after down:\n%s", tail(string(out), 2000))
	}
	for k, v := range hostSysctls() {
		if v != before[k] {
			t.Errorf("%s is %s after down, was %s", k, v, before[k])
		}
	}
}
