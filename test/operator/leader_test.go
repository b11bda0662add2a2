package operator_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/operator"
)

// leaseHolder reads the operators' Lease; "" when there is none yet.
func leaseHolder(c *cluster) (operator.Lease, error) {
	var l operator.Lease
	err := c.admin.Get(context.Background(), operator.ResLease, "space", "space-operator", &l)
	return l, err
}

func holds(p *operatorProc, l operator.Lease) bool {
	return strings.HasSuffix(l.Spec.HolderIdentity, fmt.Sprintf("_%d", p.cmd.Process.Pid))
}

func logHas(t *testing.T, p *operatorProc, s string) bool {
	t.Helper()
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), s)
}

// TestLeaderElection runs two operator replicas on one cluster: only the
// holder of the Lease reconciles, and killing it (no release, as a crash)
// hands the lease to the standby within the lease duration, which then
// serves the claim made meanwhile.
func TestLeaderElection(t *testing.T) {
	c := startCluster(t)
	srv, key := spaceServer(t)
	a := startOperator(t, c, srv, key, "operator-a")
	waitFor(t, time.Minute, "operator-a leading", func() error {
		l, err := leaseHolder(c)
		if err != nil {
			return err
		}
		if !holds(a, l) {
			return fmt.Errorf("holder %q", l.Spec.HolderIdentity)
		}
		return nil
	})
	b := startOperator(t, c, srv, key, "operator-b")
	waitFor(t, time.Minute, "operator-b standing by", func() error {
		if !logHas(t, b, "waiting for the leader lease") {
			return fmt.Errorf("no log line yet")
		}
		return nil
	})
	c.create(t, "", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}})
	c.create(t, ns, templateObj("busy"))
	c.create(t, ns, poolObj("pool", "busy", 2))
	c.create(t, ns, claimObj("l1", "pool", nil))
	waitClaimReady(t, c, "l1", 2*time.Minute)
	if !logHas(t, a, "claim="+ns+"/l1") {
		t.Fatal("the leader did not serve claim l1")
	}
	if logHas(t, b, "claim ready") || logHas(t, b, "operator: leading") {
		t.Fatal("the standby reconciled while the other replica held the lease")
	}

	before, err := leaseHolder(c)
	if err != nil {
		t.Fatal(err)
	}
	a.kill()
	killed := time.Now()
	c.create(t, ns, claimObj("l2", "pool", nil))
	waitClaimReady(t, c, "l2", 2*time.Minute)
	t.Logf("claim made after the leader was killed Ready in %v (lease duration 4 s)", time.Since(killed).Round(time.Millisecond))
	l, err := leaseHolder(c)
	if err != nil {
		t.Fatal(err)
	}
	if !holds(b, l) || l.Spec.LeaseTransitions <= before.Spec.LeaseTransitions {
		t.Fatalf("lease after failover: %+v (before %+v)", l.Spec, before.Spec)
	}
	if !logHas(t, b, "claim="+ns+"/l2") {
		t.Fatal("the new leader did not serve claim l2")
	}
}
