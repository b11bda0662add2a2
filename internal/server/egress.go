package server

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/agent/client"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/egress"
	"github.com/space-sandbox/space/internal/egress/credstore"
	"github.com/space-sandbox/space/internal/egress/policy"
	"github.com/space-sandbox/space/internal/node"
)

// Where a sandbox's TLS-termination CA is installed, through its agent.
const (
	caBundle     = "/etc/ssl/certs/ca-certificates.crt"
	caLocal      = "/usr/local/share/ca-certificates/space-egress.crt"
	caBegin      = "# BEGIN space egress gateway CA (managed by SPACE)\n"
	caEnd        = "# END space egress gateway CA\n"
	maxCABundle  = 8 << 20
	caEnvDefault = caBundle
)

// caEnv points common TLS stacks that ignore the system bundle at it (or
// at the CA alone, where the variable adds to built-in roots).
var caEnv = map[string]string{
	"SSL_CERT_FILE":       caEnvDefault,
	"REQUESTS_CA_BUNDLE":  caEnvDefault,
	"PIP_CERT":            caEnvDefault,
	"CURL_CA_BUNDLE":      caEnvDefault,
	"NODE_EXTRA_CA_CERTS": caLocal,
}

// egressRuntime is the runtime of a server with the egress gateway: on top
// of the node's own policy handling it attaches credentials and
// pass-through rules, installs each sandbox's CA into its trust store, and
// hands out credential placeholders as environment variables.
type egressRuntime struct {
	*runtime
	net *egress.Network
	// creds opens attached credentials: the credential store of a server;
	// nil on a `space node`, whose servers send the secrets in each call.
	creds credResolver
	logf  func(string, ...any)
}

// credResolver opens a project's credentials (credstore.Store).
type credResolver interface {
	Resolve(ctx context.Context, projectID string, ids []string) ([]egress.Credential, []core.Credential, error)
}

var _ credResolver = (*credstore.Store)(nil)

func (r *egressRuntime) resolve(ctx context.Context, sb core.Sandbox, p *core.NetworkPolicy) ([]egress.Credential, []core.Credential, error) {
	if p == nil || len(p.Credentials) == 0 {
		return nil, nil, nil
	}
	if r.creds == nil {
		return nil, nil, fmt.Errorf("network: no credential store here: %w", core.ErrUnavailable)
	}
	creds, infos, err := r.creds.Resolve(ctx, sb.ProjectID, p.Credentials)
	if err != nil {
		if errors.Is(err, core.ErrNotFound) {
			return nil, nil, fmt.Errorf("network: %v: %w", err, core.ErrInvalid)
		}
		return nil, nil, err
	}
	return creds, infos, nil
}

// apply sets an instance's full egress state: credentials first, then the
// policy (with its pass-through rules).
func (r *egressRuntime) apply(instID string, p *core.NetworkPolicy, creds []egress.Credential) error {
	var parsed *policy.Policy
	if p != nil {
		var err error
		if parsed, err = policy.Parse(p.Mode, p.Allow); err != nil {
			return fmt.Errorf("network policy: %w", err)
		}
		if parsed, err = parsed.WithPassthrough(p.Passthrough); err != nil {
			return fmt.Errorf("network policy: %w", err)
		}
	}
	if err := r.net.GW.SetCredentials(instID, creds); err != nil {
		return fmt.Errorf("network credentials: %w", err)
	}
	if err := r.net.GW.SetPolicy(instID, parsed); err != nil {
		return fmt.Errorf("network policy: %w", err)
	}
	return nil
}

