package operator

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// reconcileSandbox makes one Sandbox's SPACE sandbox match it: created
// (once; the id is kept in an annotation), paused or hibernated for
// operatingMode Suspended and resumed for Running, expired at its
// shutdownTime, deleted with the object (finalizer); status and the
// session Secret follow.
func (o *Operator) reconcileSandbox(ctx context.Context, ns, name string) (time.Duration, error) {
	o.mu.Lock()
	sb := o.sandboxes[ns+"/"+name]
	var tmpl *SandboxTemplate
	if sb != nil {
		tmpl = o.templates[ns+"/"+sb.Metadata.Annotations[AnnotTemplateRef]]
	}
	o.mu.Unlock()
	if sb == nil {
		return 0, nil
	}
	id := sb.Metadata.Annotations[AnnotSpaceID]
	if sb.Metadata.DeletionTimestamp != nil {
		return 0, o.finalizeSandbox(ctx, sb, id)
	}
	now := time.Now()
	st := sb.Status
	expired := sb.Spec.ShutdownTime != nil && !now.Before(*sb.Spec.ShutdownTime)
	if expired {
		return 0, o.expireSandbox(ctx, sb, id)
	}
	pv, err := parsePod(sb.Spec.PodTemplate)
	if err == nil && len(sb.Spec.VolumeClaimTemplates) > 0 {
		err = &Unsupported{"spec.volumeClaimTemplates", "SPACE sandboxes have their own writable layer and snapshots, not persistent volume claims"}
	}
	if err != nil {
		return 0, o.sandboxStatus(ctx, sb, notReady("Unsupported", message(err)))
	}
	if id == "" {
		after, done, err := o.createSpace(ctx, sb, tmpl, pv)
		if !done || err != nil {
			return after, err
		}
		o.mu.Lock()
		sb = o.sandboxes[ns+"/"+name]
		o.mu.Unlock()
		if sb == nil {
			return 0, nil
		}
		id = sb.Metadata.Annotations[AnnotSpaceID]
	}
	ssb, err := o.space.GetSandbox(ctx, id)
	if isSpaceNotFound(err) {
		ssb, err = client.Sandbox{ID: id, State: client.StateDeleted}, nil
	}
	if err != nil {
		return 0, fmt.Errorf("get SPACE sandbox %s: %w", id, err)
	}
	// Operating mode.
	suspend := sb.Spec.OperatingMode == "Suspended"
	switch {
	case suspend && ssb.State == client.StateRunning:
		verb := o.space.PauseSandbox
		if mode(sb, tmpl) == "hibernate" {
			verb = o.space.HibernateSandbox
		}
		if err := o.lifecycle(ctx, verb, id); err != nil {
			return 0, fmt.Errorf("suspend %s: %w", id, err)
		}
		return 0, o.requeueNow(sb)
	case !suspend && (ssb.State == "paused" || ssb.State == "hibernated"):
		if err := o.lifecycle(ctx, o.space.ResumeSandbox, id); err != nil {
			return 0, fmt.Errorf("resume %s: %w", id, err)
		}
		return 0, o.requeueNow(sb)
	}
	// A shutdownTime changed after the create moves SPACE's timeout.
	if ssb.State == client.StateRunning {
		if want := timeoutFor(sb.Spec.ShutdownTime, now); want > 0 && (ssb.ExpiresAt == nil ||
			math.Abs(ssb.ExpiresAt.Sub(*sb.Spec.ShutdownTime).Seconds()) > 2) {
			if _, err := o.space.SetTimeout(ctx, id, time.Duration(want)*time.Second); err != nil {
				return 0, fmt.Errorf("timeout %s: %w", id, err)
			}
		}
	}
	if err := o.ensureSession(ctx, sb, id, ssb.State == client.StateRunning); err != nil {
		if serr := o.sandboxStatus(ctx, sb, notReady("SessionSecretFailed", err.Error())); serr != nil {
			o.log.Warn("operator: status", "sandbox", objKey(sb.Metadata), "err", serr)
		}
		return 0, err
	}
	conds := stateConditions(ssb)
	st.NodeName = ssb.Node
	st.LabelSelector = ""
	if err := o.sandboxStatusFull(ctx, sb, st, conds); err != nil {
		return 0, err
	}
	switch {
	case ssb.State == client.StateCreating || ssb.State == "restarting" || ssb.State == client.StateDeleting:
		return time.Second, nil
	case sb.Spec.ShutdownTime != nil:
		return time.Until(*sb.Spec.ShutdownTime) + 10*time.Millisecond, nil
	}
	return 0, nil
}

