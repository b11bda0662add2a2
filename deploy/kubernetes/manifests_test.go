package kubernetes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const (
	namespace  = "space"
	serverName = "space-server"
	nodeName   = "space-node"
	// nodeLabel is the label of hosts that run sandboxes (space node, or
	// the single-process space server).
	nodeLabel = "space-sandbox.dev/node"
	// clusterSecret is the Secret holding the cluster secret (key secret).
	clusterSecret = "space-cluster"
)

// variants are the kustomizations a user applies, with the Secrets each
// leaves to the user and the workloads that must be privileged.
var variants = []struct {
	Dir        string
	External   []string
	Privileged []string
}{
	{"base", []string{"space-db", clusterSecret, "space-cluster-ca", "space-snapshots"}, []string{nodeName}},
	{"single", []string{"space-db"}, []string{serverName}},
	{"kind", nil, []string{nodeName}},
	{"kind-single", nil, []string{serverName}},
	{"local-single", nil, []string{serverName}},
	{"local", nil, []string{nodeName}},
}

// dirs are every kustomization, common included.
var dirs = []string{"common", "base", "single", "kind", "kind-single", "local-single", "local"}

// workload is a DaemonSet, StatefulSet or Deployment.
type workload struct {
	Kind, Name  string
	Selector    *metav1.LabelSelector
	Template    corev1.PodTemplateSpec
	Claims      []string // volumeClaimTemplates
	ServiceName string   // StatefulSet: its governing Service
	Replicas    *int32   // Deployment, StatefulSet
}

// cluster is a rendered kustomization, decoded into API types.
type cluster struct {
	Namespaces []corev1.Namespace
	Accounts   map[string]corev1.ServiceAccount
	Secrets    map[string]corev1.Secret
	ConfigMaps map[string]corev1.ConfigMap
	Services   []corev1.Service
	Workloads  []workload
	Policies   []networkingv1.NetworkPolicy
	// Volumes are PersistentVolumes an overlay brings where its cluster
	// has no provisioner (local).
	Volumes []corev1.PersistentVolume
	Used    map[string]bool
}

func (c *cluster) workload(name string) (workload, bool) {
	for _, w := range c.Workloads {
		if w.Name == name {
			return w, true
		}
	}
	return workload{}, false
}

// load renders dir and decodes every object strictly by its kind.
func load(t *testing.T, dir string) *cluster {
	t.Helper()
	r, err := render(dir)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, r.Objects, r.Used)
}

// decode decodes rendered objects strictly by their kind (the kustomize
// layouts' or the Helm chart's).
func decode(t *testing.T, objs []object, used map[string]bool) *cluster {
	t.Helper()
	c := &cluster{Accounts: map[string]corev1.ServiceAccount{}, Secrets: map[string]corev1.Secret{}, ConfigMaps: map[string]corev1.ConfigMap{}, Used: used}
	seen := map[string]bool{}
	for _, o := range objs {
		if seen[o.id()] {
			t.Errorf("%s defined twice", o.id())
		}
		seen[o.id()] = true
		var meta metav1.ObjectMeta
		var err error
		switch gvk := o.apiVersion() + " " + o.kind(); gvk {
		case "v1 Namespace":
			var x corev1.Namespace
			err = decodeStrict(o, &x)
			meta = x.ObjectMeta
			c.Namespaces = append(c.Namespaces, x)
		case "v1 ServiceAccount":
			var x corev1.ServiceAccount
			err = decodeStrict(o, &x)
			meta = x.ObjectMeta
			c.Accounts[x.Name] = x
		case "v1 Secret":
			var x corev1.Secret
			err = decodeStrict(o, &x)
			meta = x.ObjectMeta
			c.Secrets[x.Name] = x
		case "v1 ConfigMap":
			var x corev1.ConfigMap
			err = decodeStrict(o, &x)
			meta = x.ObjectMeta
			c.ConfigMaps[x.Name] = x
		case "v1 Service":
			var x corev1.Service
			err = decodeStrict(o, &x)
			meta = x.ObjectMeta
			c.Services = append(c.Services, x)
		case "apps/v1 DaemonSet":
			var x appsv1.DaemonSet
			err = decodeStrict(o, &x)
			meta = x.ObjectMeta
			c.Workloads = append(c.Workloads, workload{Kind: "DaemonSet", Name: x.Name, Selector: x.Spec.Selector, Template: x.Spec.Template})
		case "apps/v1 StatefulSet":
			var x appsv1.StatefulSet
			err = decodeStrict(o, &x)
			meta = x.ObjectMeta
			w := workload{Kind: "StatefulSet", Name: x.Name, Selector: x.Spec.Selector, Template: x.Spec.Template, ServiceName: x.Spec.ServiceName, Replicas: x.Spec.Replicas}
			for _, vc := range x.Spec.VolumeClaimTemplates {
				w.Claims = append(w.Claims, vc.Name)
			}
			c.Workloads = append(c.Workloads, w)
		case "apps/v1 Deployment":
			var x appsv1.Deployment
			err = decodeStrict(o, &x)
			meta = x.ObjectMeta
			c.Workloads = append(c.Workloads, workload{Kind: "Deployment", Name: x.Name, Selector: x.Spec.Selector, Template: x.Spec.Template, Replicas: x.Spec.Replicas})
		case "v1 PersistentVolume":
			var x corev1.PersistentVolume
			err = decodeStrict(o, &x)
			meta = x.ObjectMeta
			c.Volumes = append(c.Volumes, x)
		case "networking.k8s.io/v1 NetworkPolicy":
			var x networkingv1.NetworkPolicy
			err = decodeStrict(o, &x)
			meta = x.ObjectMeta
			c.Policies = append(c.Policies, x)
		default:
			// RBAC included: nothing here calls the Kubernetes API, so no
			// Role or binding may appear without a test that says why.
			t.Errorf("%s (%s): unexpected kind %q", o.id(), o.Source, gvk)
			continue
		}
		if err != nil {
			t.Error(err)
			continue
		}
		if o.kind() != "Namespace" && o.kind() != "PersistentVolume" && meta.Namespace != namespace {
			t.Errorf("%s: namespace %q, want %q", o.id(), meta.Namespace, namespace)
		}
		if meta.Labels["app.kubernetes.io/part-of"] != "space" {
			t.Errorf("%s: no app.kubernetes.io/part-of label", o.id())
		}
	}
	return c
}

// checkCommon asserts what must hold for every rendering. privileged names
// the workloads that may (and must) be privileged; external names the
// Secrets the user creates outside the kustomization.
func checkCommon(t *testing.T, c *cluster, privileged []string, external ...string) {
	t.Helper()
	if len(c.Workloads) == 0 {
		t.Fatal("no workloads")
	}
	for _, w := range c.Workloads {
		checkWorkload(t, c, w, slices.Contains(privileged, w.Name), external)
	}
	for _, name := range privileged {
		w, ok := c.workload(name)
		if !ok {
			t.Errorf("no workload %s", name)
			continue
		}
		for _, ct := range w.Template.Spec.Containers {
			if sc := ct.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
				t.Errorf("%s container %s: must be privileged (namespaces, cgroups, overlay mounts per sandbox)", name, ct.Name)
			}
		}
	}
	checkServices(t, c)
	checkPolicies(t, c)
}

