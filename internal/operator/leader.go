package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"
)

// ResLease is coordination.k8s.io's Lease, the lock of leader election.
var ResLease = Resource{"coordination.k8s.io", "v1", "leases", true}

// Lease is the part of a coordination.k8s.io/v1 Lease the election uses.
type Lease struct {
	APIVersion string     `json:"apiVersion,omitempty"`
	Kind       string     `json:"kind,omitempty"`
	Metadata   ObjectMeta `json:"metadata"`
	Spec       LeaseSpec  `json:"spec"`
}

// LeaseSpec holds the holder and its last renewal (MicroTime strings).
type LeaseSpec struct {
	HolderIdentity       string `json:"holderIdentity,omitempty"`
	LeaseDurationSeconds int32  `json:"leaseDurationSeconds,omitempty"`
	AcquireTime          string `json:"acquireTime,omitempty"`
	RenewTime            string `json:"renewTime,omitempty"`
	LeaseTransitions     int32  `json:"leaseTransitions,omitempty"`
}

// LeaderOptions configure leader election: several operator replicas
// share one Lease and only its holder reconciles, so two replicas never
// hand one warm sandbox to two claims.
type LeaderOptions struct {
	Namespace, Name, Identity string
	// Duration is how long a holder that stopped renewing keeps the lease
	// (default 15 s); Renew how often the holder renews (default 2 s);
	// Deadline how long the holder may fail to renew before it gives up
	// leading (default 10 s, less than Duration, so it has stopped before
	// another replica can take over).
	Duration, Renew, Deadline time.Duration
	Logger                    *slog.Logger
}

// ErrLostLease: the holder could not renew within its deadline.
var ErrLostLease = errors.New("leader election: lease lost")

const microTime = "2006-01-02T15:04:05.000000Z07:00"

// RunLeader waits until it holds the Lease, then runs fn with a context
// that ends when the lease is lost (fn's result is then ErrLostLease) or
// ctx ends (the lease is released, so another replica takes over at
// once rather than after Duration).
func RunLeader(ctx context.Context, kube *Kube, lo LeaderOptions, fn func(context.Context) error) error {
	if lo.Duration <= 0 {
		lo.Duration = 15 * time.Second
	}
	if lo.Renew <= 0 {
		lo.Renew = 2 * time.Second
	}
	if lo.Deadline <= 0 || lo.Deadline >= lo.Duration {
		lo.Deadline = lo.Duration * 2 / 3
	}
	if lo.Logger == nil {
		lo.Logger = slog.Default()
	}
	e := &elector{kube: kube, lo: lo}
	lo.Logger.Info("operator: waiting for the leader lease", "lease", lo.Namespace+"/"+lo.Name, "identity", lo.Identity)
	for {
		ok, err := e.try(ctx)
		if err != nil && ctx.Err() == nil {
			lo.Logger.Warn("operator: leader election", "err", err)
		}
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(lo.Renew):
		}
	}
	lo.Logger.Info("operator: leading", "lease", lo.Namespace+"/"+lo.Name, "identity", lo.Identity)
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan error, 1)
	go func() { done <- fn(lctx) }()
	lastRenew := time.Now()
	t := time.NewTicker(lo.Renew)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			e.release()
			if context.Cause(lctx) == ErrLostLease {
				return ErrLostLease
			}
			return err
		case <-t.C:
			ok, err := e.try(lctx)
			if ok {
				lastRenew = time.Now()
				continue
			}
			if err != nil {
				lo.Logger.Warn("operator: renewing the leader lease", "err", err)
			}
			if !ok && err == nil || time.Since(lastRenew) > lo.Deadline {
				lo.Logger.Error("operator: lost the leader lease, stopping", "identity", lo.Identity)
				cancel(ErrLostLease)
			}
		}
	}
}

type elector struct {
	kube *Kube
	lo   LeaderOptions
	// The record last seen and when this replica saw it change: expiry is
	// judged by this replica's clock from that moment, not by the
	// holder's renewTime, so clock skew between nodes does not matter.
	seen   LeaseSpec
	seenAt time.Time
}

// try acquires or renews the lease: true when this replica holds it; an
// error only for a failed call (another holder is false, nil).
func (e *elector) try(ctx context.Context) (bool, error) {
	now := time.Now()
	var l Lease
	err := e.kube.Get(ctx, ResLease, e.lo.Namespace, e.lo.Name, &l)
	if IsNotFound(err) {
		l = Lease{APIVersion: "coordination.k8s.io/v1", Kind: "Lease",
			Metadata: ObjectMeta{Name: e.lo.Name, Namespace: e.lo.Namespace},
			Spec: LeaseSpec{HolderIdentity: e.lo.Identity, LeaseDurationSeconds: int32(e.lo.Duration / time.Second),
				AcquireTime: now.UTC().Format(microTime), RenewTime: now.UTC().Format(microTime)}}
		err = e.kube.Create(ctx, ResLease, e.lo.Namespace, l, nil)
		if IsAlreadyExists(err) {
			return false, nil
		}
		return err == nil, err
	}
	if err != nil {
		return false, err
	}
	if l.Spec != e.seen {
		e.seen, e.seenAt = l.Spec, now
	}
	held := l.Spec.HolderIdentity != "" && l.Spec.HolderIdentity != e.lo.Identity
	dur := time.Duration(l.Spec.LeaseDurationSeconds) * time.Second
	if held && now.Before(e.seenAt.Add(dur)) {
		return false, nil
	}
	if l.Spec.HolderIdentity != e.lo.Identity {
		l.Spec.AcquireTime = now.UTC().Format(microTime)
		l.Spec.LeaseTransitions++
	}
	l.Spec.HolderIdentity = e.lo.Identity
	l.Spec.LeaseDurationSeconds = int32(e.lo.Duration / time.Second)
	l.Spec.RenewTime = now.UTC().Format(microTime)
	// An update with the read resourceVersion: of two replicas taking an
	// expired lease at once, one gets a conflict.
	err = e.kube.Do(ctx, http.MethodPut, ResLease.Path(e.lo.Namespace, e.lo.Name, ""), "", l, nil)
	if IsConflict(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("update lease: %w", err)
	}
	return true, nil
}

// release gives the lease up on a clean stop.
func (e *elector) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var l Lease
	if err := e.kube.Get(ctx, ResLease, e.lo.Namespace, e.lo.Name, &l); err != nil || l.Spec.HolderIdentity != e.lo.Identity {
		return
	}
	l.Spec.HolderIdentity = ""
	l.Spec.LeaseDurationSeconds = 1
	if err := e.kube.Do(ctx, http.MethodPut, ResLease.Path(e.lo.Namespace, e.lo.Name, ""), "", l, nil); err != nil {
		e.lo.Logger.Warn("operator: releasing the leader lease", "err", err)
	}
}