// mode is how operatingMode Suspended suspends: the sandbox's or else its
// template's space-sandbox.dev/suspend annotation, pause by default.
func mode(sb *Sandbox, tmpl *SandboxTemplate) string {
	if m := sb.Metadata.Annotations[AnnotSpaceSuspend]; m != "" {
		return m
	}
	if tmpl != nil {
		return tmpl.Metadata.Annotations[AnnotSpaceSuspend]
	}
	return ""
}

// lifecycle runs a pause, hibernate or resume and waits for it; a 409
// (already in that state) is success.
func (o *Operator) lifecycle(ctx context.Context, verb func(context.Context, string, string) (client.Operation, error), id string) error {
	op, err := verb(ctx, id, "")
	if err != nil {
		if isConflict(err) {
			return nil
		}
		return err
	}
	_, err = o.space.WaitOperation(ctx, op.ID)
	return err
}

func (o *Operator) requeueNow(sb *Sandbox) error {
	o.q.add(kSandbox + objKey(sb.Metadata))
	return nil
}

// timeoutFor is SPACE's timeout_seconds for a shutdownTime: the seconds
// left, at least 1; 0 (never) without one.
func timeoutFor(t *time.Time, now time.Time) int64 {
	if t == nil {
		return 0
	}
	return max(1, int64(math.Ceil(t.Sub(now).Seconds())))
}

// stateConditions maps a SPACE sandbox state onto Ready and Suspended.
func stateConditions(s client.Sandbox) []Condition {
	switch s.State {
	case client.StateRunning:
		return []Condition{{Type: CondReady, Status: "True", Reason: "DependenciesReady", Message: "SPACE sandbox " + s.ID + " is running"},
			{Type: CondSuspend, Status: "False", Reason: "NotSuspended", Message: ""}}
	case "paused", "hibernated":
		return []Condition{{Type: CondReady, Status: "False", Reason: "SandboxSuspended", Message: "SPACE sandbox " + s.ID + " is " + s.State},
			{Type: CondSuspend, Status: "True", Reason: map[string]string{"paused": "Paused", "hibernated": "Hibernated"}[s.State],
				Message: "SPACE sandbox " + s.ID + " is " + s.State}}
	case client.StateCreating, "restarting":
		return []Condition{{Type: CondReady, Status: "False", Reason: "DependenciesNotReady", Message: "SPACE sandbox " + s.ID + " is " + s.State},
			{Type: CondSuspend, Status: "False", Reason: "NotSuspended"}}
	default: // failed, lost, deleting, deleted
		msg := "SPACE sandbox " + s.ID + " is " + s.State
		if s.StateReason != "" {
			msg += ": " + s.StateReason
		}
		return []Condition{{Type: CondReady, Status: "False", Reason: "SandboxFailed", Message: msg},
			{Type: CondSuspend, Status: "False", Reason: "NotSuspended"}}
	}
}

func notReady(reason, msg string) []Condition {
	return []Condition{{Type: CondReady, Status: "False", Reason: reason, Message: msg}}
}