func checkWorkload(t *testing.T, c *cluster, w workload, privileged bool, external []string) {
	t.Helper()
	id := w.Kind + "/" + w.Name
	sel, err := metav1.LabelSelectorAsSelector(w.Selector)
	if err != nil || w.Selector == nil || sel.Empty() {
		t.Errorf("%s: selector %v: %v", id, w.Selector, err)
	} else if !sel.Matches(labels.Set(w.Template.Labels)) {
		t.Errorf("%s: selector %v does not match the pod labels %v", id, sel, w.Template.Labels)
	}
	if w.ServiceName != "" && !slices.ContainsFunc(c.Services, func(s corev1.Service) bool { return s.Name == w.ServiceName }) {
		t.Errorf("%s: serviceName %q is no Service", id, w.ServiceName)
	}
	ps := w.Template.Spec
	sa, ok := c.Accounts[ps.ServiceAccountName]
	if !ok {
		t.Errorf("%s: serviceAccountName %q is no ServiceAccount here", id, ps.ServiceAccountName)
	} else if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("%s: ServiceAccount %s must not mount a token", id, sa.Name)
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Errorf("%s: the pod must not mount a service-account token", id)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range ps.Volumes {
		volumes[v.Name] = v
		checkVolumeRefs(t, c, id+" volume "+v.Name, v, external)
		if v.HostPath != nil && strings.HasPrefix(v.HostPath.Path, "/dev/") &&
			(v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathCharDev) {
			t.Errorf("%s: host device %s must be a hostPath of type CharDevice", id, v.HostPath.Path)
		}
	}
	if len(ps.Containers) == 0 {
		t.Errorf("%s: no containers", id)
	}
	for _, ct := range ps.Containers {
		cid := id + " container " + ct.Name
		for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, okr := ct.Resources.Requests[res]
			lim, okl := ct.Resources.Limits[res]
			if !okr || !okl {
				t.Errorf("%s: %s needs a request and a limit", cid, res)
			} else if req.Cmp(lim) > 0 {
				t.Errorf("%s: %s request %s above its limit %s", cid, res, req.String(), lim.String())
			}
		}
		if ct.ReadinessProbe == nil || ct.LivenessProbe == nil {
			t.Errorf("%s: needs readiness and liveness probes", cid)
		}
		for _, p := range []*corev1.Probe{ct.StartupProbe, ct.ReadinessProbe, ct.LivenessProbe} {
			if p != nil && p.HTTPGet != nil && !hasPort(ct, p.HTTPGet.Port) {
				t.Errorf("%s: probe port %s is not a container port", cid, p.HTTPGet.Port.String())
			}
		}
		if ct.Image == "" || strings.HasSuffix(ct.Image, ":latest") || !strings.Contains(ct.Image, ":") {
			t.Errorf("%s: image %q needs a fixed tag", cid, ct.Image)
		}
		if ct.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("%s: imagePullPolicy %q, want IfNotPresent (kind loads images; no pulls needed)", cid, ct.ImagePullPolicy)
		}
		for _, m := range ct.VolumeMounts {
			if _, ok := volumes[m.Name]; !ok && !slices.Contains(w.Claims, m.Name) {
				t.Errorf("%s: mount %q names no volume", cid, m.Name)
			}
		}
		// $(VAR) in env values may name earlier entries; in args, any entry.
		defined := map[string]bool{}
		for _, e := range ct.Env {
			for _, ref := range varRefs(e.Value) {
				if !defined[ref] {
					t.Errorf("%s: env %s uses $(%s), which no earlier env entry defines", cid, e.Name, ref)
				}
			}
			defined[e.Name] = true
			if vf := e.ValueFrom; vf != nil && vf.SecretKeyRef != nil {
				ref := vf.SecretKeyRef
				checkRef(t, c, cid+" env "+e.Name, "Secret", ref.Name, []string{ref.Key}, ref.Optional, external)
			} else if vf != nil && vf.ConfigMapKeyRef != nil {
				ref := vf.ConfigMapKeyRef
				checkRef(t, c, cid+" env "+e.Name, "ConfigMap", ref.Name, []string{ref.Key}, ref.Optional, external)
			}
		}
		for _, ef := range ct.EnvFrom {
			if ef.SecretRef != nil {
				checkRef(t, c, cid+" envFrom", "Secret", ef.SecretRef.Name, nil, ef.SecretRef.Optional, external)
			}
			if ef.ConfigMapRef != nil {
				checkRef(t, c, cid+" envFrom", "ConfigMap", ef.ConfigMapRef.Name, nil, ef.ConfigMapRef.Optional, external)
			}
		}
		for _, a := range append(slices.Clone(ct.Command), ct.Args...) {
			for _, ref := range varRefs(a) {
				if !defined[ref] {
					t.Errorf("%s: argument %q uses $(%s), which the env does not define", cid, a, ref)
				}
			}
		}
		sc := ct.SecurityContext
		if !privileged {
			// Only what runs sandboxes is privileged.
			if sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
				t.Errorf("%s: must be unprivileged: no escalation, all capabilities dropped", cid)
			}
			if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("%s: an unprivileged container must have a read-only root filesystem", cid)
			}
			if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot {
				t.Errorf("%s: must run as non-root", id)
			}
			if ps.HostPID || ps.HostNetwork || ps.HostIPC || len(hostPaths(ps)) > 0 {
				t.Errorf("%s: must not use the host's namespaces or paths", id)
			}
		}
	}
}

// checkRef asserts that a Secret or ConfigMap a workload names is rendered
// (with the keys it needs, unless optional) or documented as the user's.
func checkRef(t *testing.T, c *cluster, where, kind, name string, keys []string, optional *bool, external []string) {
	t.Helper()
	opt := optional != nil && *optional
	var have map[string]bool
	switch kind {
	case "Secret":
		if s, ok := c.Secrets[name]; ok {
			have = map[string]bool{}
			for k := range s.StringData {
				have[k] = true
			}
			for k := range s.Data {
				have[k] = true
			}
		}
	case "ConfigMap":
		if m, ok := c.ConfigMaps[name]; ok {
			have = map[string]bool{}
			for k := range m.Data {
				have[k] = true
			}
			for k := range m.BinaryData {
				have[k] = true
			}
		}
	}
	if have == nil {
		if !opt && !slices.Contains(external, name) {
			t.Errorf("%s: %s %q is neither rendered nor documented as created by the user", where, kind, name)
		}
		return
	}
	for _, k := range keys {
		if !have[k] && !opt {
			t.Errorf("%s: %s %s has no key %q", where, kind, name, k)
		}
	}
}

// checkVolumeRefs checks the Secrets and ConfigMaps a volume names.
func checkVolumeRefs(t *testing.T, c *cluster, where string, v corev1.Volume, external []string) {
	t.Helper()
	keys := func(items []corev1.KeyToPath) []string {
		var out []string
		for _, it := range items {
			out = append(out, it.Key)
		}
		return out
	}
	if s := v.Secret; s != nil {
		checkRef(t, c, where, "Secret", s.SecretName, keys(s.Items), s.Optional, external)
	}
	if m := v.ConfigMap; m != nil {
		checkRef(t, c, where, "ConfigMap", m.Name, keys(m.Items), m.Optional, external)
	}
	if p := v.Projected; p != nil {
		for _, src := range p.Sources {
			if s := src.Secret; s != nil {
				checkRef(t, c, where, "Secret", s.Name, keys(s.Items), s.Optional, external)
			}
			if m := src.ConfigMap; m != nil {
				checkRef(t, c, where, "ConfigMap", m.Name, keys(m.Items), m.Optional, external)
			}
		}
	}
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func varRefs(s string) []string {
	var out []string
	for _, m := range varRef.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

func hostPaths(ps corev1.PodSpec) map[string]corev1.Volume {
	out := map[string]corev1.Volume{}
	for _, v := range ps.Volumes {
		if v.HostPath != nil {
			out[v.Name] = v
		}
	}
	return out
}

// hasPort reports whether p (a number or a name) is one of ct's ports.
func hasPort(ct corev1.Container, p intstr.IntOrString) bool {
	for _, cp := range ct.Ports {
		if (p.Type == intstr.String && p.StrVal == cp.Name) || (p.Type == intstr.Int && p.IntVal == cp.ContainerPort) {
			return true
		}
	}
	return false
}

// podsOf returns the workloads whose pods sel selects.
func (c *cluster) podsOf(sel labels.Selector) []workload {
	var out []workload
	for _, w := range c.Workloads {
		if sel.Matches(labels.Set(w.Template.Labels)) {
			out = append(out, w)
		}
	}
	return out
}

// containerPort resolves a Service targetPort against a workload's pods.
func containerPort(w workload, target intstr.IntOrString) (corev1.ContainerPort, bool) {
	for _, ct := range w.Template.Spec.Containers {
		for _, cp := range ct.Ports {
			if (target.Type == intstr.String && target.StrVal == cp.Name) || (target.Type == intstr.Int && target.IntVal == cp.ContainerPort) {
				return cp, true
			}
		}
	}
	return corev1.ContainerPort{}, false
}

func checkServices(t *testing.T, c *cluster) {
	t.Helper()
	for _, s := range c.Services {
		pods := c.podsOf(labels.SelectorFromSet(s.Spec.Selector))
		if len(s.Spec.Selector) == 0 || len(pods) == 0 {
			t.Errorf("Service %s: selector %v selects no workload", s.Name, s.Spec.Selector)
			continue
		}
		for _, sp := range s.Spec.Ports {
			target := sp.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt(int(sp.Port))
			}
			for _, w := range pods {
				if _, ok := containerPort(w, target); !ok {
					t.Errorf("Service %s port %s: target %s is no port of %s", s.Name, sp.Name, target.String(), w.Name)
				}
			}
		}
	}
}

// allowsIngress reports whether some policy selecting w's pods lets port in.
func (c *cluster) allowsIngress(w workload, port corev1.ContainerPort) bool {
	for _, p := range c.Policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(w.Template.Labels)) {
			continue
		}
		for _, r := range p.Spec.Ingress {
			if len(r.Ports) == 0 {
				return true
			}
			for _, rp := range r.Ports {
				if rp.Port == nil || (rp.Port.Type == intstr.Int && rp.Port.IntVal == port.ContainerPort) ||
					(rp.Port.Type == intstr.String && rp.Port.StrVal == port.Name) {
					return true
				}
			}
		}
	}
	return false
}

// allowsEgress reports whether from's pods may reach to's pods on port.
func (c *cluster) allowsEgress(from, to workload, port int32) bool {
	for _, p := range c.Policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(from.Template.Labels)) {
			continue
		}
		for _, r := range p.Spec.Egress {
			portOK := len(r.Ports) == 0
			for _, rp := range r.Ports {
				portOK = portOK || rp.Port == nil || (rp.Port.Type == intstr.Int && rp.Port.IntVal == port)
			}
			for _, peer := range r.To {
				if peer.PodSelector == nil || peer.NamespaceSelector != nil {
					continue
				}
				ps, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
				if err == nil && ps.Matches(labels.Set(to.Template.Labels)) && portOK {
					return true
				}
			}
		}
	}
	return false
}

