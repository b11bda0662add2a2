package operator

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func review(t *testing.T, op, kind, obj, old string) admissionResponse {
	t.Helper()
	req := map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{"uid": "u1", "kind": map[string]string{"group": "agents.x-k8s.io", "version": "v1beta1", "kind": kind},
			"operation": op, "object": json.RawMessage(obj), "oldObject": json.RawMessage(old)}}
	body, _ := json.Marshal(req)
	rec := httptest.NewRecorder()
	WebhookHandler(slog.New(slog.DiscardHandler)).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/validate", bytes.NewReader(body)))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var out admissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil || out.Response.UID != "u1" {
		t.Fatalf("answer %s: %v", rec.Body, err)
	}
	return *out.Response
}

func TestWebhookValidates(t *testing.T) {
	sidecar := `{"metadata":{"name":"x"},"spec":{"podTemplate":{"spec":{"containers":[{"name":"a","image":"i"},{"name":"b","image":"i"}]}}}}`
	one := `{"metadata":{"name":"x"},"spec":{"podTemplate":{"spec":{"containers":[{"name":"a","image":"i"}]}}}}`
	deleting := `{"metadata":{"name":"x","deletionTimestamp":"2026-01-01T00:00:00Z"},"spec":{"podTemplate":{"spec":{"containers":[{"name":"a","image":"i"},{"name":"b","image":"i"}]}}}}`
	if r := review(t, "CREATE", "Sandbox", sidecar, "null"); r.Allowed || r.Status == nil || !strings.Contains(r.Status.Message, "spec.podTemplate.spec.containers") {
		t.Errorf("sidecar allowed: %+v", r)
	}
	if r := review(t, "CREATE", "Sandbox", one, "null"); !r.Allowed {
		t.Errorf("one container refused: %+v", r.Status)
	}
	// An object stored before the webhook: the operator's metadata writes
	// (same spec) and its deletion pass; a spec change does not.
	if r := review(t, "UPDATE", "Sandbox", sidecar, sidecar); !r.Allowed {
		t.Errorf("update with the same spec refused: %+v", r.Status)
	}
	if r := review(t, "UPDATE", "Sandbox", deleting, sidecar); !r.Allowed {
		t.Errorf("update of an object being deleted refused: %+v", r.Status)
	}
	if r := review(t, "UPDATE", "Sandbox", sidecar, one); r.Allowed {
		t.Error("update adding a sidecar allowed")
	}
	if r := review(t, "CREATE", "SandboxClaim", `{"spec":{"warmPoolRef":{"name":"p"},"volumeClaimTemplates":[{}]}}`, "null"); r.Allowed {
		t.Error("claim with volumeClaimTemplates allowed")
	}
	if r := review(t, "CREATE", "SandboxWarmPool", `{"spec":{"replicas":3}}`, "null"); !r.Allowed {
		t.Error("warm pool refused")
	}
}
