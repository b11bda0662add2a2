package operator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/space-sandbox/space/pkg/client"
)

// build is one SPACE template the operator made sure of: found, or built
// from an image or a build file.
type build struct {
	done     bool
	err      error
	finished time.Time
	waiters  map[string]bool // queue keys to reconcile when it is done
}

// buildRetry: a failed build is tried again after this long.
const buildRetry = time.Minute

// reconcileTemplate starts the SPACE template of a SandboxTemplate early,
// so that its warm pool and claims do not wait for the build. A template
// SPACE cannot honour is logged here and reported on every Sandbox made
// from it (SandboxTemplate has no status in v1beta1).
func (o *Operator) reconcileTemplate(_ context.Context, ns, name string) (time.Duration, error) {
	o.mu.Lock()
	t := o.templates[ns+"/"+name]
	o.mu.Unlock()
	if t == nil {
		return 0, nil
	}
	pv, err := parsePod(t.Spec.PodTemplate)
	if err == nil {
		_, err = networkPolicy(t)
	}
	var src templateSource
	if err == nil {
		src, err = spaceTemplate(t.Metadata.Annotations, pv)
	}
	if err != nil {
		o.log.Warn("operator: SandboxTemplate refused", "template", ns+"/"+name, "err", message(err))
		return 0, nil
	}
	if _, err := o.ensureTemplate(src, ""); err != nil {
		o.log.Warn("operator: SPACE template failed", "template", ns+"/"+name, "space_template", src.Name, "err", err)
	}
	return 0, nil
}

// ensureTemplate reports whether src's SPACE template is ready, starting
// its lookup or build once; waiter (a queue key) is reconciled when the
// build ends.
func (o *Operator) ensureTemplate(src templateSource, waiter string) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	b := o.builds[src.Name]
	if b != nil && b.done && b.err != nil && time.Since(b.finished) > buildRetry {
		b = nil
	}
	if b == nil {
		b = &build{waiters: map[string]bool{}}
		o.builds[src.Name] = b
		go o.runBuild(src, b)
	}
	if b.done {
		return b.err == nil, b.err
	}
	if waiter != "" {
		b.waiters[waiter] = true
	}
	return false, nil
}

// runBuild looks the template up and builds it when it is missing.
func (o *Operator) runBuild(src templateSource, b *build) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	err := o.buildTemplate(ctx, src)
	o.mu.Lock()
	b.done, b.err, b.finished = true, err, time.Now()
	waiters := b.waiters
	b.waiters = nil
	o.mu.Unlock()
	if err == nil {
		o.log.Info("operator: SPACE template ready", "template", src.Name)
	}
	for k := range waiters {
		o.q.add(k)
	}
}

func (o *Operator) buildTemplate(ctx context.Context, src templateSource) error {
	_, err := o.space.GetTemplate(ctx, src.Name)
	if err == nil {
		return nil
	}
	if !isSpaceNotFound(err) {
		return fmt.Errorf("look up: %w", err)
	}
	if src.Existing {
		return errors.New("SPACE has no template of this name")
	}
	var op client.Operation
	if src.Buildfile != "" {
		op, err = o.space.BuildTemplateFile(ctx, src.Name, []byte(src.Buildfile), nil, "k8s-build-"+src.Name)
	} else {
		op, err = o.space.BuildTemplate(ctx, client.TemplateBuildRequest{Name: src.Name, Source: "image", Image: src.Image}, "k8s-build-"+src.Name)
	}
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	o.log.Info("operator: building SPACE template", "template", src.Name, "image", src.Image, "operation", op.ID)
	if _, err := o.space.WaitOperation(ctx, op.ID); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	return nil
}

// templateFor returns the SandboxTemplate of a pool, or nil.
func (o *Operator) templateFor(ns, name string) *SandboxTemplate {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.templates[ns+"/"+name]
}

// spaceAnnotations are the space-sandbox.dev/ annotations a Sandbox made
// from a template carries over from it (the Sandbox reconcile also reads
// the template's; copying them keeps a Sandbox meaningful on its own).
func spaceAnnotations(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if strings.HasPrefix(k, "space-sandbox.dev/") {
			out[k] = v
		}
	}
	return out
}
