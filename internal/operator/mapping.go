package operator

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/space-sandbox/space/pkg/client"
)

// Unsupported is a field of the agent-sandbox API that SPACE cannot
// honour; the object gets a condition with reason Unsupported naming it.
type Unsupported struct{ Field, Why string }

func (u *Unsupported) Error() string { return u.Field + ": " + u.Why }

// podView is the part of a pod template SPACE maps onto a sandbox.
type podView struct {
	Image     string
	Command   []string // command + args, the pod's main process
	Env       map[string]string
	Cwd       string
	CPUMillis int64
	MemBytes  int64
}

// Pod spec and container fields: honoured ones are mapped, ignored ones
// are scheduling or kubelet details with no meaning for a SPACE sandbox,
// every other field is refused (docs/kubernetes-api.md lists them).
var (
	podHonoured = map[string]bool{"containers": true}
	podIgnored  = map[string]bool{"restartPolicy": true, "terminationGracePeriodSeconds": true,
		"nodeSelector": true, "tolerations": true, "affinity": true, "priorityClassName": true,
		"priority": true, "schedulerName": true, "runtimeClassName": true, "automountServiceAccountToken": true,
		"serviceAccountName": true, "serviceAccount": true, "enableServiceLinks": true, "dnsPolicy": true,
		"topologySpreadConstraints": true, "securityContext": true, "imagePullSecrets": true}
	ctrHonoured = map[string]bool{"name": true, "image": true, "command": true, "args": true, "env": true,
		"workingDir": true, "resources": true}
	ctrIgnored = map[string]bool{"ports": true, "imagePullPolicy": true, "readinessProbe": true,
		"livenessProbe": true, "startupProbe": true, "terminationMessagePath": true,
		"terminationMessagePolicy": true, "securityContext": true, "stdin": true, "tty": true}
)

// parsePod validates a pod template and returns what SPACE honours.
func parsePod(raw json.RawMessage) (podView, error) {
	var pv podView
	if len(raw) == 0 {
		return pv, &Unsupported{"spec.podTemplate", "required"}
	}
	var tmpl struct {
		Spec map[string]json.RawMessage `json:"spec"`
	}
	if err := json.Unmarshal(raw, &tmpl); err != nil {
		return pv, &Unsupported{"spec.podTemplate", err.Error()}
	}
	for _, k := range sortedKeys(tmpl.Spec) {
		if !podHonoured[k] && !podIgnored[k] {
			return pv, &Unsupported{"spec.podTemplate.spec." + k, "a SPACE sandbox is one isolated process tree, not a pod"}
		}
	}
	var ctrs []map[string]json.RawMessage
	if err := json.Unmarshal(tmpl.Spec["containers"], &ctrs); err != nil || len(ctrs) == 0 {
		return pv, &Unsupported{"spec.podTemplate.spec.containers", "exactly one container is required"}
	}
	if len(ctrs) > 1 {
		return pv, &Unsupported{"spec.podTemplate.spec.containers", "SPACE runs one container per sandbox; sidecars are not supported"}
	}
	c := ctrs[0]
	for _, k := range sortedKeys(c) {
		if !ctrHonoured[k] && !ctrIgnored[k] {
			return pv, &Unsupported{"spec.podTemplate.spec.containers[0]." + k, "not supported by SPACE"}
		}
	}
	var ctr struct {
		Image      string   `json:"image"`
		Command    []string `json:"command"`
		Args       []string `json:"args"`
		WorkingDir string   `json:"workingDir"`
		Env        []struct {
			Name      string          `json:"name"`
			Value     string          `json:"value"`
			ValueFrom json.RawMessage `json:"valueFrom"`
		} `json:"env"`
		Resources struct {
			Limits   map[string]string `json:"limits"`
			Requests map[string]string `json:"requests"`
		} `json:"resources"`
	}
	b, _ := json.Marshal(c)
	if err := json.Unmarshal(b, &ctr); err != nil {
		return pv, &Unsupported{"spec.podTemplate.spec.containers[0]", err.Error()}
	}
	pv.Image, pv.Cwd = ctr.Image, ctr.WorkingDir
	pv.Command = append(append([]string(nil), ctr.Command...), ctr.Args...)
	for i, e := range ctr.Env {
		if len(e.ValueFrom) > 0 {
			return pv, &Unsupported{fmt.Sprintf("spec.podTemplate.spec.containers[0].env[%d].valueFrom", i),
				"only literal values; SPACE credentials (space-sandbox.dev/network) keep secrets out of the sandbox"}
		}
		if pv.Env == nil {
			pv.Env = map[string]string{}
		}
		pv.Env[e.Name] = e.Value
	}
	// Limits bound the sandbox; a request alone is taken as the limit, as
	// SPACE reserves nothing below it.
	res := ctr.Resources.Requests
	for k, v := range ctr.Resources.Limits {
		if res == nil {
			res = map[string]string{}
		}
		res[k] = v
	}
	for _, k := range sortedKeys(res) {
		var err error
		switch k {
		case "cpu":
			pv.CPUMillis, err = parseCPU(res[k])
		case "memory":
			pv.MemBytes, err = parseBytes(res[k])
		case "ephemeral-storage":
		default:
			err = fmt.Errorf("resource %q has no SPACE equivalent", k)
		}
		if err != nil {
			return pv, &Unsupported{"spec.podTemplate.spec.containers[0].resources." + k, err.Error()}
		}
	}
	return pv, nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// parseCPU reads a Kubernetes CPU quantity ("500m", "2", "0.5") as millicores.
func parseCPU(q string) (int64, error) {
	if m, ok := strings.CutSuffix(q, "m"); ok {
		return strconv.ParseInt(m, 10, 64)
	}
	f, err := strconv.ParseFloat(q, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("bad cpu quantity %q", q)
	}
	return int64(math.Ceil(f * 1000)), nil
}

// parseBytes reads a Kubernetes memory quantity (binary and decimal SI
// suffixes, or plain bytes).
func parseBytes(q string) (int64, error) {
	mult := map[string]float64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
		"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
	for _, suf := range []string{"Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T"} {
		if n, ok := strings.CutSuffix(q, suf); ok {
			f, err := strconv.ParseFloat(n, 64)
			if err != nil || f < 0 {
				return 0, fmt.Errorf("bad memory quantity %q", q)
			}
			return int64(f * mult[suf]), nil
		}
	}
	n, err := strconv.ParseInt(q, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad memory quantity %q", q)
	}
	return n, nil
}

// templateSource is how a SPACE template is obtained for a pod template.
type templateSource struct {
	Name      string // the SPACE template name
	Existing  bool   // a template SPACE already has (space-sandbox.dev/template)
	Buildfile string // else a build file to build,
	Image     string // else an image to pull
}

// spaceTemplate picks the SPACE template: an existing one named by the
// space-sandbox.dev/template annotation, else a build of the build file
// in space-sandbox.dev/buildfile, else a build of the container image.
// Built names are content hashes, so equal sources share one build.
func spaceTemplate(annots map[string]string, pv podView) (templateSource, error) {
	if n := annots[AnnotSpaceTemplate]; n != "" {
		return templateSource{Name: n, Existing: true}, nil
	}
	if bf := annots[AnnotSpaceBuildfile]; bf != "" {
		return templateSource{Name: "k8s-bf-" + shortHash(bf), Buildfile: bf}, nil
	}
	if pv.Image == "" {
		return templateSource{}, &Unsupported{"spec.podTemplate.spec.containers[0].image", "required (or the " + AnnotSpaceTemplate + " annotation)"}
	}
	return templateSource{Name: "k8s-img-" + shortHash(pv.Image), Image: pv.Image}, nil
}

func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:6])
}

