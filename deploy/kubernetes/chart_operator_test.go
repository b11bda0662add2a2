package kubernetes_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// operatorImage renders the operator's image as deploy/operator has it.
var operatorImage = map[string]any{"repository": "space", "tag": "local", "pullPolicy": "IfNotPresent"}

// operatorChartCases are the chart with `space operator` on, without and
// with its webhook (a CA given, so no cert-manager annotation).
func operatorChartCases() []chartCase {
	return []chartCase{
		{Name: "operator", Values: map[string]any{"image": operatorImage, "operator": map[string]any{"enabled": true}}},
		{Name: "operator-webhook", Values: map[string]any{"image": operatorImage,
			"operator": map[string]any{"enabled": true, "webhook": map[string]any{"enabled": true, "caBundle": "Q0E="}}}},
	}
}

// deployOperator reads the objects of deploy/operator's files.
func deployOperator(t *testing.T, files ...string) []object {
	t.Helper()
	var out []object
	for _, f := range files {
		raw, err := os.ReadFile(filepath.Join("../operator", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, part := range splitDocs(raw) {
			var m map[string]any
			if err := yaml.UnmarshalStrict(part, &m); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if m != nil {
				out = append(out, object{Source: f, Doc: m})
			}
		}
	}
	return out
}

// operatorObjects are the chart's objects from templates/operator*.yaml.
func operatorObjects(objs []object) []object {
	var out []object
	for _, o := range objs {
		if strings.HasPrefix(o.Source, "space/templates/operator") {
			out = append(out, o)
		}
	}
	return out
}

// TestChartOperator: with operator.enabled the chart renders
// deploy/operator's CRDs, RBAC, Deployment and NetworkPolicy (less Helm's
// labels), and with operator.webhook.enabled also webhook.yaml's objects
// and the Deployment's webhook flags, port and certificate; by default it
// renders none of them. Every object decodes strictly into its API type.
func TestChartOperator(t *testing.T) {
	objs, err := renderChart("space", namespace, nil)
	if err != nil {
		t.Fatal(err)
	}
	if op := operatorObjects(objs); len(op) != 0 {
		t.Fatalf("the operator is off by default, yet the chart renders %d of its objects", len(op))
	}
	for _, cc := range operatorChartCases() {
		t.Run(cc.Name, func(t *testing.T) {
			objs, err := renderChart("space", namespace, cc.Values)
			if err != nil {
				t.Fatal(err)
			}
			webhook := strings.HasSuffix(cc.Name, "webhook")
			files := []string{"crds.yaml", "rbac.yaml", "operator.yaml"}
			if webhook {
				files = append(files, "webhook.yaml")
			}
			want := byID(deployOperator(t, files...), func(o object) map[string]any { return normalize(o.Doc).(map[string]any) })
			have := byID(operatorObjects(objs), withoutHelmLabels)
			if webhook {
				// The chart's differences: the CA it was given, and the
				// Deployment's webhook flags, port and certificate volume
				// (checked below, then removed to compare the rest).
				vwc := want["ValidatingWebhookConfiguration/space-operator"]
				delete(lookup(vwc, "metadata").(map[string]any), "annotations")
				lookup(vwc, "webhooks").([]any)[0].(map[string]any)["clientConfig"].(map[string]any)["caBundle"] = "Q0E="
				checkWebhookDeployment(t, have["Deployment/space-operator"])
			}
			for _, id := range sortedKeys(want) {
				h, ok := have[id]
				if !ok {
					t.Errorf("deploy/operator has %s, the chart does not", id)
				} else if !reflect.DeepEqual(h, want[id]) {
					hb, _ := json.MarshalIndent(h, "", " ")
					wb, _ := json.MarshalIndent(want[id], "", " ")
					t.Errorf("%s differs from deploy/operator:\nchart: %s\ndeploy/operator: %s", id, hb, wb)
				}
			}
			for _, id := range sortedKeys(have) {
				if _, ok := want[id]; !ok {
					t.Errorf("the chart renders %s, deploy/operator does not", id)
				}
			}
			for _, o := range operatorObjects(objs) {
				var err error
				switch o.kind() {
				case "ClusterRole":
					err = decodeStrict(o, &rbacv1.ClusterRole{})
				case "ClusterRoleBinding":
					err = decodeStrict(o, &rbacv1.ClusterRoleBinding{})
				case "ValidatingWebhookConfiguration":
					err = decodeStrict(o, &admissionv1.ValidatingWebhookConfiguration{})
				case "Deployment":
					err = decodeStrict(o, &appsv1.Deployment{})
				}
				if err != nil {
					t.Error(err)
				}
			}
			// The namespaced ones as the rest of the chart's (kinds, namespace, labels).
			var namespaced []object
			for _, o := range operatorObjects(objs) {
				if !clusterScoped[o.kind()] && o.kind() != "ValidatingWebhookConfiguration" {
					namespaced = append(namespaced, o)
				}
			}
			decode(t, namespaced, nil)
		})
	}
}

// checkWebhookDeployment checks the webhook's additions to the operator's
// Deployment and takes them out of h, leaving deploy/operator's object.
func checkWebhookDeployment(t *testing.T, h map[string]any) {
	t.Helper()
	if h == nil {
		t.Fatal("no Deployment/space-operator")
	}
	ct := lookup(h, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
	cmd := ct["command"].([]any)
	flags := []any{"--webhook-listen", ":9443", "--webhook-cert-dir", "/etc/space-operator/webhook"}
	if i := slices.Index(cmd, flags[0]); i < 0 || !reflect.DeepEqual(cmd[i:i+4], flags) {
		t.Errorf("operator command %v lacks %v", cmd, flags)
	} else {
		ct["command"] = append(cmd[:i:i], cmd[i+4:]...)
	}
	ports, _ := ct["ports"].([]any)
	if len(ports) != 1 || ports[0].(map[string]any)["containerPort"] != float64(9443) {
		t.Errorf("operator ports %v", ports)
	}
	delete(ct, "ports")
	mounts := ct["volumeMounts"].([]any)
	vols := lookup(h, "spec", "template", "spec", "volumes").([]any)
	if len(mounts) != 2 || len(vols) != 2 || mounts[1].(map[string]any)["mountPath"] != "/etc/space-operator/webhook" ||
		lookup(vols[1].(map[string]any), "secret", "secretName") != "space-operator-webhook" {
		t.Errorf("webhook certificate volume: mounts %v, volumes %v", mounts, vols)
	} else {
		ct["volumeMounts"] = mounts[:1]
		lookup(h, "spec", "template", "spec").(map[string]any)["volumes"] = vols[:1]
	}
}
