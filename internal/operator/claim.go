package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// reconcileClaim gives a claim a Sandbox: an unclaimed one of its warm
// pool (adopted: the pool label goes, the claim becomes its owner) or,
// when the pool has none or the claim sets env, a new one named like the
// claim. The choice is written on the claim (agents.x-k8s.io/sandbox-name)
// before the Sandbox is touched, so a restarted operator finishes it.
// The claim's Ready mirrors its Sandbox's; shutdownTime and shutdownPolicy
// expire it; deleting it deletes the Sandbox (and so the SPACE sandbox).
func (o *Operator) reconcileClaim(ctx context.Context, ns, name string) (time.Duration, error) {
	key := ns + "/" + name
	o.mu.Lock()
	c := o.claims[key]
	var pool *SandboxWarmPool
	var tmpl *SandboxTemplate
	if c != nil {
		pool = o.pools[ns+"/"+c.Spec.WarmPoolRef.Name]
		if pool != nil {
			tmpl = o.templates[ns+"/"+pool.Spec.TemplateRef.Name]
		}
	}
	o.mu.Unlock()
	if c == nil {
		o.release(key)
		return 0, nil
	}
	assigned := c.Metadata.Annotations[AnnotClaimSandbox]
	if c.Metadata.DeletionTimestamp != nil {
		return 0, o.finalizeClaim(ctx, c, assigned)
	}
	if lc := c.Spec.Lifecycle; lc != nil && lc.ShutdownTime != nil && !time.Now().Before(*lc.ShutdownTime) {
		return 0, o.expireClaim(ctx, c, assigned)
	}
	if assigned == "" {
		if pool == nil {
			return 0, o.claimStatus(ctx, c, "", notReady("WarmPoolNotFound", "no SandboxWarmPool "+c.Spec.WarmPoolRef.Name))
		}
		if tmpl == nil {
			return 0, o.claimStatus(ctx, c, "", notReady("TemplateNotFound", "no SandboxTemplate "+pool.Spec.TemplateRef.Name))
		}
		// Reasons as agent-sandbox's controller gives them, which its
		// Python client treats as terminal.
		if len(c.Spec.VolumeClaimTemplates) > 0 {
			return 0, o.claimStatus(ctx, c, "", notReady("VolumeClaimTemplatesError", "SPACE cannot honour spec.volumeClaimTemplates: SPACE sandboxes have no persistent volume claims"))
		}
		pv, err := parsePod(tmpl.Spec.PodTemplate)
		if err != nil {
			return 0, o.claimStatus(ctx, c, "", notReady("Unsupported", message(err)))
		}
		if _, err := sandboxEnv(tmpl.Spec.EnvVarsInjectionPolicy, pv.Env, c.Spec.Env); err != nil {
			return 0, o.claimStatus(ctx, c, "", notReady("EnvVarsInjectionRejected", message(err)))
		}
		// Env is baked into a sandbox at create: a claim with env starts cold.
		target := ""
		if len(c.Spec.Env) == 0 {
			target = o.reserveWarm(ns, pool.Metadata.Name, key)
		}
		if target == "" {
			target = c.Metadata.Name
		}
		var out SandboxClaim
		err = o.kube.MergePatch(ctx, ResClaim, ns, name, "", map[string]any{"metadata": map[string]any{
			"resourceVersion": c.Metadata.ResourceVersion, "finalizers": withFinalizer(c.Metadata.Finalizers),
			"annotations": map[string]string{AnnotClaimSandbox: target}}}, &out)
		if err != nil {
			o.release(key)
			if IsConflict(err) {
				return time.Millisecond, nil
			}
			return 0, fmt.Errorf("record sandbox of claim: %w", err)
		}
		o.mu.Lock()
		o.reserved[ns+"/"+target] = key
		o.mu.Unlock()
		o.put(ResClaim, &out)
		c, assigned = &out, target
	}
	o.mu.Lock()
	sb := o.sandboxes[ns+"/"+assigned]
	o.mu.Unlock()
	switch {
	case sb == nil && assigned == c.Metadata.Name:
		if tmpl == nil {
			return 0, o.claimStatus(ctx, c, assigned, notReady("TemplateNotFound", "no SandboxTemplate for the claim's pool"))
		}
		created, err := o.coldSandbox(ctx, c, tmpl)
		if err != nil {
			return 0, err
		}
		sb = created
	case sb == nil:
		return 0, o.claimStatus(ctx, c, assigned, notReady("SandboxNotFound", "Sandbox "+assigned+" is gone"))
	case sb.Metadata.Labels[LabelClaimUID] != c.Metadata.UID:
		adopted, err := o.adopt(ctx, c, sb)
		if err != nil {
			return 0, err
		}
		sb = adopted
	}
	ready := findCondition(sb.Status.Conditions, CondReady)
	conds := notReady("SandboxNotReady", "Sandbox "+assigned+" is not ready yet")
	if ready != nil {
		conds = []Condition{{Type: CondReady, Status: ready.Status, Reason: ready.Reason, Message: ready.Message}}
	}
	if err := o.claimStatus(ctx, c, assigned, conds); err != nil {
		return 0, err
	}
	if lc := c.Spec.Lifecycle; lc != nil && lc.ShutdownTime != nil {
		return time.Until(*lc.ShutdownTime) + 10*time.Millisecond, nil
	}
	return 0, nil
}

