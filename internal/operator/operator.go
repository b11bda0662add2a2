// Package operator serves the kubernetes-sigs/agent-sandbox API
// (agents.x-k8s.io/v1beta1 Sandbox; extensions.agents.x-k8s.io/v1beta1
// SandboxTemplate, SandboxClaim, SandboxWarmPool) with SPACE sandboxes:
// `space operator` watches those objects and reconciles each Sandbox onto
// a SPACE sandbox through the control API, reporting Ready and Suspended
// conditions and a Secret with the session token and data URL. Warm pools
// are Sandboxes owned by the pool; a claim adopts one (or cold-creates
// one), as agent-sandbox's own controllers do. docs/kubernetes-api.md has
// the field table.
package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// Options configure an Operator.
type Options struct {
	// Namespace limits the operator to one namespace; empty: all.
	Namespace string
	// Workers reconcile Sandboxes and templates in parallel (default 32):
	// SPACE creates and pauses wait on their operations.
	Workers int
	// ClaimWorkers reconcile claims and pools in parallel (default 128).
	// A warm claim is two API writes and nothing else, so a burst's
	// throughput is ClaimWorkers over the API server's write latency: at
	// 32 workers and ~0.4 s per write on a loaded node, a burst of 1,000
	// claims waited 8 s for a worker at p50.
	ClaimWorkers int
	// Resync re-reconciles every object this often (default 30 s), which
	// picks up changes made on the SPACE side (a sandbox that failed, a
	// timeout that fired).
	Resync time.Duration
	Logger *slog.Logger
}

// Operator reconciles the four kinds onto one SPACE server.
type Operator struct {
	kube  *Kube
	space *client.Client
	opts  Options
	log   *slog.Logger
	q     *router

	mu        sync.Mutex
	sandboxes map[string]*Sandbox // "ns/name"
	claims    map[string]*SandboxClaim
	templates map[string]*SandboxTemplate
	pools     map[string]*SandboxWarmPool
	// reserved: warm sandbox key -> claim key, from the moment a claim
	// picks it until the claim is gone, so no two claims take one sandbox
	// and its pool does not count it while the adoption is written.
	reserved map[string]string
	builds   map[string]*build // SPACE template name -> its build
	// secrets: Sandbox key -> the SPACE id its Secret is known to hold
	// (written or read by this operator), so that a Sandbox's Secret is
	// read at most once per operator life (ensureSession).
	secrets map[string]string
	// claimTimes: when the operator first saw each claim not yet Ready and
	// when a worker first took it up, for the debug log that splits a
	// claim's latency into queueing and work.
	claimTimes map[string]*claimTiming
}

type claimTiming struct {
	seen, started time.Time
	adopt, status time.Duration // the warm adoption's write, the claim's status write
}