func checkPolicies(t *testing.T, c *cluster) {
	t.Helper()
	deny := false
	for _, p := range c.Policies {
		if len(p.Spec.PodSelector.MatchLabels) == 0 && len(p.Spec.PodSelector.MatchExpressions) == 0 {
			if !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) ||
				len(p.Spec.Ingress) > 0 || len(p.Spec.Egress) > 0 {
				t.Errorf("NetworkPolicy %s selects every pod, so it must deny all ingress and egress", p.Name)
			}
			deny = true
			continue
		}
		for _, r := range p.Spec.Ingress {
			checkPeers(t, c, p.Name, r.From)
		}
		for _, r := range p.Spec.Egress {
			checkPeers(t, c, p.Name, r.To)
		}
	}
	if !deny {
		t.Error("no default-deny NetworkPolicy")
	}
	// Every workload has its own policy, and every Service port it serves
	// is let in by one.
	for _, w := range c.Workloads {
		own := false
		for _, p := range c.Policies {
			sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
			if err == nil && !sel.Empty() && sel.Matches(labels.Set(w.Template.Labels)) {
				own = own || (slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) && slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeEgress))
			}
		}
		if !own {
			t.Errorf("%s: no NetworkPolicy of its own (ingress and egress)", w.Name)
		}
	}
	for _, s := range c.Services {
		for _, w := range c.podsOf(labels.SelectorFromSet(s.Spec.Selector)) {
			for _, sp := range s.Spec.Ports {
				target := sp.TargetPort
				if target.Type == intstr.Int && target.IntVal == 0 {
					target = intstr.FromInt(int(sp.Port))
				}
				if cp, ok := containerPort(w, target); ok && !c.allowsIngress(w, cp) {
					t.Errorf("Service %s port %s: no NetworkPolicy lets it into %s", s.Name, sp.Name, w.Name)
				}
			}
		}
	}
}

// checkPeers asserts that a policy's pod selectors (within the namespace)
// select pods that exist.
func checkPeers(t *testing.T, c *cluster, policy string, peers []networkingv1.NetworkPolicyPeer) {
	t.Helper()
	for _, peer := range peers {
		if peer.PodSelector == nil || peer.NamespaceSelector != nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
		if err != nil || len(c.podsOf(sel)) == 0 {
			t.Errorf("NetworkPolicy %s: peer %v selects no pods here", policy, peer.PodSelector)
		}
	}
}

// named returns a workload and its one container.
func named(t *testing.T, c *cluster, name string) (workload, corev1.Container) {
	t.Helper()
	w, ok := c.workload(name)
	if !ok || len(w.Template.Spec.Containers) != 1 {
		t.Fatalf("no %s workload with one container", name)
	}
	return w, w.Template.Spec.Containers[0]
}

// server returns the server workload and its container.
func server(t *testing.T, c *cluster) (workload, corev1.Container) {
	t.Helper()
	return named(t, c, serverName)
}

// argFlags maps each --name=value argument (after the subcommand) to its
// value; a bare --name maps to "".
func argFlags(t *testing.T, args []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, a := range args[1:] {
		name, val, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "--") || name == "" {
			t.Errorf("argument %q: want --name or --name=value", a)
		}
		if _, dup := out[name]; dup {
			t.Errorf("flag --%s given twice", name)
		}
		out[name] = val
	}
	return out
}

func envValue(ct corev1.Container, name string) (string, bool) {
	for _, e := range ct.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// envVar returns ct's env entry name.
func envVar(ct corev1.Container, name string) (corev1.EnvVar, bool) {
	for _, e := range ct.Env {
		if e.Name == name {
			return e, true
		}
	}
	return corev1.EnvVar{}, false
}

// checkFieldEnv asserts that env name comes from the pod field path.
func checkFieldEnv(t *testing.T, id string, ct corev1.Container, name, path string) {
	t.Helper()
	e, ok := envVar(ct, name)
	if !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != path {
		t.Errorf("%s: env %s must come from the field %s", id, name, path)
	}
}

// checkSecretEnv asserts that env name comes from key of Secret secret.
func checkSecretEnv(t *testing.T, id string, ct corev1.Container, name, secret, key string) {
	t.Helper()
	e, ok := envVar(ct, name)
	if !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != secret || e.ValueFrom.SecretKeyRef.Key != key {
		t.Errorf("%s: env %s must come from the Secret %s, key %s", id, name, secret, key)
	}
}

// commandLine asserts that ct runs the image's entrypoint with args
// SUB --flag... and returns the flags.
func commandLine(t *testing.T, id string, ct corev1.Container, sub string) map[string]string {
	t.Helper()
	if len(ct.Args) == 0 || ct.Args[0] != sub || len(ct.Command) != 0 {
		t.Fatalf("%s: the container must run the image's entrypoint with args %s ...; have command %v args %v", id, sub, ct.Command, ct.Args)
	}
	return argFlags(t, ct.Args)
}

// mountOf returns the mount and volume at path in ct.
func mountOf(w workload, ct corev1.Container, path string) (corev1.VolumeMount, corev1.Volume, bool) {
	for _, m := range ct.VolumeMounts {
		if filepath.Clean(m.MountPath) == filepath.Clean(path) {
			for _, v := range w.Template.Spec.Volumes {
				if v.Name == m.Name {
					return m, v, true
				}
			}
			return m, corev1.Volume{}, true
		}
	}
	return corev1.VolumeMount{}, corev1.Volume{}, false
}

// checkListen asserts that --flag listens on the container port named port.
func checkListen(t *testing.T, id string, w workload, flags map[string]string, flag, port string) int32 {
	t.Helper()
	_, p, err := splitHostPort(flags[flag])
	cp, ok := containerPort(w, intstr.FromString(port))
	if err != nil || !ok || p != int(cp.ContainerPort) {
		t.Errorf("%s: --%s=%q does not listen on the container port %q", id, flag, flags[flag], port)
	}
	return cp.ContainerPort
}

// checkClusterSecret asserts that --cluster-secret-file names the key
// secret of the Secret space-cluster, mounted read-only.
func checkClusterSecret(t *testing.T, id string, w workload, ct corev1.Container, flags map[string]string) {
	t.Helper()
	file := flags["cluster-secret-file"]
	m, v, ok := mountOf(w, ct, filepath.Dir(file))
	if !ok || v.Secret == nil || v.Secret.SecretName != clusterSecret || !m.ReadOnly {
		t.Errorf("%s: --cluster-secret-file=%q is not in a read-only mount of the Secret %s", id, file, clusterSecret)
		return
	}
	found := false
	for _, it := range v.Secret.Items {
		found = found || (it.Key == "secret" && it.Path == filepath.Base(file))
	}
	if !found {
		t.Errorf("%s: --cluster-secret-file=%q is not the Secret %s's key secret", id, file, clusterSecret)
	}
	if _, ok := envVar(ct, "SPACE_CLUSTER_SECRET"); ok {
		t.Errorf("%s: the cluster secret belongs in a file, not in the environment", id)
	}
}

// checkLinkTLS asserts that the node link runs over mutual TLS: no
// --cluster-plaintext, --cluster-tls-dir a read-only mount of an in-memory
// volume that an unprivileged init container fills with `space certs
// issue` (want: its identity arguments) from the CA in the Secret
// space-cluster-ca, which only that init container mounts.
func checkLinkTLS(t *testing.T, id string, w workload, ct corev1.Container, flags map[string]string, want ...string) {
	t.Helper()
	if _, ok := flags["cluster-plaintext"]; ok {
		t.Errorf("%s: --cluster-plaintext: the node link must be TLS", id)
	}
	dir := flags["cluster-tls-dir"]
	m, v, ok := mountOf(w, ct, dir)
	if dir == "" || !ok || !m.ReadOnly || v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory {
		t.Errorf("%s: --cluster-tls-dir=%q is not a read-only mount of an in-memory emptyDir", id, dir)
		return
	}
	for _, c := range w.Template.Spec.Containers {
		for _, cm := range c.VolumeMounts {
			if vv, ok := volumeNamed(w, cm.Name); ok && vv.Secret != nil && vv.Secret.SecretName == "space-cluster-ca" {
				t.Errorf("%s: container %s mounts the CA key", id, c.Name)
			}
		}
	}
	var issuer *corev1.Container
	for i, ic := range w.Template.Spec.InitContainers {
		for _, im := range ic.VolumeMounts {
			if im.Name == m.Name && !im.ReadOnly {
				issuer = &w.Template.Spec.InitContainers[i]
			}
		}
	}
	if issuer == nil {
		t.Errorf("%s: no init container writes the certificate volume %s", id, m.Name)
		return
	}
	args := strings.Join(issuer.Args, " ")
	for _, a := range append([]string{"certs issue", "--out=" + dir}, want...) {
		if !strings.Contains(args, a) {
			t.Errorf("%s: init container %s args %q lack %q", id, issuer.Name, args, a)
		}
	}
	caDir := strings.TrimPrefix(issuer.Args[slices.IndexFunc(issuer.Args, func(a string) bool { return strings.HasPrefix(a, "--ca-dir=") })], "--ca-dir=")
	if cm, cv, ok := mountOf(w, *issuer, caDir); !ok || !cm.ReadOnly || cv.Secret == nil || cv.Secret.SecretName != "space-cluster-ca" {
		t.Errorf("%s: init container %s: --ca-dir=%q is not a read-only mount of the Secret space-cluster-ca", id, issuer.Name, caDir)
	}
	if sc := issuer.SecurityContext; sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: init container %s must be unprivileged with a read-only root filesystem", id, issuer.Name)
	}
}

