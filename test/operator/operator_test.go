package operator_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/operator"
	"github.com/space-sandbox/space/pkg/client"
)

const ns = "team"

// poolSize and burstSize are the acceptance test's of issue 29: a warm
// pool of 5 and a burst of 20 claims (the operator killed in the middle).
const (
	poolSize  = 5
	burstSize = 20
)

// templateObj is a SandboxTemplate on SPACE's builtin minimal template
// (busybox): the test machine pulls no images. Unmanaged networking keeps
// SPACE's default (blocked egress), which needs no egress gateway.
func templateObj(name string) map[string]any {
	return map[string]any{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
		"metadata": map[string]any{"name": name, "namespace": ns,
			"annotations": map[string]string{operator.AnnotSpaceTemplate: "minimal"}},
		"spec": map[string]any{
			"podTemplate": map[string]any{"spec": map[string]any{
				"containers": []any{map[string]any{"name": "main", "image": "busybox:1.36",
					"env":       []any{map[string]any{"name": "FROM_TEMPLATE", "value": "yes"}},
					"resources": map[string]any{"limits": map[string]any{"cpu": "500m", "memory": "256Mi"}}}},
				"restartPolicy": "Never"}},
			"networkPolicyManagement": "Unmanaged",
			"envVarsInjectionPolicy":  "Allowed"}}
}

func poolObj(name, tmpl string, replicas int) map[string]any {
	return map[string]any{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"replicas": replicas, "sandboxTemplateRef": map[string]any{"name": tmpl}}}
}