// createSpace creates the SPACE sandbox of sb and records it: the id (and
// the finalizer) on the object first, so that a restart finds it, then the
// session Secret. The create's idempotency key is the object's uid, so a
// retry after a crash between create and record gets the same sandbox.
// done is false when the create must wait (a template build).
func (o *Operator) createSpace(ctx context.Context, sb *Sandbox, tmpl *SandboxTemplate, pv podView) (time.Duration, bool, error) {
	annots := map[string]string{}
	if tmpl != nil {
		for k, v := range tmpl.Metadata.Annotations {
			annots[k] = v
		}
	}
	for k, v := range sb.Metadata.Annotations {
		annots[k] = v
	}
	src, err := spaceTemplate(annots, pv)
	if err != nil {
		return 0, false, o.sandboxStatus(ctx, sb, notReady("Unsupported", message(err)))
	}
	ready, err := o.ensureTemplate(src, kSandbox+objKey(sb.Metadata))
	if err != nil {
		return 30 * time.Second, false, o.sandboxStatus(ctx, sb, notReady("TemplateFailed", "SPACE template "+src.Name+": "+err.Error()))
	}
	if !ready {
		return 0, false, o.sandboxStatus(ctx, sb, notReady("TemplateBuilding", "building SPACE template "+src.Name))
	}
	net, err := networkPolicy(tmpl)
	if err != nil {
		return 0, false, o.sandboxStatus(ctx, sb, notReady("Unsupported", message(err)))
	}
	// Counted from the object's creation, not from now: a retried create
	// must send the same body for its idempotency key to be accepted. The
	// reconcile moves SPACE's timeout to shutdownTime once it runs.
	created := time.Now()
	if sb.Metadata.CreationTimestamp != nil {
		created = *sb.Metadata.CreationTimestamp
	}
	timeout := timeoutFor(sb.Spec.ShutdownTime, created)
	req := client.CreateRequest{Template: src.Name, Env: pv.Env, Network: net, TimeoutSeconds: &timeout,
		Limits:   client.Limits{CPUMillis: pv.CPUMillis, MemoryBytes: pv.MemBytes},
		Metadata: map[string]string{metadataKeyUID: sb.Metadata.UID, metadataKeyName: objKey(sb.Metadata)}}
	res, err := o.space.CreateSandbox(ctx, req, "k8s-"+sb.Metadata.UID)
	if err != nil {
		return 5 * time.Second, false, o.sandboxStatus(ctx, sb, notReady("CreateFailed", err.Error()))
	}
	id := res.Sandbox.ID
	annot := map[string]any{AnnotSpaceID: id, AnnotSpaceDataURL: res.Session.DataURL, AnnotSpaceSecret: sb.Metadata.Name,
		annotSessionExpires: res.Session.ExpiresAt.UTC().Format(time.RFC3339)}
	var out Sandbox
	err = o.kube.MergePatch(ctx, ResSandbox, sb.Metadata.Namespace, sb.Metadata.Name, "", map[string]any{
		"metadata": map[string]any{"resourceVersion": sb.Metadata.ResourceVersion,
			"finalizers": withFinalizer(sb.Metadata.Finalizers), "annotations": annot}}, &out)
	if IsConflict(err) {
		return 0, false, o.requeueNow(sb) // changed meanwhile: the retry's create is idempotent
	}
	if err != nil {
		return 0, false, fmt.Errorf("record SPACE sandbox %s: %w", id, err)
	}
	o.put(ResSandbox, &out)
	// The Secret is written while SPACE starts the sandbox: one API round
	// trip less before Ready.
	secretErr := make(chan error, 1)
	go func() { secretErr <- o.writeSecret(ctx, &out, res.Session) }()
	_, opErr := o.space.WaitOperation(ctx, res.Operation.ID)
	if err := <-secretErr; err != nil {
		return 0, false, err
	}
	if err := opErr; err != nil {
		o.log.Warn("operator: SPACE create failed", "sandbox", objKey(sb.Metadata), "id", id, "err", err)
	} else if len(pv.Command) > 0 {
		// The container's command is the pod's main process: started once,
		// in the background, as the sandbox's first command.
		conn := client.NewSandboxConn(res.Session)
		if _, err := conn.Exec(ctx, client.ExecRequest{Argv: pv.Command, Cwd: pv.Cwd, Tag: "main"}); err != nil {
			o.log.Warn("operator: start command failed", "sandbox", objKey(sb.Metadata), "err", err)
		}
	}
	return 0, true, nil
}