func volumeNamed(w workload, name string) (corev1.Volume, bool) {
	for _, v := range w.Template.Spec.Volumes {
		if v.Name == name {
			return v, true
		}
	}
	return corev1.Volume{}, false
}

// checkSandboxHost asserts what a privileged workload that runs sandboxes
// (the node, or the single-process server) needs from its host.
func checkSandboxHost(t *testing.T, w workload, ct corev1.Container, flags map[string]string, nameFlag string) {
	t.Helper()
	id := w.Kind + "/" + w.Name
	ps := w.Template.Spec
	if w.Kind != "DaemonSet" {
		t.Errorf("%s: what runs a host's sandboxes must be a DaemonSet, one per host", id)
	}
	// Running sandboxes outlive the pod, for the next one to re-adopt:
	// their PID 1s in the host's PID namespace, not the container's (its
	// end kills every process in it).
	if !ps.HostPID {
		t.Errorf("%s: must share the host's PID namespace (hostPID): sandboxes in the container's end with it", id)
	}
	if ps.HostNetwork || ps.HostIPC {
		t.Errorf("%s: must not share the host's network or IPC namespace", id)
	}
	if ps.NodeSelector[nodeLabel] != "true" {
		t.Errorf("%s: must run only on hosts labelled %s=true", id, nodeLabel)
	}
	for _, m := range ct.VolumeMounts {
		if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
			t.Errorf("%s: mount %s: Bidirectional propagation would leave its mounts on the host", id, m.MountPath)
		}
		if strings.HasPrefix(filepath.Clean(m.MountPath), "/sys/fs/cgroup") {
			// The runtime's own cgroup mount stays where it is; the host's
			// tree goes beside it.
			t.Errorf("%s: mount %s: must not cover the runtime's cgroup mount", id, m.MountPath)
		}
	}
	// The sandboxes' cgroups in none of the pod's: the runtime and the
	// kubelet kill what is left in those when the pod goes.
	if p := flags["cgroup-parent"]; !strings.HasPrefix(p, "/") || p == "/" {
		t.Errorf("%s: --cgroup-parent=%q: want a cgroup path outside the pod's, in the host's tree", id, p)
	}
	if _, v, ok := mountOf(w, ct, "/host/sys/fs/cgroup"); !ok || v.HostPath == nil || v.HostPath.Path != "/sys/fs/cgroup" {
		t.Errorf("%s: the host's /sys/fs/cgroup is not mounted at /host/sys/fs/cgroup (--cgroup-parent needs the host's tree)", id)
	}
	// Templates, layers, logs and snapshots outlive the pod, on the host.
	if _, v, ok := mountOf(w, ct, flags["data-dir"]); !ok || v.HostPath == nil || v.HostPath.Path != flags["data-dir"] {
		t.Errorf("%s: --data-dir=%q is not the host's directory of that name", id, flags["data-dir"])
	}
	// The sockets of the sandboxes the next pod re-adopts.
	if m, v, ok := mountOf(w, ct, flags["run-dir"]); !ok || m.ReadOnly || v.HostPath == nil {
		t.Errorf("%s: --run-dir=%q is not a writable host directory", id, flags["run-dir"])
	}
	if flags[nameFlag] != "$(NODE_NAME)" {
		t.Errorf("%s: --%s=%q: want the Kubernetes node name, stable across pod restarts", id, nameFlag, flags[nameFlag])
	}
	checkFieldEnv(t, id, ct, "NODE_NAME", "spec.nodeName")
	checkSecretEnv(t, id, ct, "SPACE_STORE", "space-db", "dsn")
	if _, ok := flags["store"]; ok {
		t.Errorf("%s: --store on the command line shows the DSN's password in ps; use SPACE_STORE from the Secret", id)
	}
}

// checkServer asserts what the single-process server (its host's node)
// needs.
func checkServer(t *testing.T, c *cluster) {
	t.Helper()
	w, ct := server(t, c)
	id := w.Kind + "/" + w.Name
	flags := commandLine(t, id, ct, "server")
	checkSandboxHost(t, w, ct, flags, "node-name")
	if _, ok := flags["remote-nodes"]; ok {
		t.Errorf("%s: the single-process server runs its own node, not --remote-nodes", id)
	}
	// Each listener is where the Service and probes expect it.
	checkListen(t, id, w, flags, "listen", "control")
	checkListen(t, id, w, flags, "data-listen", "data")
	checkEgress(t, c, w, flags)
}

// metricsNamespace is the label of namespaces whose pods (Prometheus) may
// scrape the egress gateway's unauthenticated metrics port.
var metricsNamespace = map[string]string{"space-sandbox.dev/metrics": "true"}

// kubeDNS: the cluster DNS pods, in front of which the Service is the first
// nameserver of a pod's /etc/resolv.conf (dnsPolicy ClusterFirst).
var (
	kubeDNSNamespace = map[string]string{"kubernetes.io/metadata.name": "kube-system"}
	kubeDNSPod       = map[string]string{"k8s-app": "kube-dns"}
)

// checkEgress asserts what a workload that runs the egress gateway (the
// node, or the single-process server) needs: --egress, scrape annotations
// that match --egress-metrics on a container port of the pod's own
// address, that port let in only from namespaces labelled for metrics,
// and the gateway's upstreams let out: the cluster DNS (what --egress-dns
// defaults to in a pod) and public addresses, not private ones.
func checkEgress(t *testing.T, c *cluster, w workload, flags map[string]string) {
	t.Helper()
	id := w.Kind + "/" + w.Name
	if _, on := flags["egress"]; !on {
		t.Errorf("%s: must run --egress (sandbox networking)", id)
		return
	}
	// Prometheus scrapes what the egress gateway serves.
	an := w.Template.Annotations
	port, _ := strconv.Atoi(an["prometheus.io/port"])
	cp, ok := containerPort(w, intstr.FromInt(port))
	host, mp, err := splitHostPort(flags["egress-metrics"])
	if an["prometheus.io/scrape"] != "true" || !ok || err != nil || mp != int(cp.ContainerPort) || an["prometheus.io/path"] != "/metrics" {
		t.Errorf("%s: scrape annotations %v do not match --egress-metrics=%q on a container port", id, an, flags["egress-metrics"])
	}
	// Unauthenticated: on the pod's address, not the host's, and only for
	// the monitoring namespaces.
	if host != "$(POD_IP)" || cp.HostPort != 0 {
		t.Errorf("%s: --egress-metrics=%q (hostPort %d): want $(POD_IP), no hostPort", id, flags["egress-metrics"], cp.HostPort)
	}
	checkFieldEnv(t, id, w.Template.Spec.Containers[0], "POD_IP", "status.podIP")
	if ok && (c.openIngress(w, cp.ContainerPort) || !c.allowsIngressFromNamespace(w, metricsNamespace, cp.ContainerPort)) {
		t.Errorf("%s: the metrics port %d must be let in from namespaces labelled %v, and only from them", id, cp.ContainerPort, metricsNamespace)
	}
	// The gateway's upstream resolver: the pod's first nameserver, the
	// cluster DNS.
	if v, set := flags["egress-dns"]; set {
		t.Errorf("%s: --egress-dns=%q: the policies are checked for the default, the cluster DNS", id, v)
	}
	if dp := w.Template.Spec.DNSPolicy; dp != "" && dp != corev1.DNSClusterFirst {
		t.Errorf("%s: dnsPolicy %s: the gateway's resolver (--egress-dns) defaults to the cluster DNS only with ClusterFirst", id, dp)
	}
	for _, proto := range []corev1.Protocol{corev1.ProtocolUDP, corev1.ProtocolTCP} {
		if !c.allowsEgressToNamespace(w, kubeDNSNamespace, kubeDNSPod, 53, proto) {
			t.Errorf("%s: the NetworkPolicies do not let the gateway ask the cluster DNS (%s 53)", id, proto)
		}
	}
	// The upstreams sandboxes' policies allow: public addresses, any port;
	// the cluster and cloud metadata stay out of reach.
	for _, a := range []string{"93.184.215.14", "1.1.1.1"} {
		for _, p := range []int32{443, 80, 22} {
			if !c.allowsEgressToAddr(w, netip.MustParseAddr(a), p) {
				t.Errorf("%s: the NetworkPolicies do not let the gateway reach %s:%d", id, a, p)
			}
		}
	}
	for _, a := range []string{"10.96.0.1", "169.254.169.254", "172.17.0.1", "192.168.1.1", "100.64.0.1"} {
		if c.allowsEgressToAddr(w, netip.MustParseAddr(a), 443) {
			t.Errorf("%s: the NetworkPolicies let it reach the private address %s", id, a)
		}
	}
}

