package kubernetes_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// chartCase is one way to install the chart: its values, and the
// kustomization that must render the same objects.
type chartCase struct {
	Name   string
	Values map[string]any
	// Kustomize is the layout the chart must equal; Omit the objects of it
	// the chart leaves out with these values.
	Kustomize string
	Omit      []string
}

// kindSecrets are the chart values that render the kind overlays' Secrets.
func kindSecrets(t *testing.T, dir string) map[string]any {
	t.Helper()
	c := load(t, dir)
	s := map[string]any{"create": true, "dbPassword": c.Secrets["space-db"].StringData["password"]}
	if dir == "local" {
		// The DSN names the Service's fixed address, not its name.
		s["dsn"] = c.Secrets["space-db"].StringData["dsn"]
	}
	if dir == "kind" || dir == "local" {
		s["clusterSecret"] = c.Secrets[clusterSecret].StringData["secret"]
		s["clusterCA"] = map[string]any{"crt": c.Secrets["space-cluster-ca"].StringData["ca.crt"], "key": c.Secrets["space-cluster-ca"].StringData["ca.key"]}
		s["snapshotStore"] = c.Secrets["space-snapshots"].StringData["store"]
		s["credentialKeys"] = c.Secrets["space-credential-keys"].StringData["keys"]
	}
	return s
}

// localValues install the chart on the cluster of scripts/k8s.sh, as
// deploy/kubernetes/local-single does (and test/k8s installs it).
var localValues = map[string]any{
	"image":        map[string]any{"tag": "local", "pullPolicy": "Never"},
	"store":        map[string]any{"sqlite": true},
	"builtins":     "minimal",
	"dataDir":      "/var/lib/space-k8s/space-data",
	"runDir":       "/var/lib/space-k8s/space-run",
	"cgroupParent": "/space-k8s/space-sandboxes",
	"postgres":     map[string]any{"enabled": false},
	"node":         map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": "100m", "memory": "256Mi"}}},
}

// localSplitValues install the split layout on the cluster of
// scripts/k8s.sh, as deploy/kubernetes/local does (docs/install-kubernetes.md).
func localSplitValues(t *testing.T) map[string]any {
	t.Helper()
	small := func(cpu, mem string) map[string]any {
		return map[string]any{"requests": map[string]any{"cpu": cpu, "memory": mem}}
	}
	return map[string]any{
		"layout":       "split",
		"image":        map[string]any{"tag": "local", "pullPolicy": "Never"},
		"builtins":     "minimal",
		"dataDir":      "/var/lib/space-k8s/space-data",
		"runDir":       "/var/lib/space-k8s/space-run",
		"cgroupParent": "/space-k8s/space-sandboxes",
		"dataURL":      "http://$(POD_IP):7071",
		"postgres":     map[string]any{"image": "space-postgres:local", "serviceClusterIP": "10.97.0.54", "resources": small("50m", "64Mi")},
		"server":       map[string]any{"resources": small("50m", "64Mi")},
		"node":         map[string]any{"resources": small("100m", "256Mi")},
		"secrets":      kindSecrets(t, "local"),
	}
}

func chartCases(t *testing.T) []chartCase {
	t.Helper()
	pg := []string{"StatefulSet/space-postgres", "Service/space-postgres", "ServiceAccount/space-postgres", "NetworkPolicy/space-postgres"}
	return []chartCase{
		{Name: "single", Values: map[string]any{"layout": "single"}, Kustomize: "single"},
		{Name: "split", Values: map[string]any{"layout": "split"}, Kustomize: "base"},
		{Name: "kind", Kustomize: "kind", Values: map[string]any{
			"layout": "split", "image": map[string]any{"tag": "dev"}, "dataURL": "http://127.0.0.1:7071", "secrets": kindSecrets(t, "kind")}},
		{Name: "kind-single", Kustomize: "kind-single", Values: map[string]any{
			"image": map[string]any{"tag": "dev"}, "dataURL": "http://127.0.0.1:7071", "secrets": kindSecrets(t, "kind-single")}},
		// local-single scales the StatefulSet to 0; the chart renders none.
		{Name: "local", Kustomize: "local-single", Values: localValues, Omit: pg},
		// The split layout there; the PersistentVolume is the cluster's,
		// not the chart's (docs/install-kubernetes.md creates it).
		{Name: "local-split", Kustomize: "local", Values: localSplitValues(t), Omit: []string{"PersistentVolume/space-postgres-local"}},
	}
}