const annotSessionExpires = "space-sandbox.dev/session-expires"

// writeSecret stores the session in the Secret named like the Sandbox
// (owned by it, so the garbage collector removes it with the Sandbox).
func (o *Operator) writeSecret(ctx context.Context, sb *Sandbox, s client.Session) error {
	data := map[string]string{"token": s.Token, "data_url": s.DataURL, "sandbox_id": sb.Metadata.Annotations[AnnotSpaceID],
		"expires_at": s.ExpiresAt.UTC().Format(time.RFC3339)}
	secret := map[string]any{"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
		"metadata": map[string]any{"name": sb.Metadata.Name, "namespace": sb.Metadata.Namespace,
			"labels":          map[string]string{"app.kubernetes.io/managed-by": "space-operator"},
			"ownerReferences": []OwnerReference{ownerRef("Sandbox", APIGroup, sb.Metadata)}},
		"stringData": data}
	err := o.kube.Create(ctx, ResSecret, sb.Metadata.Namespace, secret, nil)
	if IsAlreadyExists(err) {
		err = o.kube.MergePatch(ctx, ResSecret, sb.Metadata.Namespace, sb.Metadata.Name, "", map[string]any{"stringData": data}, nil)
	}
	if err != nil {
		return fmt.Errorf("session secret %s: %w", objKey(sb.Metadata), err)
	}
	o.mu.Lock()
	o.secrets[objKey(sb.Metadata)] = data["sandbox_id"]
	o.mu.Unlock()
	return nil
}

// ensureSession makes sure the Sandbox's Secret holds a session of its
// SPACE sandbox before the Sandbox is reported Ready, and renews it an
// hour before it expires. The SPACE id is recorded on the object before
// the Secret is written (createSpace), so an operator killed between the
// two, or whose Secret write failed, leaves a recorded Sandbox without a
// Secret: the first reconcile of each Sandbox in an operator's life reads
// its Secret (once; the Secrets it writes itself are known) and writes a
// new session into it when it is missing or holds another sandbox's.
// running: a missing Secret of a running sandbox is an error (retried);
// a paused or gone one gets its session when it runs again.
func (o *Operator) ensureSession(ctx context.Context, sb *Sandbox, id string, running bool) error {
	key := objKey(sb.Metadata)
	o.mu.Lock()
	known := o.secrets[key] == id
	o.mu.Unlock()
	if !known {
		var sec struct {
			Data map[string][]byte `json:"data"`
		}
		err := o.kube.Get(ctx, ResSecret, sb.Metadata.Namespace, sb.Metadata.Name, &sec)
		switch {
		case err == nil && string(sec.Data["sandbox_id"]) == id && len(sec.Data["token"]) > 0:
			o.mu.Lock()
			o.secrets[key] = id
			o.mu.Unlock()
		case err == nil || IsNotFound(err):
			if err := o.renewSession(ctx, sb, id); err != nil && running {
				return err
			}
			return nil
		default:
			return fmt.Errorf("read secret %s: %w", key, err)
		}
	}
	exp, err := time.Parse(time.RFC3339, sb.Metadata.Annotations[annotSessionExpires])
	if err == nil && time.Until(exp) > sessionRefreshBefore {
		return nil
	}
	if err := o.renewSession(ctx, sb, id); err != nil && running {
		return err
	}
	return nil
}