// checkSplit asserts what the servers-and-nodes layout needs: an
// unprivileged server Deployment with --remote-nodes, a privileged node
// DaemonSet, one cluster secret, and the paths between them open.
func checkSplit(t *testing.T, c *cluster) (dataURL string) {
	t.Helper()
	sw, sct := server(t, c)
	sid := sw.Kind + "/" + sw.Name
	sflags := commandLine(t, sid, sct, "server")
	if sw.Kind != "Deployment" || sw.Replicas == nil || *sw.Replicas < 2 {
		t.Errorf("%s: the servers must be a Deployment of at least 2 replicas", sid)
	}
	if _, ok := sflags["remote-nodes"]; !ok {
		t.Errorf("%s: the server must run with --remote-nodes", sid)
	}
	for _, f := range []string{"egress", "egress-metrics", "snapshot-store", "data-listen", "store"} {
		if _, ok := sflags[f]; ok {
			t.Errorf("%s: --%s does not belong on a --remote-nodes server", sid, f)
		}
	}
	if len(hostPaths(sw.Template.Spec)) > 0 || sw.Template.Spec.HostNetwork {
		t.Errorf("%s: the server needs nothing of its host", sid)
	}
	checkClusterSecret(t, sid, sw, sct, sflags)
	checkLinkTLS(t, sid, sw, sct, sflags, "--server=$(POD_NAME)")
	checkSecretEnv(t, sid, sct, "SPACE_STORE", "space-db", "dsn")
	// Replica names are unique per pod.
	if sflags["node-name"] != "$(POD_NAME)" {
		t.Errorf("%s: --node-name=%q: want the pod's name, unique per replica", sid, sflags["node-name"])
	}
	checkFieldEnv(t, sid, sct, "POD_NAME", "metadata.name")
	if m, _, ok := mountOf(sw, sct, sflags["data-dir"]); !ok || m.ReadOnly {
		t.Errorf("%s: --data-dir=%q is not a writable volume (the root filesystem is read-only)", sid, sflags["data-dir"])
	}
	checkListen(t, sid, sw, sflags, "listen", "control")
	// A --remote-nodes server serves no metrics (the egress gateway is on
	// the nodes).
	if an := sw.Template.Annotations; an["prometheus.io/scrape"] != "" {
		t.Errorf("%s: scrape annotations %v, but a --remote-nodes server serves no metrics", sid, an)
	}
	if _, ok := containerPort(sw, intstr.FromString("metrics")); ok {
		t.Errorf("%s: a metrics port, but a --remote-nodes server serves no metrics", sid)
	}

	nw, nct := named(t, c, nodeName)
	nid := nw.Kind + "/" + nw.Name
	nflags := commandLine(t, nid, nct, "node")
	checkSandboxHost(t, nw, nct, nflags, "name")
	checkClusterSecret(t, nid, nw, nct, nflags)
	checkLinkTLS(t, nid, nw, nct, nflags, "--node=$(NODE_NAME)", "--host=$(POD_IP)")
	// Sandbox networking is on the nodes (the servers refuse --egress).
	checkEgress(t, c, nw, nflags)
	// The RPC: the servers are told the pod's address and the RPC port.
	rpc := checkListen(t, nid, nw, nflags, "listen", "rpc")
	if want := fmt.Sprintf("https://$(POD_IP):%d", rpc); nflags["rpc-url"] != want {
		t.Errorf("%s: --rpc-url=%q, want %q (the default, https://<listen>, is no address)", nid, nflags["rpc-url"], want)
	}
	checkFieldEnv(t, nid, nct, "POD_IP", "status.podIP")
	// The data plane: a hostPort on every host, named by the data URL.
	data := checkListen(t, nid, nw, nflags, "data-listen", "data")
	dp, _ := containerPort(nw, intstr.FromString("data"))
	if dp.HostPort != data {
		t.Errorf("%s: the data port needs hostPort %d: clients reach each node at its host", nid, data)
	}
	if nflags["data-url"] != "$(SPACE_DATA_URL)" {
		t.Errorf("%s: --data-url=%q, want $(SPACE_DATA_URL)", nid, nflags["data-url"])
	}
	dataURL, _ = envValue(nct, "SPACE_DATA_URL")
	// The shared snapshot store and its credentials, from a Secret.
	if nflags["snapshot-store"] != "$(SPACE_SNAPSHOT_STORE)" {
		t.Errorf("%s: --snapshot-store=%q, want $(SPACE_SNAPSHOT_STORE)", nid, nflags["snapshot-store"])
	}
	checkSecretEnv(t, nid, nct, "SPACE_SNAPSHOT_STORE", "space-snapshots", "store")
	checkSecretEnv(t, nid, nct, "AWS_ACCESS_KEY_ID", "space-snapshots", "access-key-id")
	checkSecretEnv(t, nid, nct, "AWS_SECRET_ACCESS_KEY", "space-snapshots", "secret-access-key")

	// The paths between them.
	db, _ := c.workload("space-postgres")
	for _, w := range []workload{sw, nw} {
		if !c.allowsEgress(w, db, 5432) || !c.allowsIngressFrom(db, w, 5432) {
			t.Errorf("the NetworkPolicies do not let %s reach the database", w.Name)
		}
	}
	if !c.allowsEgress(sw, nw, rpc) || !c.allowsIngressFrom(nw, sw, rpc) {
		t.Error("the NetworkPolicies do not let the servers reach the node RPC")
	}
	if c.openIngress(nw, rpc) {
		t.Error("the node RPC is open to every client: only the servers and nodes may reach it")
	}
	if !c.allowsEgress(nw, nw, rpc) || !c.allowsIngressFrom(nw, nw, rpc) {
		t.Error("the NetworkPolicies do not let a node forward data-plane requests to another node's RPC")
	}
	if !c.openIngress(nw, data) {
		t.Error("clients cannot reach the nodes' data plane")
	}
	cp, _ := containerPort(sw, intstr.FromString("control"))
	if !c.openIngress(sw, cp.ContainerPort) {
		t.Error("clients cannot reach the control API")
	}
	// Clients reach the servers through a Service; no Service for the
	// RPC: the servers use the address each node registers.
	for _, s := range c.Services {
		sel := labels.SelectorFromSet(s.Spec.Selector)
		if sel.Matches(labels.Set(nw.Template.Labels)) {
			t.Errorf("Service %s selects the nodes: each session names its node's data URL", s.Name)
		}
	}
	return dataURL
}

// openIngress reports whether some policy lets anyone reach w on port.
func (c *cluster) openIngress(w workload, port int32) bool {
	for _, p := range c.Policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(w.Template.Labels)) {
			continue
		}
		for _, r := range p.Spec.Ingress {
			if len(r.From) > 0 {
				continue
			}
			if len(r.Ports) == 0 {
				return true
			}
			for _, rp := range r.Ports {
				if rp.Port == nil || (rp.Port.Type == intstr.Int && rp.Port.IntVal == port) {
					return true
				}
			}
		}
	}
	return false
}

// allowsIngressFrom reports whether some policy selecting to's pods lets
// from's pods in on port.
func (c *cluster) allowsIngressFrom(to, from workload, port int32) bool {
	for _, p := range c.Policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(to.Template.Labels)) {
			continue
		}
		for _, r := range p.Spec.Ingress {
			portOK := len(r.Ports) == 0
			for _, rp := range r.Ports {
				portOK = portOK || rp.Port == nil || (rp.Port.Type == intstr.Int && rp.Port.IntVal == port)
			}
			if !portOK {
				continue
			}
			if len(r.From) == 0 {
				return true
			}
			for _, peer := range r.From {
				if peer.PodSelector == nil || peer.NamespaceSelector != nil {
					continue
				}
				ps, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
				if err == nil && ps.Matches(labels.Set(from.Template.Labels)) {
					return true
				}
			}
		}
	}
	return false
}

// allowsIngressFromNamespace reports whether some policy selecting w's
// pods lets pods of namespaces labelled ns in on port.
func (c *cluster) allowsIngressFromNamespace(w workload, ns map[string]string, port int32) bool {
	for _, p := range c.Policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(w.Template.Labels)) {
			continue
		}
		for _, r := range p.Spec.Ingress {
			if !portsAllow(r.Ports, port, corev1.ProtocolTCP) {
				continue
			}
			for _, peer := range r.From {
				if peerMatches(peer, ns, nil) {
					return true
				}
			}
		}
	}
	return false
}

// allowsEgressToNamespace reports whether some policy selecting w's pods
// lets them reach pods labelled pod in namespaces labelled ns on port.
func (c *cluster) allowsEgressToNamespace(w workload, ns, pod map[string]string, port int32, proto corev1.Protocol) bool {
	for _, p := range c.Policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(w.Template.Labels)) {
			continue
		}
		for _, r := range p.Spec.Egress {
			if !portsAllow(r.Ports, port, proto) {
				continue
			}
			if len(r.To) == 0 {
				return true
			}
			for _, peer := range r.To {
				if peerMatches(peer, ns, pod) {
					return true
				}
			}
		}
	}
	return false
}

// allowsEgressToAddr reports whether some policy selecting w's pods lets
// them reach addr on TCP port through an ipBlock (or a rule with no peers).
func (c *cluster) allowsEgressToAddr(w workload, addr netip.Addr, port int32) bool {
	for _, p := range c.Policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(w.Template.Labels)) {
			continue
		}
		for _, r := range p.Spec.Egress {
			if !portsAllow(r.Ports, port, corev1.ProtocolTCP) {
				continue
			}
			if len(r.To) == 0 {
				return true
			}
			for _, peer := range r.To {
				if peer.IPBlock == nil {
					continue
				}
				if pfx, err := netip.ParsePrefix(peer.IPBlock.CIDR); err != nil || !pfx.Contains(addr) {
					continue
				}
				excepted := false
				for _, e := range peer.IPBlock.Except {
					if pfx, err := netip.ParsePrefix(e); err == nil && pfx.Contains(addr) {
						excepted = true
					}
				}
				if !excepted {
					return true
				}
			}
		}
	}
	return false
}

