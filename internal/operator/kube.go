package operator

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Kube is a small typed REST client for the Kubernetes API: the handful of
// verbs the operator needs (list, watch, get, create, merge-patch, delete)
// over one HTTP/2 connection. client-go would bring tens of MiB into the
// single space binary for the same few calls, and its default client-side
// rate limit (5 QPS) is what makes claim bursts slow elsewhere.
type Kube struct {
	base  string
	hc    *http.Client
	watch *http.Client // no overall timeout: watches are long streams
	token string
}

// Resource names one API resource.
type Resource struct {
	Group, Version, Plural string
	Namespaced             bool
}

// The resources the operator reads and writes.
var (
	ResSandbox   = Resource{"agents.x-k8s.io", "v1beta1", "sandboxes", true}
	ResClaim     = Resource{"extensions.agents.x-k8s.io", "v1beta1", "sandboxclaims", true}
	ResTemplate  = Resource{"extensions.agents.x-k8s.io", "v1beta1", "sandboxtemplates", true}
	ResWarmPool  = Resource{"extensions.agents.x-k8s.io", "v1beta1", "sandboxwarmpools", true}
	ResSecret    = Resource{"", "v1", "secrets", true}
	ResEvent     = Resource{"", "v1", "events", true}
	ResCRD       = Resource{"apiextensions.k8s.io", "v1", "customresourcedefinitions", false}
	ResNamespace = Resource{"", "v1", "namespaces", false}
)

// StatusError is a non-2xx answer of the API server.
type StatusError struct {
	Code    int
	Reason  string
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("kubernetes: %d %s: %s", e.Code, e.Reason, e.Message)
}

// IsNotFound, IsConflict and IsAlreadyExists classify StatusErrors.
func IsNotFound(err error) bool { return statusCode(err) == http.StatusNotFound }
func IsConflict(err error) bool {
	return statusCode(err) == http.StatusConflict && !IsAlreadyExists(err)
}
func IsAlreadyExists(err error) bool {
	var s *StatusError
	return errors.As(err, &s) && s.Reason == "AlreadyExists"
}
func isGone(err error) bool { return statusCode(err) == http.StatusGone }

func statusCode(err error) int {
	var s *StatusError
	if errors.As(err, &s) {
		return s.Code
	}
	return 0
}

type kubeconfig struct {
	CurrentContext string `json:"current-context"`
	Clusters       []struct {
		Name    string `json:"name"`
		Cluster struct {
			Server                   string `json:"server"`
			CertificateAuthority     string `json:"certificate-authority"`
			CertificateAuthorityData string `json:"certificate-authority-data"`
			InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify"`
		} `json:"cluster"`
	} `json:"clusters"`
	Users []struct {
		Name string `json:"name"`
		User struct {
			Token                 string `json:"token"`
			TokenFile             string `json:"tokenFile"`
			ClientCertificate     string `json:"client-certificate"`
			ClientCertificateData string `json:"client-certificate-data"`
			ClientKey             string `json:"client-key"`
			ClientKeyData         string `json:"client-key-data"`
		} `json:"user"`
	} `json:"users"`
	Contexts []struct {
		Name    string `json:"name"`
		Context struct {
			Cluster string `json:"cluster"`
			User    string `json:"user"`
		} `json:"context"`
	} `json:"contexts"`
}

// pemOrFile returns inline base64 data, else the file's bytes, else nil.
func pemOrFile(data, file string) ([]byte, error) {
	if data != "" {
		return base64.StdEncoding.DecodeString(data)
	}
	if file != "" {
		return os.ReadFile(file)
	}
	return nil, nil
}