// installCA writes the instance's CA certificate into the sandbox's trust
// store through its agent (never through a host path): appended, between
// markers, to the system bundle (replacing an earlier one) and as its own
// file for update-ca-certificates.
func (r *egressRuntime) installCA(ctx context.Context, sandboxID, instID string) error {
	pemCA, err := r.net.GW.CACert(instID)
	if err != nil {
		return err
	}
	h, err := r.Node.Sandbox(sandboxID)
	if err != nil {
		return err
	}
	var bundle []byte
	// As root (uid 0, named so even where /etc/passwd has no root): the
	// trust store and resolv.conf are the system's, not the default user's.
	rc, _, err := h.Agent.As("0").Download(ctx, caBundle)
	switch {
	case err == nil:
		bundle, err = io.ReadAll(io.LimitReader(rc, maxCABundle+1))
		rc.Close()
		if err != nil {
			return fmt.Errorf("read %s: %w", caBundle, err)
		}
		if len(bundle) > maxCABundle {
			return fmt.Errorf("%s is larger than %d bytes", caBundle, maxCABundle)
		}
	case client.IsNotFound(err):
	default:
		return fmt.Errorf("read %s: %w", caBundle, err)
	}
	bundle = stripManaged(bundle)
	if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
		bundle = append(bundle, '\n')
	}
	bundle = append(append(append(bundle, caBegin...), pemCA...), caEnd...)
	if err := h.Agent.As("0").Upload(ctx, caBundle, 0o644, bytes.NewReader(bundle)); err != nil {
		return fmt.Errorf("write %s: %w", caBundle, err)
	}
	if err := h.Agent.As("0").Upload(ctx, caLocal, 0o644, bytes.NewReader(pemCA)); err != nil {
		return fmt.Errorf("write %s: %w", caLocal, err)
	}
	return r.installResolver(ctx, h, instID)
}

// installResolver gives a sandbox whose /etc/resolv.conf names no
// nameserver (templates built without one; glibc would then ask
// 127.0.0.1 inside the sandbox and never reach the gateway) its gateway
// address as resolver, through the agent. A file that names any
// nameserver is left alone: port 53 anywhere is redirected to the gateway
// resolver by the host rules (R5) whatever it says.
func (r *egressRuntime) installResolver(ctx context.Context, h *node.Sandbox, instID string) error {
	l, ok := r.net.Links.Get(instID)
	if !ok {
		return nil
	}
	var cur []byte
	rc, _, err := h.Agent.As("0").Download(ctx, resolvConf)
	switch {
	case err == nil:
		cur, err = io.ReadAll(io.LimitReader(rc, 64<<10))
		rc.Close()
		if err != nil {
			return fmt.Errorf("read %s: %w", resolvConf, err)
		}
	case client.IsNotFound(err):
	default:
		return fmt.Errorf("read %s: %w", resolvConf, err)
	}
	for _, line := range strings.Split(string(cur), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "nameserver" {
			return nil
		}
	}
	conf := fmt.Sprintf("%s# nameserver added by the SPACE egress gateway: the sandbox's gateway resolver\nnameserver %s\n", cur, l.Host)
	if err := h.Agent.As("0").Upload(ctx, resolvConf, 0o644, strings.NewReader(conf)); err != nil {
		return fmt.Errorf("write %s: %w", resolvConf, err)
	}
	return nil
}

const resolvConf = "/etc/resolv.conf"

// stripManaged removes a CA block an earlier install added.
func stripManaged(b []byte) []byte {
	s := string(b)
	for {
		i := strings.Index(s, caBegin)
		if i < 0 {
			return []byte(s)
		}
		j := strings.Index(s[i:], caEnd)
		if j < 0 {
			return []byte(s[:i])
		}
		s = s[:i] + s[i+j+len(caEnd):]
	}
}

// StartSandbox implements core.Runtime.
func (r *egressRuntime) StartSandbox(ctx context.Context, sb core.Sandbox, progress core.Progress) (core.Placement, error) {
	creds, infos, err := r.resolve(ctx, sb, sb.Network)
	if err != nil {
		return core.Placement{}, err
	}
	return r.startWith(ctx, sb, creds, infos, progress)
}

// startWith starts sb with its credentials already opened (infos: their
// bindings, for the placeholder variables).
func (r *egressRuntime) startWith(ctx context.Context, sb core.Sandbox, creds []egress.Credential, infos []core.Credential, progress core.Progress) (core.Placement, error) {
	env := make(map[string]string, len(sb.Env)+len(caEnv)+len(infos))
	for k, v := range caEnv {
		env[k] = v
	}
	for _, c := range infos {
		if c.Env != "" {
			env[c.Env] = c.Placeholder
		}
	}
	for k, v := range sb.Env {
		env[k] = v
	}
	sb.Env = env
	pl, err := r.runtime.StartSandbox(ctx, sb, progress)
	if err != nil {
		return pl, err
	}
	inst := pl.Instance
	err = r.apply(inst, sb.Network, creds)
	if err == nil {
		err = r.installCA(ctx, sb.ID, inst)
	}
	if err != nil {
		r.runtime.StopSandbox(context.WithoutCancel(ctx), sb.ID)
		return core.Placement{}, fmt.Errorf("egress: %w", err)
	}
	return pl, nil
}

