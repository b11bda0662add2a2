package kubernetes_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// This file renders a kustomization offline: the subset of kustomize the
// manifests use (resources, namespace, labels, images, JSON 6902 patches
// from files). A kustomization.yaml using anything else fails to decode, so
// the manifests cannot drift beyond what this renderer checks.

// kustomization is the part of kustomize.config.k8s.io/v1beta1 we use.
type kustomization struct {
	APIVersion string      `json:"apiVersion"`
	Kind       string      `json:"kind"`
	Namespace  string      `json:"namespace,omitempty"`
	Labels     []labelSpec `json:"labels,omitempty"`
	Resources  []string    `json:"resources,omitempty"`
	Images     []imageSpec `json:"images,omitempty"`
	Patches    []patchSpec `json:"patches,omitempty"`
}

type labelSpec struct {
	Pairs            map[string]string `json:"pairs"`
	IncludeSelectors bool              `json:"includeSelectors"`
	IncludeTemplates bool              `json:"includeTemplates"`
}

type imageSpec struct {
	Name    string `json:"name"`
	NewName string `json:"newName,omitempty"`
	NewTag  string `json:"newTag,omitempty"`
}

type patchSpec struct {
	Path   string `json:"path"`
	Target struct {
		Group   string `json:"group,omitempty"`
		Version string `json:"version,omitempty"`
		Kind    string `json:"kind"`
		Name    string `json:"name"`
	} `json:"target"`
}

// jsonOp is one RFC 6902 operation; only test, replace and add are used.
type jsonOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// object is one rendered Kubernetes object, with the file it came from.
type object struct {
	Source string
	Doc    map[string]any
}

func (o object) kind() string { s, _ := o.Doc["kind"].(string); return s }
func (o object) apiVersion() string {
	s, _ := o.Doc["apiVersion"].(string)
	return s
}
func (o object) name() string {
	m, _ := o.Doc["metadata"].(map[string]any)
	s, _ := m["name"].(string)
	return s
}
func (o object) id() string { return o.kind() + "/" + o.name() }

// clusterScoped are the kinds the namespace transformer leaves alone.
var clusterScoped = map[string]bool{"Namespace": true, "ClusterRole": true, "ClusterRoleBinding": true,
	"CustomResourceDefinition": true, "PersistentVolume": true, "StorageClass": true}

// rendered is a kustomization's output and the files it used.
type rendered struct {
	Objects []object
	Used    map[string]bool // absolute paths of files read (kustomization, resources, patches)
}

// render builds the kustomization in dir.
func render(dir string) (*rendered, error) {
	out := &rendered{Used: map[string]bool{}}
	if err := out.build(dir); err != nil {
		return nil, err
	}
	return out, nil
}

func (r *rendered) build(dir string) error {
	kpath := filepath.Join(dir, "kustomization.yaml")
	raw, err := os.ReadFile(kpath)
	if err != nil {
		return fmt.Errorf("read kustomization: %w", err)
	}
	r.Used[kpath] = true
	var k kustomization
	if err := yaml.UnmarshalStrict(raw, &k); err != nil {
		return fmt.Errorf("%s: %w (only resources, namespace, labels, images and patches are supported)", kpath, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		return fmt.Errorf("%s: apiVersion/kind %q/%q", kpath, k.APIVersion, k.Kind)
	}
	var objs []object
	for _, res := range k.Resources {
		p := filepath.Join(dir, res)
		st, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("%s: resource %s: %w", kpath, res, err)
		}
		if st.IsDir() {
			sub := &rendered{Used: r.Used}
			if err := sub.build(p); err != nil {
				return err
			}
			objs = append(objs, sub.Objects...)
			continue
		}
		docs, err := readDocs(p)
		if err != nil {
			return err
		}
		r.Used[p] = true
		for _, d := range docs {
			objs = append(objs, object{Source: p, Doc: d})
		}
	}
	for _, ps := range k.Patches {
		p := filepath.Join(dir, ps.Path)
		raw, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("%s: patch: %w", kpath, err)
		}
		r.Used[p] = true
		var ops []jsonOp
		if err := yaml.UnmarshalStrict(raw, &ops); err != nil {
			return fmt.Errorf("%s: only JSON 6902 patches are supported: %w", p, err)
		}
		n := 0
		for _, o := range objs {
			if o.kind() != ps.Target.Kind || o.name() != ps.Target.Name {
				continue
			}
			if gv := strings.Trim(ps.Target.Group+"/"+ps.Target.Version, "/"); ps.Target.Version != "" && o.apiVersion() != gv {
				continue
			}
			n++
			for _, op := range ops {
				if err := applyOp(o.Doc, op); err != nil {
					return fmt.Errorf("%s on %s: %w", p, o.id(), err)
				}
			}
		}
		if n != 1 {
			return fmt.Errorf("%s: target %s/%s matched %d objects, want 1", p, ps.Target.Kind, ps.Target.Name, n)
		}
	}
	for _, o := range objs {
		md := o.Doc["metadata"].(map[string]any)
		if k.Namespace != "" && !clusterScoped[o.kind()] {
			md["namespace"] = k.Namespace
		}
		for _, l := range k.Labels {
			if l.IncludeSelectors {
				return fmt.Errorf("%s: labels.includeSelectors is not supported (selectors are immutable)", kpath)
			}
			addLabels(md, l.Pairs)
			if l.IncludeTemplates {
				if tmd, ok := lookup(o.Doc, "spec", "template", "metadata").(map[string]any); ok {
					addLabels(tmd, l.Pairs)
				}
				vcts, _ := lookup(o.Doc, "spec", "volumeClaimTemplates").([]any)
				for _, vct := range vcts {
					if vmd, ok := lookup(vct, "metadata").(map[string]any); ok {
						addLabels(vmd, l.Pairs)
					}
				}
			}
		}
		if len(k.Images) > 0 {
			if ps, ok := lookup(o.Doc, "spec", "template", "spec").(map[string]any); ok {
				for _, field := range []string{"initContainers", "containers"} {
					cs, _ := ps[field].([]any)
					for _, c := range cs {
						cm := c.(map[string]any)
						if img, ok := cm["image"].(string); ok {
							cm["image"] = setImage(img, k.Images)
						}
					}
				}
			}
		}
	}
	r.Objects = append(r.Objects, objs...)
	return nil
}

