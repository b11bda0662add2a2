package server

import (
	"context"
	"errors"
	"testing"

	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/core"
)

// TestResyncOnlyCurrentPolicy: a node takes resent secrets only for the
// credentials of the policy it applies to the sandbox now; a resync that
// read an older policy (or names a sandbox whose policy attaches none, or
// that the node does not run) is refused before the gateway is touched.
func TestResyncOnlyCurrentPolicy(t *testing.T) {
	ctx := context.Background()
	rt := &trackedRuntime{eg: &egressRuntime{}, net: netState{creds: map[string][]string{}}}
	cred := func(id string) cluster.Credential {
		return cluster.Credential{Info: core.Credential{ID: id}, Secret: []byte("s")}
	}
	rt.net.set("sbx-0000000000000001", &core.NetworkPolicy{Credentials: []string{"cred-000000000000000a"}})
	for name, c := range map[string]struct {
		id    string
		creds []cluster.Credential
	}{
		"detached since":       {"sbx-0000000000000001", []cluster.Credential{cred("cred-000000000000000b")}},
		"one more than policy": {"sbx-0000000000000001", []cluster.Credential{cred("cred-000000000000000a"), cred("cred-000000000000000b")}},
		"unknown sandbox":      {"sbx-0000000000000002", []cluster.Credential{cred("cred-000000000000000a")}},
	} {
		if err := rt.SetSandboxCredentials(ctx, core.Sandbox{ID: c.id}, c.creds); !errors.Is(err, core.ErrConflict) {
			t.Errorf("%s: %v, want a conflict", name, err)
		}
	}
	// A policy change that drops the credentials forgets them too.
	rt.net.set("sbx-0000000000000001", &core.NetworkPolicy{Mode: "allowlist"})
	if err := rt.SetSandboxCredentials(ctx, core.Sandbox{ID: "sbx-0000000000000001"}, []cluster.Credential{cred("cred-000000000000000a")}); !errors.Is(err, core.ErrConflict) {
		t.Errorf("after the policy dropped it: %v", err)
	}
	// Without the egress gateway: unavailable.
	if err := (&trackedRuntime{}).SetSandboxCredentials(ctx, core.Sandbox{ID: "sbx-0000000000000001"}, nil); !errors.Is(err, core.ErrUnavailable) {
		t.Errorf("no gateway: %v", err)
	}
}
