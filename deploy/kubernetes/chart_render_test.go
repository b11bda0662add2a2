package kubernetes_test

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"text/template"

	"sigs.k8s.io/yaml"
)

// This file renders the Helm chart (deploy/helm/space) offline with
// text/template and the handful of Helm's functions the chart uses
// (include, toYaml, nindent, indent, quote, default, required, fail, join,
// dict). A template calling anything else fails to parse, so the chart
// cannot drift beyond what this renderer checks; TestChartMatchesHelm
// compares it with the real helm where scripts/k8s.sh has built one.

// chartDir is the chart, relative to this package.
const chartDir = "../helm/space"

// chartMeta is Chart.yaml (apiVersion v2), decoded strictly.
type chartMeta struct {
	APIVersion  string `json:"apiVersion"`
	Name        string `json:"name"`
	Description string `json:"description"`
	Type        string `json:"type"`
	Version     string `json:"version"`
	AppVersion  string `json:"appVersion"`
	KubeVersion string `json:"kubeVersion"`
	Home        string `json:"home"`
}

// chartValues reads values.yaml and merges the overrides over it, as
// `helm -f overrides.yaml` does (maps merge, everything else replaces).
func chartValues(overrides map[string]any) (map[string]any, error) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		return nil, err
	}
	var vals map[string]any
	if err := yaml.UnmarshalStrict(raw, &vals); err != nil {
		return nil, fmt.Errorf("values.yaml: %w", err)
	}
	// A round trip through YAML gives the overrides the types helm reads
	// from a values file (numbers are float64).
	b, err := yaml.Marshal(overrides)
	if err != nil {
		return nil, err
	}
	var ov map[string]any
	if err := yaml.Unmarshal(b, &ov); err != nil {
		return nil, err
	}
	mergeValues(vals, ov)
	return vals, nil
}

func mergeValues(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergeValues(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// renderChart renders every template of the chart for a release named
// release in namespace ns. Objects carry their template's path as Source.
func renderChart(release, ns string, overrides map[string]any) ([]object, error) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return nil, err
	}
	var meta chartMeta
	if err := yaml.UnmarshalStrict(raw, &meta); err != nil {
		return nil, fmt.Errorf("Chart.yaml: %w", err)
	}
	vals, err := chartValues(overrides)
	if err != nil {
		return nil, err
	}
	var files []string
	err = filepath.WalkDir(filepath.Join(chartDir, "templates"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(files)
	root := template.New("chart").Option("missingkey=error")
	root.Funcs(chartFuncs(root))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		name := meta.Name + "/" + strings.TrimPrefix(filepath.ToSlash(f), filepath.ToSlash(chartDir)+"/")
		if _, err := root.New(name).Parse(string(b)); err != nil {
			return nil, err
		}
	}
	var out []object
	for _, f := range files {
		base := filepath.Base(f)
		if strings.HasPrefix(base, "_") || !(strings.HasSuffix(base, ".yaml") || strings.HasSuffix(base, ".yml")) {
			continue
		}
		name := meta.Name + "/" + strings.TrimPrefix(filepath.ToSlash(f), filepath.ToSlash(chartDir)+"/")
		data := map[string]any{
			"Values":   vals,
			"Release":  map[string]any{"Name": release, "Namespace": ns, "Service": "Helm", "IsInstall": true, "IsUpgrade": false, "Revision": 1},
			"Chart":    map[string]any{"Name": meta.Name, "Version": meta.Version, "AppVersion": meta.AppVersion},
			"Template": map[string]any{"Name": name, "BasePath": meta.Name + "/templates"},
		}
		var b strings.Builder
		if err := root.ExecuteTemplate(&b, name, data); err != nil {
			return nil, err
		}
		for i, part := range splitDocs([]byte(b.String())) {
			if len(strings.TrimSpace(string(stripComments(part)))) == 0 {
				continue
			}
			var m map[string]any
			if err := yaml.UnmarshalStrict(part, &m); err != nil {
				return nil, fmt.Errorf("%s: document %d: %w\n%s", name, i+1, err, part)
			}
			if _, ok := m["metadata"].(map[string]any); !ok {
				return nil, fmt.Errorf("%s: document %d has no metadata", name, i+1)
			}
			out = append(out, object{Source: name, Doc: m})
		}
	}
	return out, nil
}

// chartFuncs are Helm's functions the chart may use, with Helm's (sprig's)
// meaning.
func chartFuncs(root *template.Template) template.FuncMap {
	return template.FuncMap{
		"include": func(name string, data any) (string, error) {
			var b strings.Builder
			err := root.ExecuteTemplate(&b, name, data)
			return b.String(), err
		},
		"toYaml": func(v any) string {
			b, err := yaml.Marshal(v)
			if err != nil {
				return "" // as helm's toYaml
			}
			return strings.TrimSuffix(string(b), "\n")
		},
		"indent": func(n int, s string) string {
			pad := strings.Repeat(" ", n)
			return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
		},
		"nindent": func(n int, s string) string {
			pad := strings.Repeat(" ", n)
			return "\n" + pad + strings.ReplaceAll(s, "\n", "\n"+pad)
		},
		"quote": func(args ...any) string {
			var out []string
			for _, a := range args {
				if a != nil {
					out = append(out, fmt.Sprintf("%q", fmt.Sprint(a)))
				}
			}
			return strings.Join(out, " ")
		},
		"default": func(d any, given ...any) any {
			if len(given) == 0 || isEmpty(given[0]) {
				return d
			}
			return given[0]
		},
		"required": func(msg string, v any) (any, error) {
			if v == nil || v == "" {
				return nil, errors.New(msg)
			}
			return v, nil
		},
		"fail": func(msg string) (string, error) { return "", errors.New(msg) },
		"join": func(sep string, list []any) string {
			s := make([]string, len(list))
			for i, v := range list {
				s[i] = fmt.Sprint(v)
			}
			return strings.Join(s, sep)
		},
		"dict": func(kv ...any) (map[string]any, error) {
			if len(kv)%2 != 0 {
				return nil, errors.New("dict: odd number of arguments")
			}
			m := map[string]any{}
			for i := 0; i < len(kv); i += 2 {
				m[fmt.Sprint(kv[i])] = kv[i+1]
			}
			return m, nil
		},
	}
}

// isEmpty is sprig's empty: nil, zero values and empty collections.
func isEmpty(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Map, reflect.Slice, reflect.Array, reflect.String:
		return rv.Len() == 0
	}
	return rv.IsZero()
}

// helmLabels are the labels the chart adds to every object's metadata
// beyond the kustomize layouts' (never to pod templates or selectors).
var helmLabels = []string{"app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart"}

// isHook reports whether a chart object is a Helm hook (helm test's).
func isHook(o object) bool {
	an, _ := lookup(o.Doc, "metadata", "annotations").(map[string]any)
	_, ok := an["helm.sh/hook"]
	return ok
}

// withoutHelmLabels is a normalized copy of an object without helmLabels.
func withoutHelmLabels(o object) map[string]any {
	m := normalize(o.Doc).(map[string]any)
	if ls, ok := lookup(m, "metadata", "labels").(map[string]any); ok {
		for _, l := range helmLabels {
			delete(ls, l)
		}
	}
	return m
}

// byID indexes normalized objects by kind/name.
func byID(objs []object, f func(object) map[string]any) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, o := range objs {
		out[o.id()] = f(o)
	}
	return out
}

// sortedKeys lists a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
