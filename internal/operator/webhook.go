package operator

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"
)

// Validate refuses, before it is stored, an object SPACE cannot honour:
// the same checks the reconcile reports as Ready=False Unsupported, so
// with the webhook installed the user sees the refusal from kubectl;
// without it (or for objects stored before it) the condition remains.
// kind is the object's kind; raw its JSON. nil: allowed.
func Validate(kind string, raw json.RawMessage) error {
	switch kind {
	case "Sandbox":
		var sb Sandbox
		if err := json.Unmarshal(raw, &sb); err != nil {
			return err
		}
		pv, err := parsePod(sb.Spec.PodTemplate)
		if err != nil {
			return err
		}
		if len(sb.Spec.VolumeClaimTemplates) > 0 {
			return &Unsupported{"spec.volumeClaimTemplates", "SPACE sandboxes have their own writable layer and snapshots, not persistent volume claims"}
		}
		// The operator's own Sandboxes carry their template's annotations.
		if _, err := spaceTemplate(sb.Metadata.Annotations, pv); err != nil {
			return err
		}
	case "SandboxTemplate":
		var t SandboxTemplate
		if err := json.Unmarshal(raw, &t); err != nil {
			return err
		}
		pv, err := parsePod(t.Spec.PodTemplate)
		if err != nil {
			return err
		}
		if _, err := spaceTemplate(t.Metadata.Annotations, pv); err != nil {
			return err
		}
		if _, err := networkPolicy(&t); err != nil {
			return err
		}
	case "SandboxClaim":
		var c SandboxClaim
		if err := json.Unmarshal(raw, &c); err != nil {
			return err
		}
		if len(c.Spec.VolumeClaimTemplates) > 0 {
			return &Unsupported{"spec.volumeClaimTemplates", "SPACE sandboxes have no persistent volume claims"}
		}
	}
	return nil
}

// admissionReview is the admission.k8s.io/v1 AdmissionReview, request and
// response halves, as far as a validating webhook needs them.
type admissionReview struct {
	APIVersion string             `json:"apiVersion"`
	Kind       string             `json:"kind"`
	Request    *admissionRequest  `json:"request,omitempty"`
	Response   *admissionResponse `json:"response,omitempty"`
}

type admissionRequest struct {
	UID  string `json:"uid"`
	Kind struct {
		Group   string `json:"group"`
		Version string `json:"version"`
		Kind    string `json:"kind"`
	} `json:"kind"`
	Operation string          `json:"operation"`
	Object    json.RawMessage `json:"object"`
	OldObject json.RawMessage `json:"oldObject"`
}

type admissionResponse struct {
	UID     string           `json:"uid"`
	Allowed bool             `json:"allowed"`
	Status  *admissionStatus `json:"status,omitempty"`
}

// admissionStatus is the metav1.Status of a refusal: its message is what
// kubectl shows.
type admissionStatus struct {
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// WebhookHandler serves the validating webhook at any path (deploy/
// operator/webhook.yaml uses /validate).
func WebhookHandler(log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rev admissionReview
		body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		if err == nil {
			err = json.Unmarshal(body, &rev)
		}
		if err != nil || rev.Request == nil {
			http.Error(w, `{"error":{"code":"bad_request","message":"not an AdmissionReview"}}`, http.StatusBadRequest)
			return
		}
		resp := &admissionResponse{UID: rev.Request.UID, Allowed: true}
		if err := validateRequest(rev.Request); err != nil {
			resp.Allowed = false
			resp.Status = &admissionStatus{Code: http.StatusUnprocessableEntity, Reason: "Invalid", Message: message(err)}
			log.Info("operator: webhook refused", "kind", rev.Request.Kind.Kind, "operation", rev.Request.Operation, "err", err)
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(admissionReview{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview", Response: resp})
	})
}

// validateRequest checks a create, and an update that changes the spec of
// an object not being deleted: the operator's own writes to an object
// stored before the webhook (its finalizer's removal) must not be refused.
func validateRequest(req *admissionRequest) error {
	if req.Operation == "UPDATE" {
		var obj, old struct {
			Metadata ObjectMeta     `json:"metadata"`
			Spec     map[string]any `json:"spec"`
		}
		if json.Unmarshal(req.Object, &obj) == nil && json.Unmarshal(req.OldObject, &old) == nil {
			if obj.Metadata.DeletionTimestamp != nil {
				return nil
			}
			a, _ := json.Marshal(obj.Spec)
			b, _ := json.Marshal(old.Spec)
			if bytes.Equal(a, b) {
				return nil
			}
		}
	}
	return Validate(req.Kind.Kind, req.Object)
}

// certFiles serves a certificate pair read from disk, read again when
// the files change (cert-manager renews the Secret mounted there).
type certFiles struct {
	cert, key string
	mu        sync.Mutex
	mod       time.Time
	pair      *tls.Certificate
}

func (c *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	st, err := os.Stat(c.cert)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pair != nil && st.ModTime().Equal(c.mod) {
		return c.pair, nil
	}
	pair, err := tls.LoadX509KeyPair(c.cert, c.key)
	if err != nil {
		return nil, fmt.Errorf("webhook certificate: %w", err)
	}
	c.pair, c.mod = &pair, st.ModTime()
	return c.pair, nil
}

// NewWebhookServer is the webhook's TLS server on addr with the pair in
// certDir (tls.crt, tls.key); an error when the files are missing.
func NewWebhookServer(addr, certDir string, log *slog.Logger) (*http.Server, error) {
	cf := &certFiles{cert: certDir + "/tls.crt", key: certDir + "/tls.key"}
	if _, err := cf.get(nil); err != nil {
		return nil, err
	}
	return &http.Server{Addr: addr, Handler: WebhookHandler(log), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: cf.get}}, nil
}
