package operator

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func pod(t *testing.T, spec string) json.RawMessage {
	t.Helper()
	raw := json.RawMessage(`{"spec":` + spec + `}`)
	if !json.Valid(raw) {
		t.Fatalf("bad test JSON %s", spec)
	}
	return raw
}

func TestParsePod(t *testing.T) {
	pv, err := parsePod(pod(t, `{"restartPolicy":"Never","nodeSelector":{"a":"b"},"containers":[{"name":"m","image":"python:3.12",
		"command":["python"],"args":["-m","http.server"],"workingDir":"/srv","ports":[{"containerPort":8000}],
		"env":[{"name":"A","value":"1"}],"resources":{"requests":{"cpu":"250m"},"limits":{"cpu":"1.5","memory":"1Gi"}}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if pv.Image != "python:3.12" || strings.Join(pv.Command, " ") != "python -m http.server" || pv.Cwd != "/srv" ||
		pv.Env["A"] != "1" || pv.CPUMillis != 1500 || pv.MemBytes != 1<<30 {
		t.Fatalf("%+v", pv)
	}
	for _, tc := range []struct{ spec, field string }{
		{`{"containers":[{"name":"a","image":"x"},{"name":"b","image":"y"}]}`, "spec.podTemplate.spec.containers"},
		{`{"containers":[{"name":"a","image":"x"}],"initContainers":[{"name":"i"}]}`, "spec.podTemplate.spec.initContainers"},
		{`{"containers":[{"name":"a","image":"x"}],"volumes":[{"name":"v"}]}`, "spec.podTemplate.spec.volumes"},
		{`{"containers":[{"name":"a","image":"x","volumeMounts":[]}]}`, "spec.podTemplate.spec.containers[0].volumeMounts"},
		{`{"containers":[{"name":"a","image":"x","env":[{"name":"S","valueFrom":{"secretKeyRef":{"name":"s","key":"k"}}}]}]}`,
			"spec.podTemplate.spec.containers[0].env[0].valueFrom"},
		{`{"containers":[{"name":"a","image":"x","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}`,
			"spec.podTemplate.spec.containers[0].resources.nvidia.com/gpu"},
		{`{"containers":[]}`, "spec.podTemplate.spec.containers"},
	} {
		_, err := parsePod(pod(t, tc.spec))
		var u *Unsupported
		if !errors.As(err, &u) || u.Field != tc.field {
			t.Errorf("%s: got %v, want a refusal of %s", tc.spec, err, tc.field)
		}
	}
}

func TestQuantities(t *testing.T) {
	for q, want := range map[string]int64{"500m": 500, "2": 2000, "0.25": 250} {
		if got, err := parseCPU(q); err != nil || got != want {
			t.Errorf("cpu %s: %d %v", q, got, err)
		}
	}
	for q, want := range map[string]int64{"128Mi": 128 << 20, "1G": 1e9, "1024": 1024, "1.5Gi": 3 << 29} {
		if got, err := parseBytes(q); err != nil || got != want {
			t.Errorf("memory %s: %d %v", q, got, err)
		}
	}
	if _, err := parseBytes("lots"); err == nil {
		t.Error("bad memory quantity accepted")
	}
}

func TestNetworkPolicy(t *testing.T) {
	tmpl := func(mgmt, np string, annot string) *SandboxTemplate {
		tp := &SandboxTemplate{}
		tp.Spec.NetworkPolicyManagement = mgmt
		if np != "" {
			if err := json.Unmarshal([]byte(np), &tp.Spec.NetworkPolicy); err != nil {
				t.Fatal(err)
			}
		}
		if annot != "" {
			tp.Metadata.Annotations = map[string]string{AnnotSpaceNetwork: annot}
		}
		return tp
	}
	for _, tc := range []struct {
		name string
		tmpl *SandboxTemplate
		mode string // "" = server default; "!" = refused
	}{
		{"no template", nil, ""},
		{"unmanaged", tmpl("Unmanaged", "", ""), ""},
		{"managed default", tmpl("Managed", "", ""), "open"},
		{"no egress rules", tmpl("", `{"ingress":[{}]}`, ""), "blocked"},
		{"everything", tmpl("", `{"egress":[{"to":[{"ipBlock":{"cidr":"0.0.0.0/0","except":["10.0.0.0/8"]}}]}]}`, ""), "open"},
		{"a CIDR", tmpl("", `{"egress":[{"to":[{"ipBlock":{"cidr":"203.0.113.0/24"}}]}]}`, ""), "!"},
		{"ports", tmpl("", `{"egress":[{"ports":[{"port":443}]}]}`, ""), "!"},
		{"pod selector", tmpl("", `{"egress":[{"to":[{"podSelector":{}}]}]}`, ""), "!"},
		{"annotation wins", tmpl("", `{"egress":[{"ports":[{"port":443}]}]}`, `{"mode":"allowlist","allow":["pypi.org"]}`), "allowlist"},
	} {
		np, err := networkPolicy(tc.tmpl)
		switch {
		case tc.mode == "!":
			var u *Unsupported
			if !errors.As(err, &u) {
				t.Errorf("%s: got %v, want a refusal", tc.name, err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.mode == "" && np != nil, tc.mode != "" && (np == nil || np.Mode != tc.mode):
			t.Errorf("%s: got %+v, want mode %q", tc.name, np, tc.mode)
		}
	}
}

func TestSandboxEnv(t *testing.T) {
	base := map[string]string{"A": "1"}
	if _, err := sandboxEnv("", base, []ClaimEnvVar{{Name: "B", Value: "2"}}); err == nil {
		t.Error("Disallowed (the default) accepted env")
	}
	if _, err := sandboxEnv("Allowed", base, []ClaimEnvVar{{Name: "A", Value: "2"}}); err == nil {
		t.Error("Allowed let a claim override a template variable")
	}
	env, err := sandboxEnv("Overrides", base, []ClaimEnvVar{{Name: "A", Value: "2"}, {Name: "B", Value: "3"}})
	if err != nil || env["A"] != "2" || env["B"] != "3" || base["A"] != "1" {
		t.Errorf("%v %v (base %v)", env, err, base)
	}
	raw, err := withEnv(pod(t, `{"containers":[{"name":"m","image":"x","env":[{"name":"A","value":"1"},{"name":"K","value":"k"}]}]}`),
		[]ClaimEnvVar{{Name: "A", Value: "2"}})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := parsePod(raw)
	if err != nil || pv.Env["A"] != "2" || pv.Env["K"] != "k" {
		t.Errorf("withEnv: %+v %v", pv, err)
	}
}

func TestSpaceTemplate(t *testing.T) {
	a, _ := spaceTemplate(nil, podView{Image: "python:3.12"})
	b, _ := spaceTemplate(map[string]string{"other": "x"}, podView{Image: "python:3.12"})
	if a.Name != b.Name || a.Image != "python:3.12" || !strings.HasPrefix(a.Name, "k8s-img-") {
		t.Errorf("image: %+v %+v", a, b)
	}
	if s, _ := spaceTemplate(map[string]string{AnnotSpaceTemplate: "base", AnnotSpaceBuildfile: "FROM x"}, podView{}); !s.Existing || s.Name != "base" {
		t.Errorf("annotation: %+v", s)
	}
	if s, _ := spaceTemplate(map[string]string{AnnotSpaceBuildfile: "FROM debian\nRUN true\n"}, podView{}); s.Buildfile == "" || !strings.HasPrefix(s.Name, "k8s-bf-") {
		t.Errorf("buildfile: %+v", s)
	}
	if _, err := spaceTemplate(nil, podView{}); err == nil {
		t.Error("no image and no annotation accepted")
	}
}

func TestConditions(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	conds := setCondition(nil, Condition{Type: CondReady, Status: "False", Reason: "A"}, t0)
	conds = setCondition(conds, Condition{Type: CondReady, Status: "False", Reason: "B"}, t0.Add(time.Hour))
	if !conds[0].LastTransitionTime.Equal(t0) || conds[0].Reason != "B" {
		t.Errorf("same status moved the transition time: %+v", conds)
	}
	next := setCondition(conds, Condition{Type: CondReady, Status: "True", Reason: "C"}, t0.Add(2*time.Hour))
	if !next[0].LastTransitionTime.Equal(t0.Add(2*time.Hour)) || sameConditions(next, conds) {
		t.Errorf("transition: %+v", next)
	}
	if !sameConditions(conds, setCondition(conds, conds[0], t0.Add(5*time.Hour))) {
		t.Error("an unchanged condition compared different")
	}
}

func TestQueue(t *testing.T) {
	q := newQueue()
	q.add("a")
	q.add("a")
	q.add("b")
	k, _ := q.get()
	if k != "a" {
		t.Fatalf("got %s", k)
	}
	q.add("a") // while processing: handed out again after done
	k2, _ := q.get()
	if k2 != "b" {
		t.Fatalf("a key was handed out twice at once (got %s)", k2)
	}
	q.done("a")
	q.done("b")
	k3, _ := q.get()
	if k3 != "a" {
		t.Fatalf("re-added key lost (got %s)", k3)
	}
	q.close()
	if _, ok := q.get(); ok {
		t.Fatal("get after close")
	}
}

func TestKubeconfig(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "config")
	os.WriteFile(filepath.Join(dir, "tok"), []byte("secret-token\n"), 0o600)
	kc := `apiVersion: v1
kind: Config
current-context: b
clusters:
- {name: ca, cluster: {server: "https://a.example:6443"}}
- {name: cb, cluster: {server: "https://b.example:6443/", insecure-skip-tls-verify: true}}
users:
- {name: ua, user: {token: nope}}
- {name: ub, user: {tokenFile: ` + filepath.Join(dir, "tok") + `}}
contexts:
- {name: a, context: {cluster: ca, user: ua}}
- {name: b, context: {cluster: cb, user: ub}}
`
	if err := os.WriteFile(p, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := NewKube(p)
	if err != nil {
		t.Fatal(err)
	}
	if k.base != "https://b.example:6443" || k.token != "secret-token" {
		t.Fatalf("%s %q", k.base, k.token)
	}
	if got := ResClaim.Path("ns", "c", "status"); got != "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/ns/sandboxclaims/c/status" {
		t.Fatal(got)
	}
	if got := ResSecret.Path("ns", "", ""); got != "/api/v1/namespaces/ns/secrets" {
		t.Fatal(got)
	}
}

// Background keys wait behind the others and take at most lowMax workers.
func TestQueuePriority(t *testing.T) {
	q := newQueue()
	q.low, q.lowMax = func(k string) bool { return strings.HasPrefix(k, "low") }, 1
	q.add("low1")
	q.add("low2")
	q.add("high")
	if k, _ := q.get(); k != "high" {
		t.Fatalf("got %s first", k)
	}
	if k, _ := q.get(); k != "low1" {
		t.Fatalf("got %s", k)
	}
	got := make(chan string, 1)
	go func() { k, _ := q.get(); got <- k }()
	select {
	case k := <-got:
		t.Fatalf("%s handed out while low1 held the one background worker", k)
	case <-time.After(50 * time.Millisecond):
	}
	q.done("low1")
	select {
	case k := <-got:
		if k != "low2" {
			t.Fatalf("got %s", k)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("low2 not handed out after low1 was done")
	}
	q.close()
}
