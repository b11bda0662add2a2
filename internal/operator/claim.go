package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// reconcileClaim gives a claim a Sandbox: an unclaimed one of its warm
// pool (adopted: the pool label goes, the claim becomes its owner) or,
// when the pool has none or the claim sets env, a new one named like the
// claim. A warm claim is two writes (the adoption, then the claim's
// status), a cold one a create and the status once its Sandbox is Ready:
// the Sandbox's claim-uid label and owner reference record the choice
// durably, so a restarted operator finds it without a write on the claim
// first. The claim's Ready mirrors its Sandbox's; shutdownTime and
// shutdownPolicy expire it; deleting it deletes the Sandbox (and so the
// SPACE sandbox), by the operator and by the garbage collector through
// the owner reference.
func (o *Operator) reconcileClaim(ctx context.Context, ns, name string) (time.Duration, error) {
	key := ns + "/" + name
	o.mu.Lock()
	c := o.claims[key]
	if ct := o.claimTimes[key]; ct != nil && ct.started.IsZero() {
		ct.started = time.Now()
	}
	var pool *SandboxWarmPool
	var tmpl *SandboxTemplate
	assigned := ""
	if c != nil {
		pool = o.pools[ns+"/"+c.Spec.WarmPoolRef.Name]
		if pool != nil {
			tmpl = o.templates[ns+"/"+pool.Spec.TemplateRef.Name]
		}
		assigned = o.claimSandbox(c)
	}
	o.mu.Unlock()
	if c == nil {
		return 0, o.claimGone(ctx, ns, name)
	}
	if c.Metadata.DeletionTimestamp != nil {
		// Claims of operators before this one carry a finalizer.
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
		if len(c.Spec.Env) == 0 {
			assigned = o.reserveWarm(ns, pool.Metadata.Name, key)
		}
		if assigned == "" {
			assigned = c.Metadata.Name
		}
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
		o.release(key)
		return 0, o.claimStatus(ctx, c, assigned, notReady("SandboxNotFound", "Sandbox "+assigned+" is gone"))
	case sb.Metadata.Labels[LabelClaimUID] == c.Metadata.UID:
	case sb.Metadata.Labels[LabelWarmPool] != "":
		t0 := time.Now()
		adopted, err := o.adopt(ctx, c, sb)
		o.claimStep(key, func(ct *claimTiming) { ct.adopt = time.Since(t0) })
		if err != nil {
			o.release(key)
			if IsConflict(err) || IsNotFound(err) {
				// Its pool deleted or changed it meanwhile: pick again.
				return time.Millisecond, nil
			}
			return 0, err
		}
		sb = adopted
	default:
		// A Sandbox named like the claim that is not the claim's (made by
		// hand, or of an earlier claim of that name still going).
		return time.Second, o.claimStatus(ctx, c, "", notReady("SandboxNameTaken", "Sandbox "+assigned+" exists and belongs to no claim of this uid"))
	}
	o.mu.Lock()
	o.reserved[ns+"/"+assigned] = key
	o.mu.Unlock()
	ready := findCondition(sb.Status.Conditions, CondReady)
	if ready == nil || (ready.Status != "True" && ready.Reason == "DependenciesNotReady") {
		// One status write per transition: a cold claim whose Sandbox is
		// still starting is left without a condition for up to
		// claimStatusGrace (its Sandbox turning Ready queues it again), so
		// the usual cold claim is written once, Ready. A Sandbox that
		// cannot start (refused, template failed) is reported at once.
		if wait := o.freshClaim(key, c); wait > 0 {
			return wait, nil
		}
	}
	conds := notReady("SandboxNotReady", "Sandbox "+assigned+" is not ready yet")
	if ready != nil {
		conds = []Condition{{Type: CondReady, Status: ready.Status, Reason: ready.Reason, Message: ready.Message}}
	}
	t0 := time.Now()
	if err := o.claimStatus(ctx, c, assigned, conds); err != nil {
		return 0, err
	}
	o.claimStep(key, func(ct *claimTiming) { ct.status = time.Since(t0) })
	if ready != nil && ready.Status == "True" {
		o.logClaimReady(key, sb)
	}
	if lc := c.Spec.Lifecycle; lc != nil && lc.ShutdownTime != nil {
		return time.Until(*lc.ShutdownTime) + 10*time.Millisecond, nil
	}
	return 0, nil
}

// claimStatusGrace is how long a new claim may go without a condition
// while its Sandbox starts: long enough for a cold start in a burst of a
// hundred claims on a small node (2–8 s measured on two loaded cores), so
// that such a claim's status is written once, not NotReady then Ready.
const claimStatusGrace = 10 * time.Second