// TestChartMatchesKustomize: the Helm chart renders the same objects as
// the kustomize layouts (less their Namespace, which the chart leaves to
// the user, and Helm's own labels), each decoded strictly into the
// current API types and checked as the layouts are.
func TestChartMatchesKustomize(t *testing.T) {
	for _, cc := range chartCases(t) {
		t.Run(cc.Name, func(t *testing.T) {
			objs, err := renderChart("space", namespace, cc.Values)
			if err != nil {
				t.Fatal(err)
			}
			var plain []object
			for _, o := range objs {
				if !isHook(o) {
					plain = append(plain, o)
				}
			}
			r, err := render(cc.Kustomize)
			if err != nil {
				t.Fatal(err)
			}
			want := byID(r.Objects, func(o object) map[string]any { return normalize(o.Doc).(map[string]any) })
			delete(want, "Namespace/"+namespace)
			for _, id := range cc.Omit {
				delete(want, id)
			}
			have := byID(plain, withoutHelmLabels)
			for _, id := range sortedKeys(want) {
				h, ok := have[id]
				if !ok {
					t.Errorf("kustomize %s renders %s, the chart does not", cc.Kustomize, id)
				} else if !reflect.DeepEqual(h, want[id]) {
					hb, _ := json.MarshalIndent(h, "", " ")
					wb, _ := json.MarshalIndent(want[id], "", " ")
					t.Errorf("%s differs from kustomize %s:\nchart: %s\nkustomize: %s", id, cc.Kustomize, hb, wb)
				}
			}
			for _, id := range sortedKeys(have) {
				if _, ok := want[id]; !ok {
					t.Errorf("the chart renders %s, kustomize %s does not", id, cc.Kustomize)
				}
			}
			// Strictly decoded into the v0.37 types, namespaced and labelled.
			c := decode(t, plain, nil)
			for _, o := range plain {
				ls, _ := lookup(o.Doc, "metadata", "labels").(map[string]any)
				if ls["app.kubernetes.io/managed-by"] != "Helm" || ls["app.kubernetes.io/instance"] != "space" {
					t.Errorf("%s: no Helm labels %v", o.id(), ls)
				}
			}
			if cc.Kustomize == "single" || cc.Kustomize == "base" {
				priv, ext := privilegedOf(cc.Kustomize)
				checkCommon(t, c, priv, ext...)
			}
			checkChartTest(t, c, objs)
		})
	}
}

// checkChartTest: `helm test` runs a pod that reaches the control API
// through the Service, let out by a policy of its own.
func checkChartTest(t *testing.T, c *cluster, objs []object) {
	t.Helper()
	var pod *corev1.Pod
	var pol *networkingv1.NetworkPolicy
	for _, o := range objs {
		if !isHook(o) {
			continue
		}
		an := lookup(o.Doc, "metadata", "annotations").(map[string]any)
		if an["helm.sh/hook"] != "test" {
			t.Errorf("%s: hook %v, want test", o.id(), an["helm.sh/hook"])
		}
		switch o.kind() {
		case "Pod":
			pod = &corev1.Pod{}
			if err := decodeStrict(o, pod); err != nil {
				t.Fatal(err)
			}
		case "NetworkPolicy":
			pol = &networkingv1.NetworkPolicy{}
			if err := decodeStrict(o, pol); err != nil {
				t.Fatal(err)
			}
		default:
			t.Errorf("%s: unexpected hook", o.id())
		}
	}
	if pod == nil || pol == nil {
		t.Fatal("no helm test pod and its NetworkPolicy")
	}
	srv, ok := c.workload(serverName)
	if !ok {
		t.Fatal("no space-server")
	}
	w := workload{Kind: "Pod", Name: pod.Name, Template: corev1.PodTemplateSpec{ObjectMeta: pod.ObjectMeta, Spec: pod.Spec}}
	c.Policies = append(c.Policies, *pol)
	defer func() { c.Policies = c.Policies[:len(c.Policies)-1] }()
	if !c.allowsEgress(w, srv, 7070) || !c.allowsIngressFrom(srv, w, 7070) {
		t.Error("the NetworkPolicies do not let the helm test pod reach the control API")
	}
	if pol.Namespace != namespace || pod.Namespace != namespace {
		t.Errorf("the helm test objects are in %q/%q, want %q", pod.Namespace, pol.Namespace, namespace)
	}
	ct := pod.Spec.Containers[0]
	if img := srv.Template.Spec.Containers[0].Image; ct.Image != img {
		t.Errorf("the helm test pod runs %s, want the server's image %s (no other image is needed)", ct.Image, img)
	}
	// The Service's variables the kubelet sets: its name and port name.
	script := strings.Join(ct.Command, " ")
	var svc *corev1.Service
	for i := range c.Services {
		if c.Services[i].Name == "space" {
			svc = &c.Services[i]
		}
	}
	if svc == nil || !strings.Contains(script, "http://$(SPACE_SERVICE_HOST):$(SPACE_SERVICE_PORT_CONTROL)") ||
		svc.Spec.Ports[0].Name != "control" || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(srv.Template.Labels)) {
		t.Errorf("the helm test pod's command %q does not ask the Service space's control port", script)
	}
	if pod.Spec.EnableServiceLinks != nil && !*pod.Spec.EnableServiceLinks {
		t.Error("the helm test pod needs the Service's environment variables")
	}
	if sc := ct.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || pod.Spec.SecurityContext == nil ||
		pod.Spec.SecurityContext.RunAsNonRoot == nil || !*pod.Spec.SecurityContext.RunAsNonRoot {
		t.Error("the helm test pod must be unprivileged, non-root, with a read-only root filesystem")
	}
}

