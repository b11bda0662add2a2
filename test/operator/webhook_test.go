package operator_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/operator"
)

var resWebhookConfig = operator.Resource{Group: "admissionregistration.k8s.io", Version: "v1", Plural: "validatingwebhookconfigurations"}

// webhookPKI writes a fresh CA's serving certificate for 127.0.0.1
// (dir/tls.crt, dir/tls.key) and returns the CA in PEM.
func webhookPKI(t *testing.T, dir string) []byte {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ca, crt, key := servingPKI(t, "space-operator-webhook-ca", "space-operator-webhook")
	writeFiles(t, dir, map[string][]byte{"tls.crt": crt, "tls.key": key})
	return ca
}

// twoContainers is a Sandbox SPACE cannot honour (a pod with a sidecar).
func twoContainers(name string) map[string]any {
	return map[string]any{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{"podTemplate": map[string]any{"spec": map[string]any{"containers": []any{
			map[string]any{"name": "a", "image": "busybox"}, map[string]any{"name": "b", "image": "busybox"}}}}}}
}

// TestWebhook registers the operator's validating webhook (a TLS server
// in the operator, its certificate from a CA made here) with the real
// kube-apiserver: what SPACE cannot honour is refused at create with the
// field named, the operator's own writes (warm pool, adoption, status,
// finalizers) pass it, and an object stored before the webhook keeps its
// Ready=False Unsupported condition and can still be deleted.
func TestWebhook(t *testing.T) {
	c := startCluster(t)
	srv, key := spaceServer(t)
	certDir := filepath.Join(c.dir, "webhook")
	ca := webhookPKI(t, certDir)
	port := freePort(t)
	startOperator(t, c, srv, key, "operator", "--webhook-listen", fmt.Sprintf("127.0.0.1:%d", port), "--webhook-cert-dir", certDir)
	c.create(t, "", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}})
	c.create(t, ns, twoContainers("before"))

	rule := func(group string, resources ...string) map[string]any {
		return map[string]any{"apiGroups": []string{group}, "apiVersions": []string{"v1beta1"},
			"operations": []string{"CREATE", "UPDATE"}, "resources": resources}
	}
	cfg := map[string]any{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
		"metadata": map[string]any{"name": "space-operator"},
		"webhooks": []any{map[string]any{"name": "validate.space-sandbox.dev", "admissionReviewVersions": []string{"v1"},
			"sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 5,
			"clientConfig": map[string]any{"url": fmt.Sprintf("https://127.0.0.1:%d/validate", port), "caBundle": ca},
			"rules": []any{rule("agents.x-k8s.io", "sandboxes"),
				rule("extensions.agents.x-k8s.io", "sandboxtemplates", "sandboxclaims")}}}}
	if err := c.admin.Create(context.Background(), resWebhookConfig, "", cfg, nil); err != nil {
		t.Fatal(err)
	}
	// The API server picks the configuration up within a moment, and the
	// operator may still be starting (the call fails: connection refused).
	var refusal error
	waitFor(t, time.Minute, "webhook in force", func() error {
		refusal = c.tryCreate(ns, twoContainers("after"))
		if refusal == nil {
			c.admin.Delete(context.Background(), operator.ResSandbox, ns, "after")
			return fmt.Errorf("created")
		}
		if !strings.Contains(refusal.Error(), "denied the request") {
			return refusal
		}
		return nil
	})
	if msg := refusal.Error(); !strings.Contains(msg, "spec.podTemplate.spec.containers") ||
		!strings.Contains(msg, "sidecars are not supported") {
		t.Fatalf("refusal: %v", refusal)
	}
	t.Logf("refused: %v", refusal)
	bad := templateObj("ipnet")
	bad["spec"].(map[string]any)["networkPolicyManagement"] = "Managed"
	bad["spec"].(map[string]any)["networkPolicy"] = map[string]any{"egress": []any{map[string]any{
		"to": []any{map[string]any{"ipBlock": map[string]any{"cidr": "10.0.0.0/8"}}}}}}
	if err := c.tryCreate(ns, bad); err == nil || !strings.Contains(err.Error(), "spec.networkPolicy.egress[0].to[0]") {
		t.Fatalf("template with an IP rule: %v", err)
	}
	vct := claimObj("vct", "pool", nil)
	vct["spec"].(map[string]any)["volumeClaimTemplates"] = []any{map[string]any{"metadata": map[string]any{"name": "data"}}}
	if err := c.tryCreate(ns, vct); err == nil || !strings.Contains(err.Error(), "spec.volumeClaimTemplates") {
		t.Fatalf("claim with volumeClaimTemplates: %v", err)
	}

	// What SPACE honours passes, and so do the operator's own writes.
	c.create(t, ns, templateObj("busy"))
	c.create(t, ns, poolObj("pool", "busy", 1))
	c.create(t, ns, claimObj("ok", "pool", nil))
	cl := waitClaimReady(t, c, "ok", 2*time.Minute)
	if got := run(t, session(t, c, cl.Status.Sandbox.Name), "echo through the webhook"); got != "through the webhook" {
		t.Fatalf("output %q", got)
	}

	// Stored before the webhook: the condition still says why.
	waitFor(t, 30*time.Second, "Unsupported condition on the object from before", func() error {
		var got operator.Sandbox
		if err := c.getObj(operator.ResSandbox, ns, "before", &got); err != nil {
			return err
		}
		if ok, why := ready(got.Status.Conditions, operator.CondReady); ok || !strings.HasPrefix(why, "Unsupported: ") {
			return fmt.Errorf("condition %q", why)
		}
		return nil
	})
	if err := c.admin.Delete(context.Background(), operator.ResSandbox, ns, "before"); err != nil {
		t.Fatal(err)
	}
	if err := c.admin.Delete(context.Background(), operator.ResClaim, ns, "ok"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "objects gone", func() error {
		var x map[string]any
		for _, o := range []struct {
			r    operator.Resource
			name string
		}{{operator.ResSandbox, "before"}, {operator.ResClaim, "ok"}, {operator.ResSandbox, cl.Status.Sandbox.Name}} {
			if err := c.getObj(o.r, ns, o.name, &x); !operator.IsNotFound(err) {
				return fmt.Errorf("%s %s still there (%v)", o.r.Plural, o.name, err)
			}
		}
		return nil
	})
}