// reserveWarm picks an unclaimed sandbox of the pool, ready ones first,
// and reserves it for the claim; "" when the pool has none.
func (o *Operator) reserveWarm(ns, pool, claim string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, sb := range o.poolMembers(ns, pool) {
		o.reserved[objKey(sb.Metadata)] = claim
		return sb.Metadata.Name
	}
	return ""
}

// release drops a claim's reservations.
func (o *Operator) release(claim string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, c := range o.reserved {
		if c == claim {
			delete(o.reserved, k)
		}
	}
}

// adopt moves a warm sandbox from its pool to the claim. The patch
// carries the sandbox's resourceVersion: if it changed meanwhile (its
// pool deleted it) the claim is reconciled again.
func (o *Operator) adopt(ctx context.Context, c *SandboxClaim, sb *Sandbox) (*Sandbox, error) {
	var out Sandbox
	labels := map[string]any{LabelWarmPool: nil, LabelClaimUID: c.Metadata.UID, LabelLaunchType: "warm"}
	for k, v := range c.Spec.AdditionalPodMetadata.Labels {
		labels[k] = v
	}
	err := o.kube.MergePatch(ctx, ResSandbox, sb.Metadata.Namespace, sb.Metadata.Name, "", map[string]any{
		"metadata": map[string]any{"resourceVersion": sb.Metadata.ResourceVersion, "labels": labels,
			"ownerReferences": []OwnerReference{ownerRef("SandboxClaim", ExtGroup, c.Metadata)}}}, &out)
	if err != nil {
		return nil, fmt.Errorf("adopt %s: %w", sb.Metadata.Name, err)
	}
	o.put(ResSandbox, &out)
	return &out, nil
}

// coldSandbox creates the claim's own Sandbox from the template, with the
// claim's env in its container.
func (o *Operator) coldSandbox(ctx context.Context, c *SandboxClaim, tmpl *SandboxTemplate) (*Sandbox, error) {
	pod, err := withEnv(tmpl.Spec.PodTemplate, c.Spec.Env)
	if err != nil {
		return nil, err
	}
	annots := spaceAnnotations(tmpl.Metadata.Annotations)
	annots[AnnotTemplateRef] = tmpl.Metadata.Name
	for k, v := range c.Spec.AdditionalPodMetadata.Annotations {
		annots[k] = v
	}
	labels := map[string]string{LabelClaimUID: c.Metadata.UID, LabelLaunchType: "cold"}
	for k, v := range c.Spec.AdditionalPodMetadata.Labels {
		labels[k] = v
	}
	sb := map[string]any{"apiVersion": APIGroup + "/" + Version, "kind": "Sandbox",
		"metadata": map[string]any{"name": c.Metadata.Name, "namespace": c.Metadata.Namespace, "labels": labels,
			"annotations": annots, "ownerReferences": []OwnerReference{ownerRef("SandboxClaim", ExtGroup, c.Metadata)}},
		"spec": blueprint(tmpl, pod)}
	var out Sandbox
	err = o.kube.Create(ctx, ResSandbox, c.Metadata.Namespace, sb, &out)
	if IsAlreadyExists(err) {
		err = o.kube.Get(ctx, ResSandbox, c.Metadata.Namespace, c.Metadata.Name, &out)
	}
	if err != nil {
		return nil, fmt.Errorf("create sandbox of claim: %w", err)
	}
	o.put(ResSandbox, &out)
	return &out, nil
}