// New makes an Operator; Run starts it.
func New(kube *Kube, space *client.Client, opts Options) *Operator {
	if opts.Workers <= 0 {
		opts.Workers = 32
	}
	if opts.ClaimWorkers <= 0 {
		opts.ClaimWorkers = 128
	}
	if opts.Resync <= 0 {
		opts.Resync = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	o := &Operator{kube: kube, space: space, opts: opts, log: opts.Logger, q: &router{sandboxes: newQueue(), claims: newQueue()},
		sandboxes: map[string]*Sandbox{}, claims: map[string]*SandboxClaim{},
		templates: map[string]*SandboxTemplate{}, pools: map[string]*SandboxWarmPool{},
		reserved: map[string]string{}, builds: map[string]*build{}, claimTimes: map[string]*claimTiming{},
		secrets: map[string]string{}}
	o.q.sandboxes.low, o.q.sandboxes.lowMax = o.refilling, max(1, opts.Workers/4)
	return o
}

// refilling: the key is a warm pool's own unreserved Sandbox, whose
// reconcile (its SPACE create) is background work next to claims.
func (o *Operator) refilling(key string) bool {
	if !strings.HasPrefix(key, kSandbox) {
		return false
	}
	k := key[len(kSandbox):]
	o.mu.Lock()
	defer o.mu.Unlock()
	sb := o.sandboxes[k]
	return sb != nil && sb.Metadata.Labels[LabelWarmPool] != "" && o.reserved[k] == "" && sb.Metadata.DeletionTimestamp == nil
}

// Key prefixes of the work queue.
const (
	kSandbox  = "s/"
	kClaim    = "c/"
	kTemplate = "t/"
	kPool     = "p/"
)

func objKey(m ObjectMeta) string { return m.Namespace + "/" + m.Name }

func splitKey(k string) (ns, name string) {
	ns, name, _ = strings.Cut(k, "/")
	return ns, name
}

// Run lists the four kinds, starts their watches and the workers, and
// reconciles until ctx ends.
func (o *Operator) Run(ctx context.Context) error {
	kinds := []Resource{ResTemplate, ResWarmPool, ResSandbox, ResClaim}
	rvs := make([]string, len(kinds))
	// Every cache is filled before the first reconcile: a claim decides
	// between warm and cold from the cached pool sandboxes and the claims
	// that already hold one.
	for i, r := range kinds {
		rv, err := o.relist(ctx, r)
		if err != nil {
			return fmt.Errorf("list %s: %w", r.Plural, err)
		}
		rvs[i] = rv
	}
	// Which sandbox each claim holds, from the claims and the Sandboxes;
	// Sandboxes of claims deleted while no operator ran are deleted.
	var orphans []string
	o.mu.Lock()
	for k, c := range o.claims {
		if n := o.claimSandbox(c); n != "" {
			o.reserved[c.Metadata.Namespace+"/"+n] = k
		}
	}
	for _, sb := range o.sandboxes {
		for _, ref := range sb.Metadata.OwnerReferences {
			if ck := sb.Metadata.Namespace + "/" + ref.Name; ref.Kind == "SandboxClaim" && o.claims[ck] == nil {
				orphans = append(orphans, kClaim+ck)
			}
		}
	}
	o.mu.Unlock()
	for _, k := range orphans {
		o.q.add(k)
	}
	var wg sync.WaitGroup
	for i, r := range kinds {
		wg.Add(1)
		go func() { defer wg.Done(); o.watchLoop(ctx, r, rvs[i]) }()
	}
	for range o.opts.Workers {
		wg.Add(1)
		go func() { defer wg.Done(); o.worker(ctx, o.q.sandboxes) }()
	}
	for range o.opts.ClaimWorkers {
		wg.Add(1)
		go func() { defer wg.Done(); o.worker(ctx, o.q.claims) }()
	}
	o.enqueueAll()
	t := time.NewTicker(o.opts.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			o.q.close()
			wg.Wait()
			return nil
		case <-t.C:
			o.enqueueAll()
		}
	}
}

func (o *Operator) enqueueAll() {
	o.mu.Lock()
	var keys []string
	for k := range o.templates {
		keys = append(keys, kTemplate+k)
	}
	for k := range o.pools {
		keys = append(keys, kPool+k)
	}
	for k := range o.sandboxes {
		keys = append(keys, kSandbox+k)
	}
	for k := range o.claims {
		keys = append(keys, kClaim+k)
	}
	o.mu.Unlock()
	for _, k := range keys {
		o.q.add(k)
	}
}

// relist brings a kind's cache up to a fresh list: every listed object is
// observed, then the cached ones the list lacks are dropped (and queued,
// so their reconcile sees them gone). An object in both is never missing
// from the cache meanwhile: a claim absent even briefly would have its
// Sandbox deleted.
func (o *Operator) relist(ctx context.Context, r Resource) (string, error) {
	items, rv, err := o.kube.List(ctx, r, o.opts.Namespace)
	if err != nil {
		return "", err
	}
	listed := map[string]bool{}
	for _, raw := range items {
		var m struct {
			Metadata ObjectMeta `json:"metadata"`
		}
		if json.Unmarshal(raw, &m) == nil {
			listed[objKey(m.Metadata)] = true
		}
		o.observe(r, "ADDED", raw)
	}
	var gone []string
	o.mu.Lock()
	prefix := ""
	switch r {
	case ResSandbox:
		prefix, gone = kSandbox, dropUnlisted(o.sandboxes, listed)
	case ResClaim:
		prefix, gone = kClaim, dropUnlisted(o.claims, listed)
	case ResTemplate:
		prefix, gone = kTemplate, dropUnlisted(o.templates, listed)
	case ResWarmPool:
		prefix, gone = kPool, dropUnlisted(o.pools, listed)
	}
	o.mu.Unlock()
	for _, k := range gone {
		o.q.add(prefix + k)
	}
	return rv, nil
}

