package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"
)

// poolMembers are the pool's unclaimed Sandboxes (label, not reserved by
// a claim, not being deleted), ready ones first. Called with o.mu held.
func (o *Operator) poolMembers(ns, pool string) []*Sandbox {
	label := poolLabel(pool)
	var out []*Sandbox
	for k, sb := range o.sandboxes {
		if o.unclaimed(k, sb, ns, label) {
			out = append(out, sb)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		ri, rj := isReady(out[i]), isReady(out[j])
		if ri != rj {
			return ri
		}
		return out[i].Metadata.Name < out[j].Metadata.Name
	})
	return out
}

// unclaimed: sb (key k) is a member of the pool labelled label in ns
// that no claim holds. Called with o.mu held.
func (o *Operator) unclaimed(k string, sb *Sandbox, ns, label string) bool {
	return sb.Metadata.Namespace == ns && sb.Metadata.Labels[LabelWarmPool] == label &&
		sb.Metadata.DeletionTimestamp == nil && o.reserved[k] == ""
}

func isReady(sb *Sandbox) bool {
	c := findCondition(sb.Status.Conditions, CondReady)
	return c != nil && c.Status == "True"
}

// reconcilePool keeps spec.replicas unclaimed Sandboxes of the pool's
// template, each backed by a running SPACE sandbox, and reports them.
func (o *Operator) reconcilePool(ctx context.Context, ns, name string) (time.Duration, error) {
	o.mu.Lock()
	p := o.pools[ns+"/"+name]
	var members []*Sandbox
	if p != nil {
		members = o.poolMembers(ns, name)
	}
	o.mu.Unlock()
	if p == nil {
		return 0, nil
	}
	if p.Metadata.DeletionTimestamp != nil {
		if !hasFinalizer(p.Metadata) {
			return 0, nil
		}
		// Unclaimed sandboxes go with the pool (the garbage collector does
		// the same through their owner reference; this does not wait for it).
		for _, sb := range members {
			if err := o.kube.Delete(ctx, ResSandbox, ns, sb.Metadata.Name); err != nil {
				return 0, err
			}
		}
		err := o.kube.MergePatch(ctx, ResWarmPool, ns, name, "", map[string]any{"metadata": map[string]any{
			"resourceVersion": p.Metadata.ResourceVersion, "finalizers": withoutFinalizer(p.Metadata.Finalizers)}}, nil)
		if IsNotFound(err) {
			return 0, nil
		}
		if IsConflict(err) {
			return time.Second, nil
		}
		return 0, err
	}
	if !hasFinalizer(p.Metadata) {
		var out SandboxWarmPool
		err := o.kube.MergePatch(ctx, ResWarmPool, ns, name, "", map[string]any{"metadata": map[string]any{
			"resourceVersion": p.Metadata.ResourceVersion, "finalizers": withFinalizer(p.Metadata.Finalizers)}}, &out)
		if err != nil {
			return 0, fmt.Errorf("pool finalizer: %w", err)
		}
		o.put(ResWarmPool, &out)
		p = &out
	}
	want := int32(1)
	if p.Spec.Replicas != nil {
		want = *p.Spec.Replicas
	}
	tmpl := o.templateFor(ns, p.Spec.TemplateRef.Name)
	if tmpl != nil {
		for n := int32(len(members)); n < want; n++ {
			sb, err := o.newPoolSandbox(ctx, p, tmpl)
			if err != nil {
				return 0, err
			}
			members = append(members, sb)
		}
	}
	// Surplus: unready ones first (members are sorted ready first).
	for i := len(members) - 1; i >= 0 && int32(len(members)) > want; i-- {
		if err := o.kube.Delete(ctx, ResSandbox, ns, members[i].Metadata.Name); err != nil {
			return 0, err
		}
		members = members[:i]
	}
	st := WarmPoolStatus{Replicas: int32(len(members)), Selector: LabelWarmPool + "=" + poolLabel(name),
		ObservedGeneration: p.Metadata.Generation}
	for _, sb := range members {
		if isReady(sb) {
			st.ReadyReplicas++
		}
	}
	if st == p.Status {
		return 0, nil
	}
	var out SandboxWarmPool
	if err := o.kube.MergePatch(ctx, ResWarmPool, ns, name, "status", map[string]any{"status": st}, &out); err != nil {
		if IsNotFound(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("pool status: %w", err)
	}
	o.put(ResWarmPool, &out)
	return 0, nil
}

// newPoolSandbox creates one Sandbox of the pool from its template.
func (o *Operator) newPoolSandbox(ctx context.Context, p *SandboxWarmPool, tmpl *SandboxTemplate) (*Sandbox, error) {
	annots := spaceAnnotations(tmpl.Metadata.Annotations)
	annots[AnnotTemplateRef] = tmpl.Metadata.Name
	sb := map[string]any{"apiVersion": APIGroup + "/" + Version, "kind": "Sandbox",
		"metadata": map[string]any{"generateName": p.Metadata.Name + "-", "namespace": p.Metadata.Namespace,
			"labels":          map[string]string{LabelWarmPool: poolLabel(p.Metadata.Name), LabelLaunchType: "warm"},
			"annotations":     annots,
			"ownerReferences": []OwnerReference{ownerRef("SandboxWarmPool", ExtGroup, p.Metadata)}},
		"spec": blueprint(tmpl, tmpl.Spec.PodTemplate)}
	var out Sandbox
	if err := o.kube.Create(ctx, ResSandbox, p.Metadata.Namespace, sb, &out); err != nil {
		return nil, fmt.Errorf("create pool sandbox: %w", err)
	}
	o.put(ResSandbox, &out)
	return &out, nil
}

// blueprint is a Sandbox spec from a template, with podTemplate replaced
// (a claim's env goes into it).
func blueprint(tmpl *SandboxTemplate, pod json.RawMessage) map[string]any {
	spec := map[string]any{"podTemplate": pod}
	if len(tmpl.Spec.VolumeClaimTemplates) > 0 {
		spec["volumeClaimTemplates"] = tmpl.Spec.VolumeClaimTemplates
	}
	if tmpl.Spec.Service != nil {
		spec["service"] = *tmpl.Spec.Service
	}
	return spec
}
