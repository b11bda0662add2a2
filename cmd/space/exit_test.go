package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/space-sandbox/space/pkg/client"
)

// TestExplain checks the texts that say what to do: a refused connection
// names the server once and asks whether it runs; build failures get the
// RUN-has-no-network and registry hints.
func TestExplain(t *testing.T) {
	refused := fmt.Errorf("GET http://127.0.0.1:9/v1/sandboxes: %w", &url.Error{Op: "Get", URL: "http://127.0.0.1:9/v1/sandboxes?state=running",
		Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}})
	got := explain(refused)
	if !strings.Contains(got, "is the server running?") || strings.Count(got, "127.0.0.1:9") != 1 || strings.Contains(got, "state=") {
		t.Errorf("connection refused: %q", got)
	}
	op := func(kind, msg string) error {
		return &client.OperationError{Operation: client.Operation{ID: "op-1", Kind: kind, Target: "t", State: "failed",
			Error: &client.OpError{Code: "invalid_argument", Message: msg}}}
	}
	if got := explain(op("template.build", "step 2 (RUN pip install x): exited with code 1; output:\nno network")); !strings.Contains(got, "RUN steps run with no network") ||
		!strings.Contains(got, "space template logs op-1") {
		t.Errorf("failed RUN step: %q", got)
	}
	if got := explain(op("template.build", "pull ghcr.io/x: dial tcp: lookup ghcr.io: no such host")); !strings.Contains(got, "could not reach the image registry") {
		t.Errorf("unreachable registry: %q", got)
	}
	if got := explain(op("sandbox.create", "step 1 (RUN x): exited with code 1")); strings.Contains(got, "hint") {
		t.Errorf("a sandbox operation got a build hint: %q", got)
	}
	if got := explain(errors.New("plain")); got != "plain" {
		t.Errorf("plain error: %q", got)
	}
}