// dropUnlisted removes the keys of m not in listed and returns them.
func dropUnlisted[T any](m map[string]T, listed map[string]bool) []string {
	var gone []string
	for k := range m {
		if !listed[k] {
			delete(m, k)
			gone = append(gone, k)
		}
	}
	return gone
}

// watchLoop follows a kind's changes, relisting when the watch's version
// is too old, and backing off on errors.
func (o *Operator) watchLoop(ctx context.Context, r Resource, rv string) {
	for ctx.Err() == nil {
		err := o.kube.Watch(ctx, r, o.opts.Namespace, rv, func(ev WatchEvent) {
			var m struct {
				Metadata ObjectMeta `json:"metadata"`
			}
			if json.Unmarshal(ev.Object, &m) == nil && m.Metadata.ResourceVersion != "" {
				rv = m.Metadata.ResourceVersion
			}
			if ev.Type != "BOOKMARK" {
				o.observe(r, ev.Type, ev.Object)
			}
		})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if !isGone(err) {
				o.log.Warn("operator: watch failed", "resource", r.Plural, "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
			if nrv, lerr := o.relist(ctx, r); lerr == nil {
				rv = nrv
				o.enqueueAll()
			} else {
				o.log.Warn("operator: relist failed", "resource", r.Plural, "err", lerr)
			}
		}
	}
}

// newerRV: whether a is at least as new as b (resourceVersions are etcd
// revisions in practice; when they do not parse, the incoming one wins).
func newerRV(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	if err1 != nil || err2 != nil {
		return true
	}
	return x >= y
}

// observe puts one object (from a list, a watch or a write's answer) into
// its cache and queues it and the objects that depend on it.
func (o *Operator) observe(r Resource, typ string, raw json.RawMessage) {
	var keys []string
	o.mu.Lock()
	switch r {
	case ResSandbox:
		var sb Sandbox
		if json.Unmarshal(raw, &sb) != nil {
			break
		}
		k := objKey(sb.Metadata)
		if old := o.sandboxes[k]; typ != "DELETED" && old != nil && !newerRV(sb.Metadata.ResourceVersion, old.Metadata.ResourceVersion) {
			break
		}
		old := o.sandboxes[k]
		if typ == "DELETED" {
			delete(o.sandboxes, k)
			delete(o.secrets, k)
		} else {
			o.sandboxes[k] = &sb
		}
		if typ == "DELETED" || old == nil || !sameForReconcile(old, &sb) {
			keys = append(keys, kSandbox+k)
		}
		if p := sb.Metadata.Labels[LabelWarmPool]; p != "" {
			keys = append(keys, kPool+poolKeyForLabel(o, sb.Metadata.Namespace, p))
		}
		if c := o.reserved[k]; c != "" {
			keys = append(keys, kClaim+c)
		}
		for _, ref := range sb.Metadata.OwnerReferences {
			switch ref.Kind {
			case "SandboxClaim":
				keys = append(keys, kClaim+sb.Metadata.Namespace+"/"+ref.Name)
			case "SandboxWarmPool":
				keys = append(keys, kPool+sb.Metadata.Namespace+"/"+ref.Name)
			}
		}
	case ResClaim:
		var c SandboxClaim
		if json.Unmarshal(raw, &c) != nil {
			break
		}
		k := objKey(c.Metadata)
		if old := o.claims[k]; typ != "DELETED" && old != nil && !newerRV(c.Metadata.ResourceVersion, old.Metadata.ResourceVersion) {
			break
		}
		if typ == "DELETED" {
			delete(o.claims, k)
			delete(o.claimTimes, k)
		} else {
			o.claims[k] = &c
			if o.claimTimes[k] == nil && findCondition(c.Status.Conditions, CondReady) == nil {
				o.claimTimes[k] = &claimTiming{seen: time.Now()}
			}
		}
		keys = append(keys, kClaim+k)
	case ResTemplate:
		var t SandboxTemplate
		if json.Unmarshal(raw, &t) != nil {
			break
		}
		k := objKey(t.Metadata)
		if typ == "DELETED" {
			delete(o.templates, k)
		} else {
			o.templates[k] = &t
		}
		keys = append(keys, kTemplate+k)
		for pk, p := range o.pools {
			if p.Metadata.Namespace == t.Metadata.Namespace && p.Spec.TemplateRef.Name == t.Metadata.Name {
				keys = append(keys, kPool+pk)
			}
		}
	case ResWarmPool:
		var p SandboxWarmPool
		if json.Unmarshal(raw, &p) != nil {
			break
		}
		k := objKey(p.Metadata)
		if old := o.pools[k]; typ != "DELETED" && old != nil && !newerRV(p.Metadata.ResourceVersion, old.Metadata.ResourceVersion) {
			break
		}
		if typ == "DELETED" {
			delete(o.pools, k)
		} else {
			o.pools[k] = &p
		}
		keys = append(keys, kPool+k)
		// Claims waiting for this pool (it did not exist yet).
		for ck, c := range o.claims {
			if c.Metadata.Namespace == p.Metadata.Namespace && c.Spec.WarmPoolRef.Name == p.Metadata.Name &&
				c.Status.Sandbox.Name == "" && c.Metadata.Annotations[AnnotClaimSandbox] == "" {
				keys = append(keys, kClaim+ck)
			}
		}
	}
	o.mu.Unlock()
	for _, k := range keys {
		o.q.add(k)
	}
}

// sameForReconcile: b differs from a only where reconcileSandbox does not
// look (labels, owner references, status), so b needs no reconcile of its
// own. A claim's adoption and the operator's own status writes are such
// changes: in a burst of 1,000 warm claims each would otherwise cost a
// reconcile and a SPACE GET. The resync still looks at every object.
func sameForReconcile(a, b *Sandbox) bool {
	am, bm := a.Metadata, b.Metadata
	return am.Generation == bm.Generation && (am.DeletionTimestamp == nil) == (bm.DeletionTimestamp == nil) &&
		slices.Equal(am.Finalizers, bm.Finalizers) && maps.Equal(am.Annotations, bm.Annotations)
}

// poolKeyForLabel maps a warm-pool label value back to the pool's key
// (the value is the pool name, or its hash when the name is too long for
// a label value). Called with o.mu held.
func poolKeyForLabel(o *Operator, ns, v string) string {
	for k, p := range o.pools {
		if p.Metadata.Namespace == ns && poolLabel(p.Metadata.Name) == v {
			return k
		}
	}
	return ns + "/" + v
}

// poolLabel is the warm-pool label value of a pool's sandboxes.
func poolLabel(name string) string {
	if len(name) <= 63 {
		return name
	}
	return "h-" + shortHash(name)
}

// router sends Sandboxes and templates to one queue and claims and pools
// to another, each with its own workers: a Sandbox reconcile waits for its
// SPACE create (tens of milliseconds to seconds), and a burst of them (a
// pool refilling) must not hold up claims, which only write objects.
type router struct{ sandboxes, claims *queue }

func (r *router) pick(key string) *queue {
	if strings.HasPrefix(key, kClaim) || strings.HasPrefix(key, kPool) {
		return r.claims
	}
	return r.sandboxes
}

func (r *router) add(key string)                       { r.pick(key).add(key) }
func (r *router) addAfter(key string, d time.Duration) { r.pick(key).addAfter(key, d) }
func (r *router) close()                               { r.sandboxes.close(); r.claims.close() }

func (o *Operator) worker(ctx context.Context, q *queue) {
	for {
		key, ok := q.get()
		if !ok {
			return
		}
		after, err := o.reconcile(ctx, key)
		q.done(key)
		if err != nil && ctx.Err() == nil {
			o.log.Warn("operator: reconcile failed", "key", key, "err", err)
			if after <= 0 || after > 5*time.Second {
				after = time.Second
			}
		}
		if after > 0 && ctx.Err() == nil {
			o.q.addAfter(key, after)
		}
	}
}

// reconcile dispatches on the key's kind; the duration asks for another
// reconcile after that long.
func (o *Operator) reconcile(ctx context.Context, key string) (time.Duration, error) {
	ns, name := splitKey(key[2:])
	switch key[:2] {
	case kSandbox:
		return o.reconcileSandbox(ctx, ns, name)
	case kClaim:
		return o.reconcileClaim(ctx, ns, name)
	case kTemplate:
		return o.reconcileTemplate(ctx, ns, name)
	case kPool:
		return o.reconcilePool(ctx, ns, name)
	}
	return 0, fmt.Errorf("unknown key %q", key)
}

// ---- shared helpers --------------------------------------------------------

func boolPtr(b bool) *bool { return &b }

func ownerRef(kind, group string, m ObjectMeta) OwnerReference {
	return OwnerReference{APIVersion: group + "/" + Version, Kind: kind, Name: m.Name, UID: m.UID,
		Controller: boolPtr(true), BlockOwnerDeletion: boolPtr(true)}
}

func hasFinalizer(m ObjectMeta) bool {
	for _, f := range m.Finalizers {
		if f == Finalizer {
			return true
		}
	}
	return false
}

func withoutFinalizer(fs []string) []string {
	out := []string{}
	for _, f := range fs {
		if f != Finalizer {
			out = append(out, f)
		}
	}
	return out
}

func withFinalizer(fs []string) []string {
	for _, f := range fs {
		if f == Finalizer {
			return fs
		}
	}
	return append(append([]string(nil), fs...), Finalizer)
}

// setCondition sets c in conds, keeping the transition time when the
// status did not change.
func setCondition(conds []Condition, c Condition, now time.Time) []Condition {
	out := make([]Condition, 0, len(conds)+1)
	found := false
	for _, old := range conds {
		if old.Type != c.Type {
			out = append(out, old)
			continue
		}
		found = true
		c.LastTransitionTime = old.LastTransitionTime
		if old.Status != c.Status || c.LastTransitionTime.IsZero() {
			c.LastTransitionTime = now
		}
		out = append(out, c)
	}
	if !found {
		c.LastTransitionTime = now
		out = append(out, c)
	}
	return out
}

// conditionTime is now as metav1.Time stores it (seconds, UTC), so that a
// condition read back compares equal to the one written.
func conditionTime() time.Time { return time.Now().UTC().Truncate(time.Second) }

// sameConditions compares conditions but for their transition times.
func sameConditions(a, b []Condition) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		x.LastTransitionTime, y.LastTransitionTime = time.Time{}, time.Time{}
		if x != y {
			return false
		}
	}
	return true
}

func findCondition(conds []Condition, t string) *Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

// message of an error for a condition: an Unsupported names its field.
func message(err error) string {
	var u *Unsupported
	if errors.As(err, &u) {
		return "SPACE cannot honour " + u.Error()
	}
	return err.Error()
}

func isSpaceNotFound(err error) bool { return client.IsNotFound(err) }

// isConflict: SPACE answered 409 (the sandbox is already in that state,
// or already being deleted).
func isConflict(err error) bool { return errors.Is(err, client.ErrConflict) }

// put caches the object a write answered with, so the next reconcile does
// not act on the version before it (the watch brings the same one later).
func (o *Operator) put(r Resource, obj any) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return
	}
	o.observe(r, "MODIFIED", raw)
}