// portsAllow reports whether a rule's ports admit port/proto (no ports:
// all; no protocol: TCP).
func portsAllow(ports []networkingv1.NetworkPolicyPort, port int32, proto corev1.Protocol) bool {
	if len(ports) == 0 {
		return true
	}
	for _, rp := range ports {
		p := corev1.ProtocolTCP
		if rp.Protocol != nil {
			p = *rp.Protocol
		}
		if p != proto {
			continue
		}
		if rp.Port == nil || (rp.Port.Type == intstr.Int && rp.Port.IntVal == port) {
			return true
		}
	}
	return false
}

// peerMatches reports whether a policy peer with a namespaceSelector admits
// pods labelled pod (nil: any pod) in namespaces labelled ns. Peers
// without one (this namespace) or with an ipBlock do not.
func peerMatches(peer networkingv1.NetworkPolicyPeer, ns, pod map[string]string) bool {
	if peer.NamespaceSelector == nil || peer.IPBlock != nil {
		return false
	}
	nsel, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
	if err != nil || !nsel.Matches(labels.Set(ns)) {
		return false
	}
	if peer.PodSelector == nil {
		return true
	}
	if pod == nil {
		// Any pod of those namespaces: only a peer that selects them all.
		ps, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
		return err == nil && ps.Empty()
	}
	ps, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
	return err == nil && ps.Matches(labels.Set(pod))
}

func splitHostPort(s string) (string, int, error) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return "", 0, fmt.Errorf("%q: no port", s)
	}
	p, err := strconv.Atoi(s[i+1:])
	return s[:i], p, err
}

func privilegedOf(dir string) ([]string, []string) {
	for _, v := range variants {
		if v.Dir == dir {
			return v.Privileged, v.External
		}
	}
	panic("unknown variant " + dir)
}

// checkNamespace: a kustomization makes the namespace, and it must admit
// privileged pods (the Helm chart leaves it to the user, README.md).
func checkNamespace(t *testing.T, c *cluster) {
	t.Helper()
	if len(c.Namespaces) != 1 || c.Namespaces[0].Name != namespace {
		t.Fatalf("want exactly the Namespace %q, have %v", namespace, c.Namespaces)
	}
	if c.Namespaces[0].Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Error("the namespace must admit the privileged server pods (pod-security enforce=privileged)")
	}
}

func loadVariant(t *testing.T, dir string) *cluster {
	t.Helper()
	c := load(t, dir)
	checkNamespace(t, c)
	priv, ext := privilegedOf(dir)
	checkCommon(t, c, priv, ext...)
	return c
}

// TestBase: the base is the servers-and-nodes layout.
func TestBase(t *testing.T) {
	c := loadVariant(t, "base")
	dataURL := checkSplit(t, c)
	for _, name := range []string{serverName, nodeName} {
		if _, ct := named(t, c, name); ct.Image != "space:0.1.0" {
			t.Errorf("%s image %q, want space:0.1.0", name, ct.Image)
		}
	}
	if dataURL != "http://$(HOST_IP):7071" {
		t.Errorf("SPACE_DATA_URL %q: each session must name its node's host and the data hostPort", dataURL)
	}
	_, nct := named(t, c, nodeName)
	checkFieldEnv(t, "the node", nct, "HOST_IP", "status.hostIP")
	if len(c.Secrets) != 0 {
		t.Error("the base must not ship a Secret (no default password or cluster secret)")
	}
}

// TestSingle: the single-process layout, today's server DaemonSet.
func TestSingle(t *testing.T) {
	c := loadVariant(t, "single")
	checkServer(t, c)
	if _, ok := c.workload(nodeName); ok {
		t.Error("the single-process layout runs no space node")
	}
	_, ct := server(t, c)
	if ct.Image != "space:0.1.0" {
		t.Errorf("server image %q, want space:0.1.0", ct.Image)
	}
	if v, _ := envValue(ct, "SPACE_DATA_URL"); v != "http://$(POD_IP):7071" {
		t.Errorf("SPACE_DATA_URL %q: each session must name its own pod's data plane", v)
	}
	// Egress credentials work only here (remote nodes have no shared
	// credential store yet): the docs send users of them to this layout.
	if _, ok := argFlags(t, ct.Args)["egress"]; !ok {
		t.Error("the single-process layout must run --egress (the one with egress credentials)")
	}
	if len(c.Secrets) != 0 {
		t.Error("the single-process layout must not ship a Secret (no default password)")
	}
}

// checkKindDB asserts that the kind overlay's DSN names the database the
// StatefulSet creates, and that what runs `from` may reach it.
func checkKindDB(t *testing.T, c *cluster, from ...string) {
	t.Helper()
	db, ok := c.workload("space-postgres")
	if !ok {
		t.Fatal("no space-postgres")
	}
	pg := db.Template.Spec.Containers[0]
	s := c.Secrets["space-db"]
	u, err := url.Parse(s.StringData["dsn"])
	if err != nil {
		t.Fatal(err)
	}
	user, _ := envValue(pg, "POSTGRES_USER")
	dbName, _ := envValue(pg, "POSTGRES_DB")
	pw, _ := u.User.Password()
	if u.Scheme != "postgres" || u.User.Username() != user || pw != s.StringData["password"] || u.Path != "/"+dbName {
		t.Errorf("dsn %q does not match the database (user %q, db %q, the Secret's password)", u.Redacted(), user, dbName)
	}
	var svc *corev1.Service
	for i := range c.Services {
		if c.Services[i].Name == u.Hostname() {
			svc = &c.Services[i]
		}
	}
	if svc == nil || len(svc.Spec.Ports) != 1 || strconv.Itoa(int(svc.Spec.Ports[0].Port)) != u.Port() ||
		!labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(db.Template.Labels)) {
		t.Errorf("dsn host %s:%s is not the database's Service", u.Hostname(), u.Port())
	}
	for _, name := range from {
		w, _ := c.workload(name)
		if !c.allowsEgress(w, db, 5432) || !c.allowsIngressFrom(db, w, 5432) {
			t.Errorf("the NetworkPolicies do not let %s reach the database", name)
		}
	}
}

// checkKindCluster: the cluster config labels a node for the DaemonSet.
func checkKindCluster(t *testing.T) {
	t.Helper()
	raw, err := os.ReadFile("kind/cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type kindNode struct {
		Role   string            `json:"role"`
		Labels map[string]string `json:"labels"`
	}
	var kc struct {
		Kind       string     `json:"kind"`
		APIVersion string     `json:"apiVersion"`
		Name       string     `json:"name"`
		Nodes      []kindNode `json:"nodes"`
	}
	if err := yaml.UnmarshalStrict(raw, &kc); err != nil {
		t.Fatalf("kind/cluster.yaml: %v", err)
	}
	if kc.Kind != "Cluster" || kc.APIVersion != "kind.x-k8s.io/v1alpha4" ||
		!slices.ContainsFunc(kc.Nodes, func(n kindNode) bool { return n.Labels[nodeLabel] == "true" }) {
		t.Errorf("kind/cluster.yaml: want a kind Cluster with a node labelled %s=true", nodeLabel)
	}
}

// TestKind: the base layout on kind.
func TestKind(t *testing.T) {
	c := loadVariant(t, "kind")
	dataURL := checkSplit(t, c)
	for _, name := range []string{serverName, nodeName} {
		if _, ct := named(t, c, name); ct.Image != "space:dev" {
			t.Errorf("%s image %q, want space:dev (what docs/install-kind.md builds and loads)", name, ct.Image)
		}
	}
	if dataURL != "http://127.0.0.1:7071" {
		t.Errorf("SPACE_DATA_URL %q: through port-forward the data plane is 127.0.0.1:7071", dataURL)
	}
	checkKindDB(t, c, serverName, nodeName)
	checkKindCluster(t)
	if s := c.Secrets[clusterSecret].StringData["secret"]; len(strings.TrimSpace(s)) < 32 {
		t.Errorf("Secret %s: the cluster secret needs at least 32 bytes, has %d", clusterSecret, len(s))
	}
	// A dir: snapshot store must be on a volume of the node (kind has one
	// host, so a directory on it is shared by all its nodes).
	store := c.Secrets["space-snapshots"].StringData["store"]
	nw, nct := named(t, c, nodeName)
	if p, ok := strings.CutPrefix(store, "dir:"); !ok {
		t.Errorf("kind's snapshot store %q: want dir:/path (no S3 in kind)", store)
	} else if dd := argFlags(t, nct.Args)["data-dir"]; !strings.HasPrefix(p, dd+"/") || strings.HasPrefix(p, dd+"/snapshots") {
		t.Errorf("kind's snapshot store %q: want a directory of its own under the node's --data-dir %s (on the host)", store, dd)
	} else if _, _, ok := mountOf(nw, nct, dd); !ok {
		t.Errorf("kind's snapshot store %q is on no volume", store)
	}
}

// TestKindSingle: the single-process layout on kind.
func TestKindSingle(t *testing.T) {
	c := loadVariant(t, "kind-single")
	checkServer(t, c)
	_, ct := server(t, c)
	if ct.Image != "space:dev" {
		t.Errorf("server image %q, want space:dev (what docs/install-kind.md builds and loads)", ct.Image)
	}
	if v, _ := envValue(ct, "SPACE_DATA_URL"); v != "http://127.0.0.1:7071" {
		t.Errorf("SPACE_DATA_URL %q: through port-forward the data plane is 127.0.0.1:7071", v)
	}
	checkKindDB(t, c, serverName)
	// Both kind overlays ship the same database Secret.
	if k := load(t, "kind"); !reflect.DeepEqual(k.Secrets["space-db"], c.Secrets["space-db"]) {
		t.Error("kind and kind-single ship different space-db Secrets")
	}
}