// AdoptSandbox implements core.Runtime: the gateway made a new CA for the
// re-attached instance; install it and attach the credentials again.
func (r *egressRuntime) AdoptSandbox(ctx context.Context, sb core.Sandbox) error {
	if err := r.runtime.AdoptSandbox(ctx, sb); err != nil {
		return err
	}
	creds, _, err := r.resolve(ctx, sb, sb.Network)
	if err == nil {
		err = r.reattach(ctx, sb, creds)
	}
	if err != nil {
		// Fail closed: the node already applied the bare policy, with no
		// credentials; TLS to terminated names fails in the sandbox.
		r.logf("sandbox %s: egress after restart: %v", sb.ID, err)
	}
	return nil
}

// reattach gives an adopted sandbox its egress state again: its policy
// with creds, and the new CA in its trust store.
func (r *egressRuntime) reattach(ctx context.Context, sb core.Sandbox, creds []egress.Credential) error {
	inst := sb.Instance
	if inst == "" {
		inst = sb.ID
	}
	if err := r.apply(inst, sb.Network, creds); err != nil {
		return err
	}
	return r.installCA(ctx, sb.ID, inst)
}

// SetNetworkPolicy implements core.NetworkRuntime.
func (r *egressRuntime) SetNetworkPolicy(ctx context.Context, sb core.Sandbox, p core.NetworkPolicy) error {
	if _, err := r.Node.Sandbox(sb.ID); err != nil {
		return err
	}
	creds, _, err := r.resolve(ctx, sb, &p)
	if err != nil {
		return err
	}
	return r.setWith(sb, p, creds)
}

// setWith applies p with its credentials already opened.
func (r *egressRuntime) setWith(sb core.Sandbox, p core.NetworkPolicy, creds []egress.Credential) error {
	if _, err := r.Node.Sandbox(sb.ID); err != nil {
		return err
	}
	inst := sb.Instance
	if inst == "" {
		inst = sb.ID
	}
	return r.apply(inst, &p, creds)
}

// upstreamRoots adds the roots in file (if any) to base (nil: the system
// roots).
func upstreamRoots(base *x509.CertPool, file string) (*x509.CertPool, error) {
	if file == "" {
		return base, nil
	}
	pemData, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("upstream CA file: %w", err)
	}
	pool := base
	if pool == nil {
		if pool, err = x509.SystemCertPool(); err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
	} else {
		pool = pool.Clone()
	}
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, fmt.Errorf("upstream CA file %s holds no PEM certificate", file)
	}
	return pool, nil
}

// openCredentials opens the credential store under dataDir with the key
// from keyFile, or from the store's meta.
func openCredentials(ctx context.Context, dataDir, keyFile string, meta credstore.Meta, onDelete func(string)) (*credstore.Store, error) {
	var key []byte
	var err error
	if keyFile != "" {
		key, err = credstore.KeyFromFile(keyFile)
	} else {
		key, err = credstore.KeyFromMeta(ctx, meta)
	}
	if err != nil {
		return nil, err
	}
	return credstore.Open(filepath.Join(dataDir, "egress", "credentials"), key, onDelete)
}

// serveMetrics serves the gateway's Prometheus counters on addr ("" = off).
func serveMetrics(addr string, gw *egress.Gateway, logf func(string, ...any)) (*http.Server, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", gw.MetricsHandler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logf("metrics %s: %v", addr, err)
		}
	}()
	logf("egress: Prometheus counters on http://%s/metrics", ln.Addr())
	return srv, nil
}

// openNetwork starts the sandbox networks and the egress gateway of
// cfg.Egress (a server's, or a `space node`'s).
func openNetwork(cfg Config) (*egress.Network, error) {
	gc := cfg.Egress.Gateway
	if gc.Logf == nil {
		gc.Logf = cfg.Logf
	}
	lc := cfg.Egress.Links
	if lc.Logf == nil {
		lc.Logf = cfg.Logf
	}
	if lc.Owner == "" {
		lc.Owner = "data dir " + cfg.DataDir
	}
	var err error
	if gc.UpstreamRoots, err = upstreamRoots(gc.UpstreamRoots, cfg.Egress.UpstreamCAFile); err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	n, err := egress.NewNetwork(lc, gc)
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	return n, nil
}