// TestChartRefuses: values that cannot work fail to render, with the
// reason, instead of installing something else.
func TestChartRefuses(t *testing.T) {
	for name, vals := range chartRefusals {
		if _, err := renderChart("space", namespace, vals); err == nil {
			t.Errorf("%s: rendered", name)
		}
	}
}

var chartRefusals = map[string]map[string]any{
	"unknown layout":          {"layout": "nodes"},
	"split with sqlite":       {"layout": "split", "store": map[string]any{"sqlite": true}},
	"no database password":    {"secrets": map[string]any{"create": true}},
	"external db without dsn": {"secrets": map[string]any{"create": true}, "postgres": map[string]any{"enabled": false}},
	"split without secret":    {"layout": "split", "secrets": map[string]any{"create": true, "dbPassword": "x"}},
}

// TestChartFilesAreUsed: every template renders something in some case,
// and the chart has its README.
func TestChartFilesAreUsed(t *testing.T) {
	used := map[string]bool{}
	for _, cc := range append(chartCases(t), operatorChartCases()...) {
		objs, err := renderChart("space", namespace, cc.Values)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			used[o.Source] = true
		}
	}
	err := filepath.WalkDir(filepath.Join(chartDir, "templates"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), "_") {
			return err
		}
		if name := "space/" + strings.TrimPrefix(filepath.ToSlash(p), chartDir+"/"); !used[name] {
			t.Errorf("%s renders nothing in any case of chartCases", name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(chartDir, "README.md")); err != nil {
		t.Error(err)
	}
}

// helmBin is the helm scripts/k8s.sh builds (scripts/k8s.sh helm), or one
// on PATH.
func helmBin() string {
	if m, _ := filepath.Glob("/var/cache/space/k8s/helm/*/bin/helm"); len(m) > 0 {
		return m[len(m)-1]
	}
	p, _ := exec.LookPath("helm")
	return p
}

// TestChartMatchesHelm: `helm lint --strict` passes for every case and
// `helm template` renders what the offline renderer does; the refusals
// fail in helm too. Needs a helm binary (scripts/k8s.sh helm builds one).
func TestChartMatchesHelm(t *testing.T) {
	helm := helmBin()
	if helm == "" {
		if os.Getenv("SPACE_TEST_K8S") == "1" {
			t.Fatal("SPACE_TEST_K8S=1 but no helm (scripts/k8s.sh helm)")
		}
		t.Skip("no helm binary (scripts/k8s.sh helm builds one from the Go module proxy)")
	}
	run := func(vals map[string]any, args ...string) ([]byte, error) {
		f := filepath.Join(t.TempDir(), "values.yaml")
		b, err := yaml.Marshal(vals)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		return exec.CommandContext(ctx, helm, append(args, "-f", f)...).CombinedOutput()
	}
	for _, cc := range append(chartCases(t), operatorChartCases()...) {
		t.Run(cc.Name, func(t *testing.T) {
			if out, err := run(cc.Values, "lint", "--strict", "--namespace", namespace, chartDir); err != nil {
				t.Errorf("helm lint --strict: %v\n%s", err, out)
			}
			out, err := run(cc.Values, "template", "space", chartDir, "--namespace", namespace)
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			var fromHelm []object
			for _, part := range splitDocs(out) {
				var m map[string]any
				if err := yaml.Unmarshal(part, &m); err != nil {
					t.Fatal(err)
				}
				if m != nil {
					fromHelm = append(fromHelm, object{Doc: m})
				}
			}
			objs, err := renderChart("space", namespace, cc.Values)
			if err != nil {
				t.Fatal(err)
			}
			norm := func(o object) map[string]any { return normalize(o.Doc).(map[string]any) }
			want, have := byID(fromHelm, norm), byID(objs, norm)
			if len(fromHelm) != len(want) {
				t.Errorf("helm template renders %d objects, %d distinct", len(fromHelm), len(want))
			}
			for _, id := range sortedKeys(want) {
				if h, ok := have[id]; !ok {
					t.Errorf("helm renders %s, the offline renderer does not", id)
				} else if !reflect.DeepEqual(h, want[id]) {
					hb, _ := json.MarshalIndent(h, "", " ")
					wb, _ := json.MarshalIndent(want[id], "", " ")
					t.Errorf("%s differs:\noffline: %s\nhelm: %s", id, hb, wb)
				}
			}
			for _, id := range sortedKeys(have) {
				if _, ok := want[id]; !ok {
					t.Errorf("the offline renderer has %s, helm does not", id)
				}
			}
		})
	}
	for name, vals := range chartRefusals {
		if out, err := run(vals, "template", "space", chartDir, "--namespace", namespace); err == nil {
			t.Errorf("%s: helm template rendered it:\n%s", name, out[:min(len(out), 400)])
		}
	}
}