func claimObj(name, pool string, env map[string]string) map[string]any {
	spec := map[string]any{"warmPoolRef": map[string]any{"name": pool}}
	for k, v := range env {
		spec["env"] = append(asSlice(spec["env"]), map[string]any{"name": k, "value": v})
	}
	return map[string]any{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec}
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

func ready(conds []operator.Condition, typ string) (bool, string) {
	for _, c := range conds {
		if c.Type == typ {
			return c.Status == "True", c.Reason + ": " + c.Message
		}
	}
	return false, "no " + typ + " condition"
}

// waitClaimReady waits for the claim's Ready condition and returns it.
func waitClaimReady(t *testing.T, c *cluster, name string, d time.Duration) operator.SandboxClaim {
	t.Helper()
	var cl operator.SandboxClaim
	waitFor(t, d, "claim "+name+" Ready", func() error {
		cl = operator.SandboxClaim{}
		if err := c.getObj(operator.ResClaim, ns, name, &cl); err != nil {
			return err
		}
		if ok, why := ready(cl.Status.Conditions, operator.CondReady); !ok {
			return fmt.Errorf("%s", why)
		}
		return nil
	})
	return cl
}

// session reads the Sandbox's Secret.
func session(t *testing.T, c *cluster, name string) client.Session {
	t.Helper()
	var sec struct {
		Data map[string]string `json:"data"`
	}
	if err := c.getObj(operator.ResSecret, ns, name, &sec); err != nil {
		t.Fatalf("secret %s: %v", name, err)
	}
	dec := func(k string) string {
		b, err := base64.StdEncoding.DecodeString(sec.Data[k])
		if err != nil || len(b) == 0 {
			t.Fatalf("secret %s: no %s", name, k)
		}
		return string(b)
	}
	return client.Session{SandboxID: dec("sandbox_id"), Token: dec("token"), DataURL: dec("data_url")}
}

func run(t *testing.T, s client.Session, script string) string {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ex, err := client.NewSandboxConn(s).Run(ctx, client.ExecRequest{Shell: script}, &out, &errb)
	if err != nil || ex.Code != 0 {
		t.Fatalf("run %q in %s: %v %+v %s", script, s.SandboxID, err, ex, errb.String())
	}
	return strings.TrimSpace(out.String())
}

func patch(t *testing.T, c *cluster, r operator.Resource, name string, p map[string]any) {
	t.Helper()
	if err := c.admin.MergePatch(context.Background(), r, ns, name, "", p, nil); err != nil {
		t.Fatal(err)
	}
}

// TestOperator walks the agent-sandbox API end to end on a real API
// server and a real SPACE server: template, warm pool, warm and cold
// claims with their Secrets, kubectl wait, suspend and resume, refusal of
// what SPACE cannot honour, expiry, deletion, and an operator killed in
// the middle of a burst of claims.
func TestOperator(t *testing.T) {
	c := startCluster(t)
	srv, key := spaceServer(t)
	api := client.New(srv.Ctrl, key)
	op := startOperator(t, c, srv, key, "operator")
	c.create(t, "", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}})
	c.create(t, ns, templateObj("busy"))
	c.create(t, ns, poolObj("pool", "busy", poolSize))
	start := time.Now()
	waitFor(t, 2*time.Minute, "pool ready", func() error {
		var p operator.SandboxWarmPool
		if err := c.getObj(operator.ResWarmPool, ns, "pool", &p); err != nil {
			return err
		}
		if p.Status.ReadyReplicas != poolSize || p.Status.Replicas != poolSize {
			return fmt.Errorf("status %+v", p.Status)
		}
		return nil
	})
	t.Logf("warm pool of %d ready in %v", poolSize, time.Since(start).Round(time.Millisecond))

	t.Run("warm claim", func(t *testing.T) {
		start := time.Now()
		c.create(t, ns, claimObj("c1", "pool", nil))
		cl := waitClaimReady(t, c, "c1", time.Minute)
		t.Logf("warm claim Ready in %v", time.Since(start).Round(time.Millisecond))
		sbName := cl.Status.Sandbox.Name
		if !strings.HasPrefix(sbName, "pool-") {
			t.Fatalf("claim not served from the pool: sandbox %q", sbName)
		}
		// Two writes per warm claim: the adoption and the claim's status;
		// the claim's metadata is not written (no finalizer, no annotation).
		if len(cl.Metadata.Finalizers) != 0 || cl.Metadata.Annotations[operator.AnnotClaimSandbox] != "" {
			t.Fatalf("claim metadata written: %s", mustJSON(cl.Metadata))
		}
		var sb operator.Sandbox
		if err := c.getObj(operator.ResSandbox, ns, sbName, &sb); err != nil {
			t.Fatal(err)
		}
		if sb.Metadata.Labels[operator.LabelWarmPool] != "" || sb.Metadata.Labels[operator.LabelClaimUID] != cl.Metadata.UID ||
			len(sb.Metadata.OwnerReferences) != 1 || sb.Metadata.OwnerReferences[0].Kind != "SandboxClaim" {
			t.Fatalf("adopted sandbox metadata: %s", mustJSON(sb.Metadata))
		}
		s := session(t, c, sbName)
		if got := run(t, s, "echo hello from $FROM_TEMPLATE"); got != "hello from yes" {
			t.Fatalf("command output %q", got)
		}
		ssb, err := api.GetSandbox(context.Background(), s.SandboxID)
		if err != nil || ssb.Limits.CPUMillis != 500 || ssb.Limits.MemoryBytes != 256<<20 || ssb.Metadata["k8s.name"] != ns+"/"+sbName {
			t.Fatalf("SPACE sandbox %+v %v", ssb, err)
		}
		// The pool refills to poolSize unclaimed sandboxes.
		waitFor(t, time.Minute, "pool refilled", func() error {
			var p operator.SandboxWarmPool
			if err := c.getObj(operator.ResWarmPool, ns, "pool", &p); err != nil {
				return err
			}
			if p.Status.ReadyReplicas != poolSize {
				return fmt.Errorf("status %+v", p.Status)
			}
			return nil
		})
		if c.kubectl != "" {
			out, err := c.kubectlRun(t, "-n", ns, "wait", "--for=condition=Ready", "sandboxclaim/c1", "sandbox/"+sbName, "--timeout=30s")
			if err != nil {
				t.Fatalf("kubectl wait: %v: %s", err, out)
			}
			out, err = c.kubectlRun(t, "-n", ns, "get", "sandboxclaims")
			t.Logf("kubectl get sandboxclaims:\n%s", out)
			if err != nil || !strings.Contains(out, sbName) {
				t.Fatalf("kubectl get: %v", err)
			}
		} else {
			t.Log("kubectl not built: kubectl wait not checked")
		}

		t.Run("suspend and resume", func(t *testing.T) {
			patch(t, c, operator.ResSandbox, sbName, map[string]any{"spec": map[string]any{"operatingMode": "Suspended"}})
			waitFor(t, time.Minute, "Suspended", func() error {
				var sb operator.Sandbox
				if err := c.getObj(operator.ResSandbox, ns, sbName, &sb); err != nil {
					return err
				}
				if ok, why := ready(sb.Status.Conditions, operator.CondSuspend); !ok {
					return fmt.Errorf("%s", why)
				}
				return nil
			})
			if ssb, err := api.GetSandbox(context.Background(), s.SandboxID); err != nil || ssb.State != "paused" {
				t.Fatalf("SPACE sandbox after suspend: %s %v", ssb.State, err)
			}
			var cl operator.SandboxClaim
			waitFor(t, 30*time.Second, "claim not Ready while suspended", func() error {
				if err := c.getObj(operator.ResClaim, ns, "c1", &cl); err != nil {
					return err
				}
				if ok, _ := ready(cl.Status.Conditions, operator.CondReady); ok {
					return fmt.Errorf("still Ready")
				}
				return nil
			})
			patch(t, c, operator.ResSandbox, sbName, map[string]any{"spec": map[string]any{"operatingMode": "Running"}})
			waitClaimReady(t, c, "c1", time.Minute)
			if got := run(t, s, "echo back"); got != "back" {
				t.Fatalf("after resume: %q", got)
			}
		})

		t.Run("delete", func(t *testing.T) {
			if err := c.admin.Delete(context.Background(), operator.ResClaim, ns, "c1"); err != nil {
				t.Fatal(err)
			}
			waitFor(t, time.Minute, "claim, sandbox and SPACE sandbox gone", func() error {
				var x map[string]any
				if err := c.getObj(operator.ResClaim, ns, "c1", &x); !operator.IsNotFound(err) {
					return fmt.Errorf("claim still there (%v)", err)
				}
				if err := c.getObj(operator.ResSandbox, ns, sbName, &x); !operator.IsNotFound(err) {
					return fmt.Errorf("sandbox still there (%v)", err)
				}
				if err := c.getObj(operator.ResSecret, ns, sbName, &x); !operator.IsNotFound(err) {
					return fmt.Errorf("secret still there (%v)", err)
				}
				ssb, err := api.GetSandbox(context.Background(), s.SandboxID)
				if err == nil && ssb.State != client.StateDeleted {
					return fmt.Errorf("SPACE sandbox %s", ssb.State)
				}
				return nil
			})
		})
	})

	t.Run("cold claim with env", func(t *testing.T) {
		start := time.Now()
		c.create(t, ns, claimObj("cold", "pool", map[string]string{"GREETING": "hi"}))
		cl := waitClaimReady(t, c, "cold", time.Minute)
		t.Logf("cold claim Ready in %v", time.Since(start).Round(time.Millisecond))
		if cl.Status.Sandbox.Name != "cold" {
			t.Fatalf("a claim with env must start cold, got sandbox %q", cl.Status.Sandbox.Name)
		}
		if got := run(t, session(t, c, "cold"), "echo $GREETING $FROM_TEMPLATE"); got != "hi yes" {
			t.Fatalf("env: %q", got)
		}
	})

	t.Run("refused", func(t *testing.T) {
		sb := map[string]any{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
			"metadata": map[string]any{"name": "two", "namespace": ns},
			"spec": map[string]any{"podTemplate": map[string]any{"spec": map[string]any{"containers": []any{
				map[string]any{"name": "a", "image": "busybox"}, map[string]any{"name": "b", "image": "busybox"}}}}}}
		c.create(t, ns, sb)
		waitFor(t, 30*time.Second, "Unsupported", func() error {
			var got operator.Sandbox
			if err := c.getObj(operator.ResSandbox, ns, "two", &got); err != nil {
				return err
			}
			ok, why := ready(got.Status.Conditions, operator.CondReady)
			if ok || !strings.HasPrefix(why, "Unsupported: ") || !strings.Contains(why, "containers") {
				return fmt.Errorf("condition %q", why)
			}
			return nil
		})
	})

	t.Run("shutdown time", func(t *testing.T) {
		at := time.Now().Add(4 * time.Second).UTC().Format(time.RFC3339)
		sb := map[string]any{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
			"metadata": map[string]any{"name": "short", "namespace": ns,
				"annotations": map[string]string{operator.AnnotSpaceTemplate: "minimal"}},
			"spec": map[string]any{"shutdownTime": at, "shutdownPolicy": "Retain",
				"podTemplate": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "a", "image": "busybox"}}}}}}
		c.create(t, ns, sb)
		waitFor(t, 30*time.Second, "SandboxExpired", func() error {
			var got operator.Sandbox
			if err := c.getObj(operator.ResSandbox, ns, "short", &got); err != nil {
				return err
			}
			if _, why := ready(got.Status.Conditions, operator.CondReady); !strings.HasPrefix(why, "SandboxExpired") {
				return fmt.Errorf("condition %q", why)
			}
			return nil
		})
	})

	// A Sandbox is Ready only with a Secret that holds its SPACE sandbox's
	// session. An operator records the SPACE sandbox on the object before
	// it writes the Secret; killed between the two (CI: a warm-pool
	// Sandbox of the restart below was claimed Ready with no Secret), or
	// with the Secret write failing, the next reconcile must write it.
	t.Run("recorded without its secret", func(t *testing.T) {
		ctx := context.Background()
		res, err := api.CreateSandbox(ctx, client.CreateRequest{Template: "minimal"}, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := api.WaitOperation(ctx, res.Operation.ID); err != nil {
			t.Fatal(err)
		}
		// The object as createSpace's record leaves it, before the Secret.
		c.create(t, ns, map[string]any{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
			"metadata": map[string]any{"name": "nosecret", "namespace": ns, "finalizers": []string{operator.Finalizer},
				"annotations": map[string]string{operator.AnnotSpaceTemplate: "minimal", operator.AnnotSpaceID: res.Sandbox.ID,
					operator.AnnotSpaceDataURL: res.Session.DataURL, operator.AnnotSpaceSecret: "nosecret",
					"space-sandbox.dev/session-expires": res.Session.ExpiresAt.UTC().Format(time.RFC3339)}},
			"spec": map[string]any{"podTemplate": map[string]any{"spec": map[string]any{
				"containers": []any{map[string]any{"name": "a", "image": "busybox"}}}}}})
		waitSandboxReady(t, c, "nosecret")
		if s := session(t, c, "nosecret"); s.SandboxID != res.Sandbox.ID || run(t, s, "echo ok") != "ok" {
			t.Fatalf("secret of nosecret: sandbox %s, want %s", s.SandboxID, res.Sandbox.ID)
		}

		// A Secret of that name the operator cannot overwrite (immutable):
		// its write fails after the record, and the Sandbox must not turn
		// Ready with someone else's session in it.
		c.create(t, ns, map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "stale", "namespace": ns},
			"immutable": true, "stringData": map[string]string{"sandbox_id": "sbx-other", "token": "x", "data_url": "http://127.0.0.1:1"}})
		c.create(t, ns, map[string]any{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
			"metadata": map[string]any{"name": "stale", "namespace": ns,
				"annotations": map[string]string{operator.AnnotSpaceTemplate: "minimal"}},
			"spec": map[string]any{"podTemplate": map[string]any{"spec": map[string]any{
				"containers": []any{map[string]any{"name": "a", "image": "busybox"}}}}}})
		waitFor(t, time.Minute, "stale recorded", func() error {
			var sb operator.Sandbox
			if err := c.getObj(operator.ResSandbox, ns, "stale", &sb); err != nil {
				return err
			}
			if sb.Metadata.Annotations[operator.AnnotSpaceID] == "" {
				return fmt.Errorf("no SPACE sandbox recorded yet")
			}
			return nil
		})
		time.Sleep(3 * time.Second) // several retries of the reconcile
		var sb operator.Sandbox
		if err := c.getObj(operator.ResSandbox, ns, "stale", &sb); err != nil {
			t.Fatal(err)
		}
		if ok, why := ready(sb.Status.Conditions, operator.CondReady); ok {
			t.Fatalf("stale is Ready (%s) while its Secret holds another sandbox's session", why)
		}
		if err := c.admin.Delete(ctx, operator.ResSecret, ns, "stale"); err != nil {
			t.Fatal(err)
		}
		waitSandboxReady(t, c, "stale")
		if s := session(t, c, "stale"); s.SandboxID != sb.Metadata.Annotations[operator.AnnotSpaceID] || run(t, s, "echo ok") != "ok" {
			t.Fatalf("secret of stale: sandbox %s, want %s", s.SandboxID, sb.Metadata.Annotations[operator.AnnotSpaceID])
		}
	})

	t.Run("operator restart mid-burst", func(t *testing.T) {
		const n = burstSize
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- c.tryCreate(ns, claimObj(fmt.Sprintf("burst-%d", i), "pool", nil))
			}()
			if i == n/2 {
				op.kill()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		startOperator(t, c, srv, key, "operator-2")
		if c.kubectl != "" {
			args := []string{"-n", ns, "wait", "--for=condition=Ready", "--timeout=2m"}
			for i := range n {
				args = append(args, fmt.Sprintf("sandboxclaim/burst-%d", i))
			}
			start := time.Now()
			if out, err := c.kubectlRun(t, args...); err != nil {
				t.Fatalf("kubectl wait: %v: %s", err, out)
			}
			t.Logf("kubectl wait: %d claims Ready %v after the restarted operator started", n, time.Since(start).Round(time.Millisecond))
		}
		seen := map[string]string{}
		for i := range n {
			name := fmt.Sprintf("burst-%d", i)
			cl := waitClaimReady(t, c, name, 2*time.Minute)
			sbName := cl.Status.Sandbox.Name
			if other, dup := seen[sbName]; dup {
				t.Fatalf("claims %s and %s share sandbox %s", other, name, sbName)
			}
			seen[sbName] = name
			id := session(t, c, sbName).SandboxID
			if other, dup := seen[id]; dup {
				t.Fatalf("claims %s and %s share SPACE sandbox %s", other, name, id)
			}
			seen[id] = name
		}
		// Every SPACE sandbox the operator made belongs to one Sandbox: the
		// crash left none behind twice. (Once the pool has refilled: its new
		// Sandboxes get theirs a moment after they are created.)
		waitFor(t, time.Minute, "pool refilled", func() error {
			var p operator.SandboxWarmPool
			if err := c.getObj(operator.ResWarmPool, ns, "pool", &p); err != nil {
				return err
			}
			if p.Status.ReadyReplicas != poolSize || p.Status.Replicas != poolSize {
				return fmt.Errorf("status %+v", p.Status)
			}
			return nil
		})
		items, _, err := c.admin.List(context.Background(), operator.ResSandbox, ns)
		if err != nil {
			t.Fatal(err)
		}
		page, err := api.ListSandboxes(context.Background(), client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		live := 0
		for _, s := range page.Sandboxes {
			if s.State != client.StateDeleted && s.State != client.StateDeleting {
				live++
			}
		}
		// "two" never got one and "short" expired (Retain).
		if want := len(items) - 2; live != want {
			t.Fatalf("%d live SPACE sandboxes for %d Sandboxes with one", live, want)
		}
	})
}

// waitSandboxReady waits for a Sandbox's Ready condition.
func waitSandboxReady(t *testing.T, c *cluster, name string) {
	t.Helper()
	waitFor(t, time.Minute, "sandbox "+name+" Ready", func() error {
		var sb operator.Sandbox
		if err := c.getObj(operator.ResSandbox, ns, name, &sb); err != nil {
			return err
		}
		if ok, why := ready(sb.Status.Conditions, operator.CondReady); !ok {
			return fmt.Errorf("%s", why)
		}
		return nil
	})
}