// withEnv sets env in the pod template's first container (or the one
// named by containerName), replacing variables of the same name.
func withEnv(pod json.RawMessage, env []ClaimEnvVar) (json.RawMessage, error) {
	if len(env) == 0 {
		return pod, nil
	}
	var tmpl map[string]any
	if err := json.Unmarshal(pod, &tmpl); err != nil {
		return nil, fmt.Errorf("pod template: %w", err)
	}
	spec, _ := tmpl["spec"].(map[string]any)
	ctrs, _ := spec["containers"].([]any)
	for _, e := range env {
		for i, raw := range ctrs {
			ctr, _ := raw.(map[string]any)
			if ctr == nil || (e.ContainerName != "" && ctr["name"] != e.ContainerName) || (e.ContainerName == "" && i > 0) {
				continue
			}
			list, _ := ctr["env"].([]any)
			out := []any{}
			for _, v := range list {
				if m, _ := v.(map[string]any); m == nil || m["name"] != e.Name {
					out = append(out, v)
				}
			}
			ctr["env"] = append(out, map[string]any{"name": e.Name, "value": e.Value})
		}
	}
	return json.Marshal(tmpl)
}

// expireClaim applies the claim's shutdownPolicy: Delete and
// DeleteForeground delete the claim, Retain (the default) deletes its
// Sandbox and keeps the claim with Ready False ClaimExpired.
func (o *Operator) expireClaim(ctx context.Context, c *SandboxClaim, assigned string) error {
	if p := c.Spec.Lifecycle.ShutdownPolicy; p == "Delete" || p == "DeleteForeground" {
		return o.kube.Delete(ctx, ResClaim, c.Metadata.Namespace, c.Metadata.Name)
	}
	if assigned != "" {
		if err := o.kube.Delete(ctx, ResSandbox, c.Metadata.Namespace, assigned); err != nil {
			return err
		}
	}
	return o.claimStatus(ctx, c, assigned, notReady("ClaimExpired", "shutdownTime passed; the sandbox was deleted (shutdownPolicy Retain)"))
}

// finalizeClaim deletes the claim's Sandbox, then lets the claim go.
func (o *Operator) finalizeClaim(ctx context.Context, c *SandboxClaim, assigned string) error {
	if !hasFinalizer(c.Metadata) {
		return nil
	}
	if assigned != "" {
		if err := o.kube.Delete(ctx, ResSandbox, c.Metadata.Namespace, assigned); err != nil {
			return fmt.Errorf("delete sandbox of claim: %w", err)
		}
	}
	err := o.kube.MergePatch(ctx, ResClaim, c.Metadata.Namespace, c.Metadata.Name, "", map[string]any{"metadata": map[string]any{
		"resourceVersion": c.Metadata.ResourceVersion, "finalizers": withoutFinalizer(c.Metadata.Finalizers)}}, nil)
	if IsNotFound(err) {
		return nil
	}
	if IsConflict(err) {
		o.q.add(kClaim + objKey(c.Metadata))
		return nil
	}
	if err == nil {
		o.release(objKey(c.Metadata))
	}
	return err
}

// claimStatus writes the claim's conditions and sandbox name, when changed.
func (o *Operator) claimStatus(ctx context.Context, c *SandboxClaim, sandbox string, conds []Condition) error {
	now := conditionTime()
	next := c.Status
	next.Conditions = append([]Condition(nil), c.Status.Conditions...)
	for _, cd := range conds {
		cd.ObservedGeneration = c.Metadata.Generation
		next.Conditions = setCondition(next.Conditions, cd, now)
	}
	next.Sandbox.Name = sandbox
	if sameConditions(next.Conditions, c.Status.Conditions) && next.Sandbox.Name == c.Status.Sandbox.Name {
		return nil
	}
	var out SandboxClaim
	if err := o.kube.MergePatch(ctx, ResClaim, c.Metadata.Namespace, c.Metadata.Name, "status",
		map[string]any{"status": next}, &out); err != nil {
		if IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("claim status: %w", err)
	}
	o.put(ResClaim, &out)
	return nil
}