// helmCommand matches the helm install commands of the docs.
var helmCommand = regexp.MustCompile(`(?:helm|\$HELM) install space deploy/helm/space ([^\n]*)`)

// docHelmInstalls returns the values of every `helm install` the file
// shows, from its --set and --set-file flags (shell substitutions and
// file contents become placeholders).
func docHelmInstalls(t *testing.T, path string) []map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(raw), "\\\n", " ")
	var out []map[string]any
	for _, m := range helmCommand.FindAllStringSubmatch(text, -1) {
		vals := map[string]any{}
		f := strings.Fields(m[1])
		for i := 0; i < len(f); i++ {
			if f[i] != "--set" && f[i] != "--set-file" {
				continue
			}
			if i+1 >= len(f) {
				t.Fatalf("%s: %s without a value", path, f[i])
			}
			k, v, ok := strings.Cut(f[i+1], "=")
			if !ok {
				t.Fatalf("%s: %s %s: no key=value", path, f[i], f[i+1])
			}
			var val any = strings.Trim(v, `'"`)
			switch {
			case f[i] == "--set-file" || strings.HasPrefix(v, `"$(`):
				// A secret from a command or a file: long enough for any.
				val = strings.Repeat("x", 64)
			case v == "true" || v == "false":
				val = v == "true"
			}
			setPath(vals, strings.Split(k, "."), val)
			i++
		}
		out = append(out, vals)
	}
	return out
}

func setPath(m map[string]any, path []string, v any) {
	for _, p := range path[:len(path)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[path[len(path)-1]] = v
}

// checkKnown reports --set keys that values.yaml does not have (helm would
// take them silently).
func checkKnown(t *testing.T, where string, vals, known map[string]any, prefix string) {
	t.Helper()
	for k, v := range vals {
		kv, ok := known[k]
		if !ok {
			t.Errorf("%s: --set %s%s: values.yaml has no such value", where, prefix, k)
			continue
		}
		if sub, ok := v.(map[string]any); ok {
			ksub, _ := kv.(map[string]any)
			checkKnown(t, where, sub, ksub, prefix+k+".")
		}
	}
}

// TestChartDocs: the helm install commands of docs/install-kubernetes.md
// and the chart's README set only values the chart has and render; the
// one for the cluster of scripts/k8s.sh sets what test/k8s installs.
func TestChartDocs(t *testing.T) {
	known, err := chartValues(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{"../../docs/install-kubernetes.md", chartDir + "/README.md"} {
		installs := docHelmInstalls(t, doc)
		if len(installs) == 0 {
			t.Errorf("%s: no helm install command", doc)
		}
		for _, vals := range installs {
			checkKnown(t, doc, vals, known, "")
			if _, err := renderChart("space", namespace, vals); err != nil {
				t.Errorf("%s: helm install %v does not render: %v", doc, vals, err)
			}
		}
		if strings.HasSuffix(doc, "install-kubernetes.md") {
			// The split layout's Secrets come from the overlay's file.
			split := localSplitValues(t)
			delete(split, "secrets")
			if len(installs) != 2 || !reflect.DeepEqual(normalize(installs[0]), normalize(localValues)) ||
				!reflect.DeepEqual(normalize(installs[1]), normalize(split)) {
				t.Errorf("%s: the helm installs shown set %v, test/k8s installs %v and %v", doc, installs, localValues, split)
			}
		}
	}
}