// NewKube connects with the kubeconfig at path; an empty path uses the
// pod's service account (in-cluster), else $KUBECONFIG, else ~/.kube/config.
func NewKube(path string) (*Kube, error) {
	if path == "" && os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		return inCluster()
	}
	if path == "" {
		path = os.Getenv("KUBECONFIG")
	}
	if path == "" {
		home, _ := os.UserHomeDir()
		path = home + "/.kube/config"
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(raw, &kc); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	ctxName, clusterName, userName := kc.CurrentContext, "", ""
	for _, c := range kc.Contexts {
		if c.Name == ctxName || ctxName == "" {
			clusterName, userName = c.Context.Cluster, c.Context.User
			break
		}
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	var server string
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		server = c.Cluster.Server
		ca, err := pemOrFile(c.Cluster.CertificateAuthorityData, c.Cluster.CertificateAuthority)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig CA: %w", err)
		}
		if ca != nil {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(ca) {
				return nil, errors.New("kubeconfig: no certificate in the CA data")
			}
			tlsCfg.RootCAs = pool
		}
		tlsCfg.InsecureSkipVerify = c.Cluster.InsecureSkipTLSVerify
	}
	if server == "" {
		return nil, fmt.Errorf("kubeconfig %s: no server for context %q", path, ctxName)
	}
	var token string
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		token = u.User.Token
		if u.User.TokenFile != "" {
			b, err := os.ReadFile(u.User.TokenFile)
			if err != nil {
				return nil, fmt.Errorf("kubeconfig token: %w", err)
			}
			token = strings.TrimSpace(string(b))
		}
		cert, err := pemOrFile(u.User.ClientCertificateData, u.User.ClientCertificate)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig client cert: %w", err)
		}
		key, err := pemOrFile(u.User.ClientKeyData, u.User.ClientKey)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig client key: %w", err)
		}
		if cert != nil && key != nil {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				return nil, fmt.Errorf("kubeconfig client certificate: %w", err)
			}
			tlsCfg.Certificates = []tls.Certificate{pair}
		}
	}
	return newKube(server, token, tlsCfg), nil
}

func inCluster() (*Kube, error) {
	const dir = "/var/run/secrets/kubernetes.io/serviceaccount/"
	token, err := os.ReadFile(dir + "token")
	if err != nil {
		return nil, fmt.Errorf("in-cluster token: %w", err)
	}
	ca, err := os.ReadFile(dir + "ca.crt")
	if err != nil {
		return nil, fmt.Errorf("in-cluster CA: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	server := "https://" + net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"))
	return newKube(server, strings.TrimSpace(string(token)), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}), nil
}

// NewKubeToken connects to server with a bearer token and the CA in caPEM
// (nil: the system roots). Tests use it with the API server's token file.
func NewKubeToken(server, token string, caPEM []byte) *Kube {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caPEM != nil {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caPEM)
		cfg.RootCAs = pool
	}
	return newKube(server, token, cfg)
}

func newKube(server, token string, tlsCfg *tls.Config) *Kube {
	tr := &http.Transport{
		TLSClientConfig:     tlsCfg,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	}
	return &Kube{base: strings.TrimRight(server, "/"), token: token,
		hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}, watch: &http.Client{Transport: tr}}
}

// Path is the URL path of a resource, a namespace's collection or one
// object (name), with an optional subresource.
func (r Resource) Path(ns, name, sub string) string {
	p := "/api/" + r.Version
	if r.Group != "" {
		p = "/apis/" + r.Group + "/" + r.Version
	}
	if r.Namespaced && ns != "" {
		p += "/namespaces/" + url.PathEscape(ns)
	}
	p += "/" + r.Plural
	if name != "" {
		p += "/" + url.PathEscape(name)
	}
	if sub != "" {
		p += "/" + sub
	}
	return p
}

// Do sends one request; body (if not nil) is JSON-encoded unless it is
// already []byte; out (if not nil) receives the decoded answer.
func (k *Kube) Do(ctx context.Context, method, path, contentType string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, ok := body.([]byte)
		if !ok {
			var err error
			if b, err = json.Marshal(body); err != nil {
				return fmt.Errorf("encode %s %s: %w", method, path, err)
			}
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, k.base+path, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		if contentType == "" {
			contentType = "application/json"
		}
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/json")
	if k.token != "" {
		req.Header.Set("Authorization", "Bearer "+k.token)
	}
	resp, err := k.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return decodeStatus(resp.StatusCode, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decode: %w", method, path, err)
		}
	}
	return nil
}