// readDocs splits a multi-document YAML file and decodes each document
// strictly (duplicate keys fail) into a generic map.
func readDocs(path string) ([]map[string]any, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for i, part := range splitDocs(raw) {
		if len(bytes.TrimSpace(stripComments(part))) == 0 {
			continue
		}
		var m map[string]any
		if err := yaml.UnmarshalStrict(part, &m); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i+1, err)
		}
		if _, ok := m["metadata"].(map[string]any); !ok {
			return nil, fmt.Errorf("%s: document %d has no metadata", path, i+1)
		}
		out = append(out, m)
	}
	return out, nil
}

func splitDocs(raw []byte) [][]byte {
	var out [][]byte
	var cur []byte
	for _, line := range bytes.SplitAfter(raw, []byte("\n")) {
		if bytes.Equal(bytes.TrimRight(line, " \r\n"), []byte("---")) {
			out = append(out, cur)
			cur = nil
			continue
		}
		cur = append(cur, line...)
	}
	return append(out, cur)
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.SplitAfter(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line...)
		}
	}
	return out
}

func addLabels(md map[string]any, pairs map[string]string) {
	ls, _ := md["labels"].(map[string]any)
	if ls == nil {
		ls = map[string]any{}
		md["labels"] = ls
	}
	for k, v := range pairs {
		ls[k] = v
	}
}

// setImage applies kustomize's images transformer to one image reference.
func setImage(img string, specs []imageSpec) string {
	name, tag := img, ""
	if i := strings.LastIndex(img, ":"); i > strings.LastIndex(img, "/") {
		name, tag = img[:i], img[i:]
	}
	for _, s := range specs {
		if s.Name != name {
			continue
		}
		if s.NewName != "" {
			name = s.NewName
		}
		if s.NewTag != "" {
			tag = ":" + s.NewTag
		}
	}
	return name + tag
}

func lookup(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

// applyOp applies one JSON 6902 operation in place.
func applyOp(doc map[string]any, op jsonOp) error {
	if !strings.HasPrefix(op.Path, "/") {
		return fmt.Errorf("path %q: not a JSON pointer", op.Path)
	}
	parts := strings.Split(op.Path[1:], "/")
	for i, p := range parts {
		parts[i] = strings.NewReplacer("~1", "/", "~0", "~").Replace(p)
	}
	var parent any = doc
	for _, p := range parts[:len(parts)-1] {
		next, err := child(parent, p)
		if err != nil {
			return fmt.Errorf("%s %s: %w", op.Op, op.Path, err)
		}
		parent = next
	}
	last := parts[len(parts)-1]
	switch op.Op {
	case "test":
		cur, err := child(parent, last)
		if err != nil {
			return fmt.Errorf("test %s: %w", op.Path, err)
		}
		if !reflect.DeepEqual(normalize(cur), normalize(op.Value)) {
			return fmt.Errorf("test %s: have %v, want %v", op.Path, cur, op.Value)
		}
		return nil
	case "replace", "add":
		switch p := parent.(type) {
		case map[string]any:
			if _, ok := p[last]; !ok && op.Op == "replace" {
				return fmt.Errorf("replace %s: no such member", op.Path)
			}
			p[last] = op.Value
		case []any:
			i, err := strconv.Atoi(last)
			if err != nil || i < 0 || i >= len(p) {
				// Appending would change the slice header held by the
				// parent; the manifests never need it.
				return fmt.Errorf("%s %s: index %q out of range", op.Op, op.Path, last)
			}
			if op.Op == "add" {
				return fmt.Errorf("add %s: inserting into a list is not supported", op.Path)
			}
			p[i] = op.Value
		default:
			return fmt.Errorf("%s %s: parent is not a container", op.Op, op.Path)
		}
		return nil
	}
	return fmt.Errorf("op %q is not supported", op.Op)
}

func child(v any, key string) (any, error) {
	switch c := v.(type) {
	case map[string]any:
		next, ok := c[key]
		if !ok {
			return nil, fmt.Errorf("no member %q", key)
		}
		return next, nil
	case []any:
		i, err := strconv.Atoi(key)
		if err != nil || i < 0 || i >= len(c) {
			return nil, fmt.Errorf("index %q out of range", key)
		}
		return c[i], nil
	}
	return nil, fmt.Errorf("%q: not a container", key)
}

func normalize(v any) any {
	b, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// decodeStrict decodes a rendered object into its API type, refusing any
// field the type does not have.
func decodeStrict(o object, into any) error {
	b, err := json.Marshal(o.Doc)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("%s (%s): %w", o.id(), o.Source, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: trailing data", o.id())
	}
	return nil
}

// yamlFiles lists the .yaml files directly in dir.
func yamlFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() && (strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	slices.Sort(out)
	return out, nil
}