// renewSession issues a new session of the SPACE sandbox, writes it to
// the Secret and records its expiry on the Sandbox.
func (o *Operator) renewSession(ctx context.Context, sb *Sandbox, id string) error {
	s, err := o.space.NewSession(ctx, id)
	if err != nil {
		return fmt.Errorf("new session of %s: %w", id, err)
	}
	if err := o.writeSecret(ctx, sb, s); err != nil {
		return err
	}
	var out Sandbox
	if err := o.kube.MergePatch(ctx, ResSandbox, sb.Metadata.Namespace, sb.Metadata.Name, "", map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{annotSessionExpires: s.ExpiresAt.UTC().Format(time.RFC3339),
			AnnotSpaceDataURL: s.DataURL}}}, &out); err != nil {
		return fmt.Errorf("record session of %s: %w", objKey(sb.Metadata), err)
	}
	o.put(ResSandbox, &out)
	return nil
}

// expireSandbox applies shutdownPolicy at shutdownTime: Delete deletes
// the object, Retain (the CRD's default) deletes only the SPACE sandbox
// and keeps the object with Ready False SandboxExpired.
func (o *Operator) expireSandbox(ctx context.Context, sb *Sandbox, id string) error {
	if sb.Spec.ShutdownPolicy != nil && *sb.Spec.ShutdownPolicy == "Delete" {
		return o.kube.Delete(ctx, ResSandbox, sb.Metadata.Namespace, sb.Metadata.Name)
	}
	if id != "" {
		if _, err := o.space.DeleteSandbox(ctx, id); err != nil && !isSpaceNotFound(err) && !isConflict(err) {
			return fmt.Errorf("expire %s: %w", id, err)
		}
	}
	return o.sandboxStatus(ctx, sb, notReady("SandboxExpired", "shutdownTime passed; the SPACE sandbox was deleted (shutdownPolicy Retain)"))
}

// finalizeSandbox deletes the SPACE sandbox and the Secret of a Sandbox
// being deleted, then lets the object go.
func (o *Operator) finalizeSandbox(ctx context.Context, sb *Sandbox, id string) error {
	if !hasFinalizer(sb.Metadata) {
		return nil
	}
	if id != "" {
		if _, err := o.space.DeleteSandbox(ctx, id); err != nil && !isSpaceNotFound(err) && !isConflict(err) {
			return fmt.Errorf("delete SPACE sandbox %s: %w", id, err)
		}
	}
	if err := o.kube.Delete(ctx, ResSecret, sb.Metadata.Namespace, sb.Metadata.Name); err != nil {
		return fmt.Errorf("delete secret: %w", err)
	}
	o.mu.Lock()
	delete(o.secrets, objKey(sb.Metadata))
	o.mu.Unlock()
	err := o.kube.MergePatch(ctx, ResSandbox, sb.Metadata.Namespace, sb.Metadata.Name, "", map[string]any{
		"metadata": map[string]any{"resourceVersion": sb.Metadata.ResourceVersion,
			"finalizers": withoutFinalizer(sb.Metadata.Finalizers)}}, nil)
	if IsNotFound(err) {
		return nil
	}
	if IsConflict(err) {
		return o.requeueNow(sb)
	}
	return err
}

func (o *Operator) sandboxStatus(ctx context.Context, sb *Sandbox, conds []Condition) error {
	return o.sandboxStatusFull(ctx, sb, sb.Status, conds)
}

// sandboxStatusFull writes st with conds applied, when anything changed.
func (o *Operator) sandboxStatusFull(ctx context.Context, sb *Sandbox, st SandboxStatus, conds []Condition) error {
	now := conditionTime()
	next := st
	next.Conditions = append([]Condition(nil), sb.Status.Conditions...)
	for _, c := range conds {
		c.ObservedGeneration = sb.Metadata.Generation
		next.Conditions = setCondition(next.Conditions, c, now)
	}
	if sameConditions(next.Conditions, sb.Status.Conditions) && next.NodeName == sb.Status.NodeName {
		return nil
	}
	var out Sandbox
	if err := o.kube.MergePatch(ctx, ResSandbox, sb.Metadata.Namespace, sb.Metadata.Name, "status",
		map[string]any{"status": next}, &out); err != nil {
		if IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("status of %s: %w", objKey(sb.Metadata), err)
	}
	o.put(ResSandbox, &out)
	return nil
}