// networkPolicy maps a template's network policy onto SPACE's egress
// policy. nil tmpl (a Sandbox without a template) and Unmanaged leave the
// server's default (blocked). Managed without rules is agent-sandbox's
// secure default, public internet only: SPACE's "open" mode, which never
// reaches internal addresses. Egress rules are IP based; SPACE decides by
// name, so only "everything" (0.0.0.0/0, ::/0) and "nothing" (no rules)
// map; anything finer needs the space-sandbox.dev/network annotation (a
// SPACE NetworkPolicy in JSON), which wins over the Kubernetes rules.
func networkPolicy(tmpl *SandboxTemplate) (*client.NetworkPolicy, error) {
	if tmpl == nil {
		return nil, nil
	}
	if raw := tmpl.Metadata.Annotations[AnnotSpaceNetwork]; raw != "" {
		var np client.NetworkPolicy
		if err := json.Unmarshal([]byte(raw), &np); err != nil {
			return nil, &Unsupported{"metadata.annotations[" + AnnotSpaceNetwork + "]", "not a SPACE network policy: " + err.Error()}
		}
		return &np, nil
	}
	if tmpl.Spec.NetworkPolicyManagement == "Unmanaged" {
		return nil, nil
	}
	np := tmpl.Spec.NetworkPolicy
	if np == nil {
		return &client.NetworkPolicy{Mode: "open"}, nil
	}
	if len(np.Egress) == 0 {
		return &client.NetworkPolicy{Mode: "blocked"}, nil
	}
	for i, r := range np.Egress {
		if len(r.Ports) > 0 {
			return nil, &Unsupported{fmt.Sprintf("spec.networkPolicy.egress[%d].ports", i), "SPACE allows egress by name and port (" + AnnotSpaceNetwork + "), not by IP rule"}
		}
		for j, to := range r.To {
			if to.IPBlock == nil || (to.IPBlock.CIDR != "0.0.0.0/0" && to.IPBlock.CIDR != "::/0") {
				return nil, &Unsupported{fmt.Sprintf("spec.networkPolicy.egress[%d].to[%d]", i, j), "only ipBlock 0.0.0.0/0 or ::/0 (public internet) maps onto SPACE; use " + AnnotSpaceNetwork + " for name-based rules"}
			}
		}
	}
	return &client.NetworkPolicy{Mode: "open"}, nil
}

// sandboxEnv applies claim variables to the template's under the
// template's envVarsInjectionPolicy (default Disallowed).
func sandboxEnv(policy string, base map[string]string, add []ClaimEnvVar) (map[string]string, error) {
	if len(add) == 0 {
		return base, nil
	}
	if policy == "" || policy == "Disallowed" {
		return nil, &Unsupported{"spec.env", "the template's envVarsInjectionPolicy is Disallowed"}
	}
	out := make(map[string]string, len(base)+len(add))
	for k, v := range base {
		out[k] = v
	}
	for _, e := range add {
		if _, ok := base[e.Name]; ok && policy != "Overrides" {
			return nil, &Unsupported{"spec.env", fmt.Sprintf("%s is set by the template and envVarsInjectionPolicy is Allowed, not Overrides", e.Name)}
		}
		out[e.Name] = e.Value
	}
	return out, nil
}