func decodeStatus(code int, data []byte) error {
	var st struct {
		Reason  string `json:"reason"`
		Message string `json:"message"`
	}
	if json.Unmarshal(data, &st) != nil || st.Message == "" {
		st.Message = strings.TrimSpace(string(data))
	}
	return &StatusError{Code: code, Reason: st.Reason, Message: st.Message}
}

// Get reads one object into out.
func (k *Kube) Get(ctx context.Context, r Resource, ns, name string, out any) error {
	return k.Do(ctx, http.MethodGet, r.Path(ns, name, ""), "", nil, out)
}

// Create posts obj to the namespace's collection; out gets the stored object.
func (k *Kube) Create(ctx context.Context, r Resource, ns string, obj, out any) error {
	return k.Do(ctx, http.MethodPost, r.Path(ns, "", ""), "", obj, out)
}

// MergePatch applies a JSON merge patch (RFC 7386) to an object or its
// subresource (sub "status").
func (k *Kube) MergePatch(ctx context.Context, r Resource, ns, name, sub string, patch, out any) error {
	return k.Do(ctx, http.MethodPatch, r.Path(ns, name, sub), "application/merge-patch+json", patch, out)
}

// Delete deletes one object; a missing one is not an error.
func (k *Kube) Delete(ctx context.Context, r Resource, ns, name string) error {
	err := k.Do(ctx, http.MethodDelete, r.Path(ns, name, ""), "", nil, nil)
	if IsNotFound(err) {
		return nil
	}
	return err
}

// List returns the items of a collection (all namespaces when ns is
// empty) as raw JSON, and the list's resourceVersion to watch from.
func (k *Kube) List(ctx context.Context, r Resource, ns string) ([]json.RawMessage, string, error) {
	var items []json.RawMessage
	cont := ""
	for {
		var page struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
				Continue        string `json:"continue"`
			} `json:"metadata"`
			Items []json.RawMessage `json:"items"`
		}
		q := "?limit=500"
		if cont != "" {
			q += "&continue=" + url.QueryEscape(cont)
		}
		if err := k.Do(ctx, http.MethodGet, r.Path(ns, "", "")+q, "", nil, &page); err != nil {
			return nil, "", err
		}
		items = append(items, page.Items...)
		if page.Metadata.Continue == "" {
			return items, page.Metadata.ResourceVersion, nil
		}
		cont = page.Metadata.Continue
	}
}

// WatchEvent is one event of a watch stream.
type WatchEvent struct {
	Type   string          `json:"type"` // ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
	Object json.RawMessage `json:"object"`
}

// Watch streams the collection's changes after resourceVersion rv to fn
// until ctx ends, the server closes the stream (nil error: watch again
// from the last version fn saw) or the version is too old (a 410 error:
// list again).
func (k *Kube) Watch(ctx context.Context, r Resource, ns, rv string, fn func(WatchEvent)) error {
	q := url.Values{"watch": {"true"}, "allowWatchBookmarks": {"true"}, "resourceVersion": {rv},
		"timeoutSeconds": {"300"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.base+r.Path(ns, "", "")+"?"+q.Encode(), nil)
	if err != nil {
		return fmt.Errorf("watch %s: %w", r.Plural, err)
	}
	req.Header.Set("Accept", "application/json")
	if k.token != "" {
		req.Header.Set("Authorization", "Bearer "+k.token)
	}
	resp, err := k.watch.Do(req)
	if err != nil {
		return fmt.Errorf("watch %s: %w", r.Plural, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return decodeStatus(resp.StatusCode, data)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	for sc.Scan() {
		var ev WatchEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("watch %s: decode: %w", r.Plural, err)
		}
		if ev.Type == "ERROR" {
			var st struct {
				Code    int    `json:"code"`
				Reason  string `json:"reason"`
				Message string `json:"message"`
			}
			_ = json.Unmarshal(ev.Object, &st)
			return &StatusError{Code: st.Code, Reason: st.Reason, Message: st.Message}
		}
		fn(ev)
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("watch %s: %w", r.Plural, err)
	}
	return nil
}