// TestEveryFileIsUsed: a manifest that kustomization.yaml does not list
// would silently not be applied.
func TestEveryFileIsUsed(t *testing.T) {
	notResources := map[string]string{"kind/cluster.yaml": "kind's cluster config (kind create cluster --config)"}
	for _, dir := range dirs {
		r, err := render(dir)
		if err != nil {
			t.Fatal(err)
		}
		files, err := yamlFiles(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if _, ok := notResources[filepath.ToSlash(f)]; ok {
				continue
			}
			if !r.Used[f] {
				t.Errorf("%s is not listed in %s/kustomization.yaml", f, dir)
			}
		}
	}
	// Every kustomization is in dirs (and so rendered and checked here).
	ents, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(e.Name(), "kustomization.yaml")); err == nil && !slices.Contains(dirs, e.Name()) {
			t.Errorf("%s/kustomization.yaml is not tested: add it to dirs (and variants)", e.Name())
		}
	}
}

// buildSpace builds the real binary.
func buildSpace(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "space")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/space")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/space: %v\n%s", err, out)
	}
	return bin
}

// flagsOf reads `space ARGS... -h`: each flag's name and whether it is a
// bool flag.
func flagsOf(t *testing.T, bin string, args ...string) (isBool map[string]bool, help string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// -h makes the flag set print its flags and fail with ErrHelp.
	out, _ := exec.CommandContext(ctx, bin, append(args, "-h")...).CombinedOutput()
	isBool = map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)( \S+)?$`).FindAllStringSubmatch(string(out), -1) {
		isBool[m[1]] = m[2] == ""
	}
	if len(isBool) == 0 {
		t.Fatalf("could not read the flags of `space %s -h`:\n%s", strings.Join(args, " "), out)
	}
	return isBool, string(out)
}

// spaceServerArgs returns the flags of a `space server` command line in
// the "--name value" style of the systemd unit and docs.
func spaceServerArgs(t *testing.T, where string, fields []string, isBool map[string]bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		if !strings.HasPrefix(f, "-") {
			t.Errorf("%s: stray argument %q", where, f)
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(f, "-"), "=")
		b, ok := isBool[name]
		if !ok {
			t.Errorf("%s: `space server` has no flag %s", where, f)
			continue
		}
		if !b && !hasVal {
			if i+1 >= len(fields) {
				t.Errorf("%s: %s needs a value", where, f)
				break
			}
			i++
			val = fields[i]
		}
		out[name] = val
	}
	return out
}

// execStarts returns the `space server` command lines (after "server") of
// the ExecStart= lines in text, with continuation lines joined.
func execStarts(text string) [][]string {
	text = strings.ReplaceAll(text, "\\\n", " ")
	var out [][]string
	for _, line := range strings.Split(text, "\n") {
		cmd, ok := strings.CutPrefix(strings.TrimSpace(line), "ExecStart=")
		if !ok || cmd == "" {
			continue
		}
		f := strings.Fields(cmd)
		if len(f) >= 2 && f[0] == "/usr/local/bin/space" && f[1] == "server" {
			out = append(out, f[2:])
		} else {
			out = append(out, nil) // not `space server`: reported by the caller
		}
	}
	return out
}

// TestFlagsAreReal runs the real binary: every flag the Kubernetes
// manifests give `space server` and `space node`, and the systemd unit and
// docs/install-systemd.md give `space server`, must be one it accepts,
// bool flags bare and the others with a value.
func TestFlagsAreReal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the space binary")
	}
	bin := buildSpace(t)
	isBool, help := flagsOf(t, bin, "server")
	for _, want := range []string{"listen", "data-listen", "data-dir", "egress"} {
		if _, ok := isBool[want]; !ok {
			t.Fatalf("`space server -h` lists no -%s:\n%s", want, help)
		}
	}
	t.Run("kubernetes", func(t *testing.T) {
		nodeBool, nodeHelp := flagsOf(t, bin, "node")
		for _, want := range []string{"name", "listen", "rpc-url", "data-listen", "data-url", "cluster-secret-file", "snapshot-store", "egress", "egress-metrics"} {
			if _, ok := nodeBool[want]; !ok {
				t.Fatalf("`space node -h` lists no -%s:\n%s", want, nodeHelp)
			}
		}
		subs := map[string]map[string]bool{"server": isBool, "node": nodeBool}
		seen := map[string]bool{}
		for _, v := range variants {
			c := load(t, v.Dir)
			for _, w := range c.Workloads {
				for _, ct := range w.Template.Spec.Containers {
					if !strings.HasPrefix(ct.Image, "space:") {
						continue
					}
					where := v.Dir + " " + w.Name
					if len(ct.Args) == 0 || subs[ct.Args[0]] == nil {
						t.Errorf("%s: args %v: want server or node first", where, ct.Args)
						continue
					}
					seen[ct.Args[0]] = true
					flags := subs[ct.Args[0]]
					for name, val := range argFlags(t, ct.Args) {
						b, ok := flags[name]
						switch {
						case !ok:
							t.Errorf("%s: `space %s` has no flag --%s", where, ct.Args[0], name)
						case b && val != "" && val != "true" && val != "false":
							t.Errorf("%s: --%s is a bool flag, given %q", where, name, val)
						case !b && val == "":
							t.Errorf("%s: --%s needs a value (--%s=VALUE)", where, name, name)
						}
					}
				}
			}
		}
		if !seen["server"] || !seen["node"] {
			t.Errorf("the manifests run %v; want both space server and space node", seen)
		}
		// The Secret's DSN reaches the server and node as $SPACE_STORE, the
		// S3 credentials the node as $AWS_ACCESS_KEY_ID and
		// $AWS_SECRET_ACCESS_KEY.
		if !strings.Contains(help, "$SPACE_STORE") {
			t.Error("`space server -h` no longer says it reads $SPACE_STORE")
		}
		for _, want := range []string{"$SPACE_STORE", "$AWS_ACCESS_KEY_ID", "$AWS_SECRET_ACCESS_KEY", "$SPACE_CLUSTER_SECRET"} {
			if !strings.Contains(nodeHelp, want) {
				t.Errorf("`space node -h` no longer mentions %s", want)
			}
		}
	})
	t.Run("systemd", func(t *testing.T) {
		raw, err := os.ReadFile("../systemd/space-server.service")
		if err != nil {
			t.Fatal(err)
		}
		unit := execStarts(string(raw))
		if len(unit) != 1 || unit[0] == nil {
			t.Fatalf("space-server.service: want one ExecStart=/usr/local/bin/space server ..., have %v", unit)
		}
		flags := spaceServerArgs(t, "space-server.service", unit[0], isBool)
		// StateDirectory= and RuntimeDirectory= make what the flags name.
		for flag, dir := range map[string]string{"data-dir": "StateDirectory=space", "run-dir": "RuntimeDirectory=space"} {
			want := "/var/lib/space"
			if flag == "run-dir" {
				want = "/run/space"
			}
			if flags[flag] != want || !strings.Contains(string(raw), "\n"+dir+"\n") {
				t.Errorf("space-server.service: --%s %q does not match %s", flag, flags[flag], dir)
			}
		}
		// systemd's own check of the unit, pointed at the binary just built.
		if sa, err := exec.LookPath("systemd-analyze"); err == nil {
			tmp := filepath.Join(t.TempDir(), "space-server.service")
			unitText := strings.ReplaceAll(string(raw), "/usr/local/bin/space ", bin+" ")
			if err := os.WriteFile(tmp, []byte(unitText), 0o644); err != nil {
				t.Fatal(err)
			}
			// It reports bad settings as warnings about the file, exit 0.
			// DelegateSubgroup= (systemd 254) is unknown to an older host's
			// systemd, which ignores it, as the unit means it to.
			out, err := exec.Command(sa, "verify", tmp).CombinedOutput()
			var bad []string
			for _, l := range strings.Split(string(out), "\n") {
				if strings.Contains(l, tmp) && !strings.Contains(l, "Unknown key 'DelegateSubgroup'") {
					bad = append(bad, l)
				}
			}
			if err != nil || len(bad) > 0 {
				t.Errorf("systemd-analyze verify space-server.service: %v\n%s", err, out)
			}
		}
		env, err := os.ReadFile("../systemd/space.env.example")
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^SPACE_STORE="postgres://[^"]+"$`).Match(env) {
			t.Error("space.env.example: want a double-quoted SPACE_STORE=\"postgres://...\"")
		}
	})
	t.Run("systemd-docs", func(t *testing.T) {
		raw, err := os.ReadFile("../../docs/install-systemd.md")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range regexp.MustCompile("(?s)```ini\n(.*?)```").FindAllStringSubmatch(string(raw), -1) {
			for _, args := range execStarts(m[1]) {
				if args != nil {
					spaceServerArgs(t, "docs/install-systemd.md", args, isBool)
					n++
				}
			}
		}
		if n == 0 {
			t.Error("docs/install-systemd.md: no ExecStart= drop-in found")
		}
		keys := regexp.MustCompile(`space keys (create|list|revoke)([^\n)#]*)`).FindAllStringSubmatch(string(raw), -1)
		if len(keys) == 0 {
			t.Error("docs/install-systemd.md: no space keys command found")
		}
		for _, m := range keys {
			kb, _ := flagsOf(t, bin, "keys", m[1])
			for _, f := range strings.Fields(m[2]) {
				if name, _, _ := strings.Cut(strings.TrimLeft(f, "-"), "="); strings.HasPrefix(f, "-") {
					if _, ok := kb[name]; !ok {
						t.Errorf("docs/install-systemd.md: `space keys %s` has no flag %s", m[1], f)
					}
				}
			}
		}
	})
}