// freshClaim is how long until a claim without a Ready condition must get
// one; 0 when it has one or is older than claimStatusGrace.
func (o *Operator) freshClaim(key string, c *SandboxClaim) time.Duration {
	if findCondition(c.Status.Conditions, CondReady) != nil {
		return 0
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	ct := o.claimTimes[key]
	if ct == nil {
		return 0
	}
	return max(0, claimStatusGrace-time.Since(ct.seen))
}

// claimSandbox is the Sandbox a claim holds: its status, the annotation
// earlier operators wrote, or a Sandbox labelled with its uid (adopted or
// created just before a restart, the status not written yet). Called with
// o.mu held.
func (o *Operator) claimSandbox(c *SandboxClaim) string {
	if n := c.Status.Sandbox.Name; n != "" {
		return n
	}
	if n := c.Metadata.Annotations[AnnotClaimSandbox]; n != "" {
		return n
	}
	for _, sb := range o.sandboxes {
		if sb.Metadata.Namespace == c.Metadata.Namespace && sb.Metadata.Labels[LabelClaimUID] == c.Metadata.UID {
			return sb.Metadata.Name
		}
	}
	for k, ck := range o.reserved {
		if ck == objKey(c.Metadata) {
			_, n := splitKey(k)
			return n
		}
	}
	return ""
}

// claimGone deletes the Sandboxes of a deleted claim: those it reserved
// and those it owns (the garbage collector does the same in a cluster
// with a controller manager; the operator does not wait for it).
func (o *Operator) claimGone(ctx context.Context, ns, name string) error {
	key := ns + "/" + name
	o.mu.Lock()
	var names []string
	for k, c := range o.reserved {
		if c == key {
			_, n := splitKey(k)
			names = append(names, n)
		}
	}
	for _, sb := range o.sandboxes {
		if sb.Metadata.Namespace != ns || sb.Metadata.DeletionTimestamp != nil {
			continue
		}
		for _, ref := range sb.Metadata.OwnerReferences {
			if ref.Kind == "SandboxClaim" && ref.Name == name && !slices.Contains(names, sb.Metadata.Name) {
				names = append(names, sb.Metadata.Name)
			}
		}
	}
	o.mu.Unlock()
	for _, n := range names {
		if err := o.kube.Delete(ctx, ResSandbox, ns, n); err != nil && !IsNotFound(err) {
			return fmt.Errorf("delete sandbox of deleted claim %s: %w", key, err)
		}
	}
	o.release(key)
	return nil
}

// logClaimReady logs, at debug level, how long a claim waited for a
// worker and how long its work took, once, when it is first Ready.
func (o *Operator) logClaimReady(key string, sb *Sandbox) {
	o.mu.Lock()
	ct := o.claimTimes[key]
	delete(o.claimTimes, key)
	o.mu.Unlock()
	if ct == nil || ct.started.IsZero() {
		return
	}
	o.log.Debug("operator: claim ready", "claim", key, "launch", sb.Metadata.Labels[LabelLaunchType],
		"queued_ms", ct.started.Sub(ct.seen).Milliseconds(), "work_ms", time.Since(ct.started).Milliseconds(),
		"adopt_ms", ct.adopt.Milliseconds(), "status_ms", ct.status.Milliseconds())
}

// claimStep records the time of one of a claim's writes for its debug
// record (the last one of each kind).
func (o *Operator) claimStep(key string, set func(*claimTiming)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ct := o.claimTimes[key]; ct != nil {
		set(ct)
	}
}

// reserveWarm picks an unclaimed sandbox of the pool, ready ones first,
// and reserves it for the claim; "" when the pool has none.
func (o *Operator) reserveWarm(ns, pool, claim string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	// poolMembers' first, in one pass without its sort: this runs once per
	// claim under o.mu, and a burst of 1,000 claims on a pool of 1,000
	// sorted a million entries.
	label := poolLabel(pool)
	var best *Sandbox
	bestReady := false
	for k, sb := range o.sandboxes {
		if !o.unclaimed(k, sb, ns, label) {
			continue
		}
		if r := isReady(sb); best == nil || (r && !bestReady) || (r == bestReady && sb.Metadata.Name < best.Metadata.Name) {
			best, bestReady = sb, r
		}
	}
	if best == nil {
		return ""
	}
	o.reserved[objKey(best.Metadata)] = claim
	return best.Metadata.Name
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