// TestProbesUseRealRoutes checks the probes' paths against the OpenAPI
// documents the control API and data plane serve (their own tests check
// the documents against the routes).
func TestProbesUseRealRoutes(t *testing.T) {
	docs := map[string]string{"control": "../../internal/api/openapi.json", "data": "../../internal/dataplane/openapi.json"}
	paths := map[string]map[string]map[string]any{}
	for port, f := range docs {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Paths map[string]map[string]any `json:"paths"`
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		paths[port] = doc.Paths
	}
	// The node RPC serves only signed requests: no probe may use it.
	for _, v := range variants {
		c := load(t, v.Dir)
		for _, name := range []string{serverName, nodeName} {
			w, ok := c.workload(name)
			if !ok {
				continue
			}
			n := 0
			for _, ct := range w.Template.Spec.Containers {
				for _, p := range []*corev1.Probe{ct.StartupProbe, ct.ReadinessProbe, ct.LivenessProbe} {
					if p == nil || p.HTTPGet == nil {
						continue
					}
					n++
					port := p.HTTPGet.Port.String()
					if paths[port] == nil {
						t.Errorf("%s %s: probe on port %s: want the control or data port", v.Dir, name, port)
					} else if _, ok := paths[port][p.HTTPGet.Path]["get"]; !ok {
						t.Errorf("%s %s: probe GET %s on port %s: no such route", v.Dir, name, p.HTTPGet.Path, port)
					}
				}
			}
			if n == 0 {
				t.Errorf("%s %s has no HTTP probes", v.Dir, name)
			}
		}
	}
}

// TestDockerfile: the image the manifests run has the entrypoint they rely
// on (the container sets args only) and ships the agent next to space.
func TestDockerfile(t *testing.T) {
	raw, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(raw)
	for _, want := range []string{`ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/space"]`, " tini ", "CGO_ENABLED=0 go build", "./cmd/space ./cmd/space-agent",
		"/out/space /out/space-agent /usr/local/bin/", "busybox-static", "mmdebstrap"} {
		if !strings.Contains(df, want) {
			t.Errorf("deploy/Dockerfile lacks %q", want)
		}
	}
}

func TestRenderJSONPatch(t *testing.T) {
	doc := func() map[string]any {
		return map[string]any{"spec": map[string]any{"env": []any{map[string]any{"name": "A", "value": "1"}}}}
	}
	d := doc()
	if err := applyOp(d, jsonOp{Op: "test", Path: "/spec/env/0/name", Value: "A"}); err != nil {
		t.Fatal(err)
	}
	if err := applyOp(d, jsonOp{Op: "replace", Path: "/spec/env/0/value", Value: "2"}); err != nil {
		t.Fatal(err)
	}
	if got := lookup(d["spec"].(map[string]any)["env"].([]any)[0], "value"); got != "2" {
		t.Fatalf("replace: value %v", got)
	}
	for _, op := range []jsonOp{
		{Op: "test", Path: "/spec/env/0/name", Value: "B"},
		{Op: "replace", Path: "/spec/env/1/value", Value: "x"},
		{Op: "replace", Path: "/spec/nope", Value: "x"},
		{Op: "remove", Path: "/spec/env/0"},
	} {
		if err := applyOp(doc(), op); err == nil {
			t.Errorf("%+v: want an error", op)
		}
	}
	if got := setImage("space:0.1.0", []imageSpec{{Name: "space", NewTag: "dev"}}); got != "space:dev" {
		t.Errorf("setImage: %s", got)
	}
	if got := setImage("localhost:5000/space", []imageSpec{{Name: "localhost:5000/space", NewName: "r/space", NewTag: "1"}}); got != "r/space:1" {
		t.Errorf("setImage with a registry port: %s", got)
	}
}

// TestRendererMatchesKustomize compares the offline renderer with real
// kustomize (`kubectl kustomize`) where kubectl is installed.
func TestRendererMatchesKustomize(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not on PATH")
	}
	for _, dir := range dirs {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, kubectl, "kustomize", dir).Output()
		cancel()
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		want := map[string]any{}
		for _, part := range splitDocs(out) {
			var m map[string]any
			if err := yaml.Unmarshal(part, &m); err != nil {
				t.Fatal(err)
			}
			if m != nil {
				want[object{Doc: m}.id()] = normalize(m)
			}
		}
		r, err := render(dir)
		if err != nil {
			t.Fatal(err)
		}
		have := map[string]any{}
		for _, o := range r.Objects {
			have[o.id()] = normalize(o.Doc)
		}
		for id, w := range want {
			if h, ok := have[id]; !ok {
				t.Errorf("%s: kustomize renders %s, the offline renderer does not", dir, id)
			} else if !reflect.DeepEqual(h, w) {
				hb, _ := json.MarshalIndent(h, "", " ")
				wb, _ := json.MarshalIndent(w, "", " ")
				t.Errorf("%s: %s differs:\noffline: %s\nkustomize: %s", dir, id, hb, wb)
			}
		}
		for id := range have {
			if _, ok := want[id]; !ok {
				t.Errorf("%s: the offline renderer has %s, kustomize does not", dir, id)
			}
		}
	}
}

// TestDocumentedOverlay builds the overlay docs/install-kind.md shows for
// other clusters (its own image, an external PostgreSQL) with real
// kustomize where kubectl is installed.
func TestDocumentedOverlay(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not on PATH")
	}
	raw, err := os.ReadFile("../../docs/install-kind.md")
	if err != nil {
		t.Fatal(err)
	}
	var k strings.Builder
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(raw), -1) {
		if strings.HasPrefix(m[1], "apiVersion: kustomize.config.k8s.io/") || strings.HasPrefix(m[1], "patches:") {
			k.WriteString(m[1])
		}
	}
	// The overlay sits next to the repository's deploy/, as the page says.
	dir := t.TempDir()
	abs, err := filepath.Abs("../../deploy")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(abs, filepath.Join(dir, "deploy")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "my-space"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "my-space", "kustomization.yaml"), []byte(k.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubectl, "kustomize", "my-space")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize (the documented overlay):\n%s\n%v\n%s", k.String(), err, out)
	}
	ids := map[string]map[string]any{}
	for _, part := range splitDocs(out) {
		var m map[string]any
		if err := yaml.Unmarshal(part, &m); err != nil {
			t.Fatal(err)
		}
		if m != nil {
			ids[object{Doc: m}.id()] = m
		}
	}
	for _, gone := range []string{"StatefulSet/space-postgres", "Service/space-postgres", "NetworkPolicy/space-postgres"} {
		if _, ok := ids[gone]; ok {
			t.Errorf("the documented overlay keeps %s", gone)
		}
	}
	for _, id := range []string{"Deployment/" + serverName, "DaemonSet/" + nodeName} {
		w, ok := ids[id]
		if !ok {
			t.Fatalf("the documented overlay lost %s", id)
		}
		cs := lookup(w, "spec", "template", "spec", "containers").([]any)
		if img := lookup(cs[0], "image"); img != "registry.example.com/space:0.1.0" {
			t.Errorf("%s: image %v", id, img)
		}
	}
	for _, name := range []string{serverName, nodeName} {
		egress, _ := lookup(ids["NetworkPolicy/"+name], "spec", "egress").([]any)
		if !strings.Contains(fmt.Sprint(egress), "10.0.0.2/32") {
			t.Errorf("the documented overlay does not let %s reach the external database", name)
		}
	}
}

// TestLocalVolume: the local overlay's PersistentVolume is bound to the
// claim the PostgreSQL StatefulSet makes for its one replica, and its
// Service has the fixed address the DSN names (no DNS on that cluster).
func TestLocalVolume(t *testing.T) {
	c := load(t, "local")
	pg, ok := c.workload("space-postgres")
	if !ok || len(pg.Claims) != 1 || len(c.Volumes) != 1 {
		t.Fatalf("want one claim of space-postgres and one PersistentVolume, have %v and %d", pg.Claims, len(c.Volumes))
	}
	ref := c.Volumes[0].Spec.ClaimRef
	if want := pg.Claims[0] + "-space-postgres-0"; ref == nil || ref.Name != want || ref.Namespace != namespace {
		t.Errorf("PersistentVolume %s is for claim %v, want %s/%s", c.Volumes[0].Name, ref, namespace, want)
	}
	for _, s := range c.Services {
		if s.Name == "space-postgres" && !strings.Contains(c.Secrets["space-db"].StringData["dsn"], "@"+s.Spec.ClusterIP+":5432/") {
			t.Errorf("space-db's DSN does not name the Service space-postgres at %s", s.Spec.ClusterIP)
		}
	}
}
