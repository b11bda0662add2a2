package template

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// ErrPrivateRegistry is returned when an image reference resolves to a
// loopback, private or link-local address and Options.AllowPrivateRegistries
// is off: an API user must not make the server probe its own network.
var ErrPrivateRegistry = errors.New("template: registry address is not public")

const maxRefLen = 512

// remoteImage resolves ref (tag or digest) to one linux image for this
// node's architecture and reads its config.
func (m *Manager) remoteImage(ctx context.Context, ref string) (*ociImage, error) {
	tr := m.registryTransport()
	out, err := m.resolveRemote(ctx, ref, tr)
	if err != nil {
		tr.CloseIdleConnections()
	}
	return out, err
}

func (m *Manager) resolveRemote(ctx context.Context, ref string, tr *http.Transport) (*ociImage, error) {
	if ref == "" || len(ref) > maxRefLen || strings.ContainsAny(ref, "\x00\n\r\t ") {
		return nil, fmt.Errorf("%w: image reference %.80q", ErrInvalid, ref)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: image reference %q: %w", ErrInvalid, ref, err)
	}
	if !m.opts.AllowPrivateRegistries {
		if err := checkRegistryHost(ctx, r.Context().RegistryStr()); err != nil {
			return nil, err
		}
	}
	kc, err := m.keychain()
	if err != nil {
		return nil, err
	}
	opts := func(ctx context.Context) []remote.Option {
		return []remote.Option{
			remote.WithContext(ctx),
			remote.WithAuthFromKeychain(kc),
			remote.WithTransport(tr),
			remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
			remote.WithUserAgent("space-template"),
		}
	}
	img, err := remote.Image(r, opts(ctx)...)
	if err != nil {
		return nil, fmt.Errorf("template: pull %s: %w", ref, err)
	}
	mf, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("template: pull %s: manifest: %w", ref, err)
	}
	if mf.Config.Size <= 0 || mf.Config.Size > maxConfigBytes {
		return nil, fmt.Errorf("%w: image config of %d bytes", ErrLimit, mf.Config.Size)
	}
	if len(mf.Layers) > maxLayers {
		return nil, fmt.Errorf("%w: image has %d layers (at most %d)", ErrLimit, len(mf.Layers), maxLayers)
	}
	md, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("template: pull %s: %w", ref, err)
	}
	raw, err := img.RawConfigFile() // verified against the manifest's config digest
	if err != nil {
		return nil, fmt.Errorf("template: pull %s: config: %w", ref, err)
	}
	cfg, err := v1.ParseConfigFile(strings.NewReader(string(raw)))
	if err != nil {
		return nil, fmt.Errorf("%w: image config: %w", ErrUnsafeInput, err)
	}
	out := &ociImage{ref: r.String(), manifestDigest: md.String(), configDigest: mf.Config.Digest.String(), config: cfg, close: tr.CloseIdleConnections}
	for _, d := range mf.Layers {
		out.layers = append(out.layers, ociLayer{digest: d.Digest.String(), size: d.Size,
			open: func(ctx context.Context) (io.ReadCloser, error) {
				l, err := remote.Layer(r.Context().Digest(d.Digest.String()), opts(ctx)...)
				if err != nil {
					return nil, err
				}
				return l.Compressed() // verified against the digest at EOF
			}})
	}
	return out, nil
}

// registryTransport dials only public addresses unless told otherwise; the
// check runs on the address actually dialled, so DNS rebinding and
// redirects to internal hosts are caught too.
func (m *Manager) registryTransport() *http.Transport {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if !m.opts.AllowPrivateRegistries {
		d.Control = func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: %s", ErrPrivateRegistry, address)
			}
			if !publicAddr(ap.Addr()) {
				return fmt.Errorf("%w: %s", ErrPrivateRegistry, address)
			}
			return nil
		}
	}
	return &http.Transport{
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// publicAddr reports whether a registry may be dialled at a.
func publicAddr(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsGlobalUnicast() && !a.IsPrivate() && !a.IsLoopback() && !a.IsLinkLocalUnicast() && !cgnat.Contains(a)
}

// checkRegistryHost resolves a registry's host and refuses it when any of
// its addresses is not public, before anything is dialled (a name with
// one public and one internal address is refused outright, rather than
// depending on which one a dial picks; the dialer checks again).
func checkRegistryHost(ctx context.Context, hostport string) error {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if a, err := netip.ParseAddr(host); err == nil {
		if !publicAddr(a) {
			return fmt.Errorf("%w: %s", ErrPrivateRegistry, hostport)
		}
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(rctx, "ip", host)
	if err != nil {
		return fmt.Errorf("template: resolve registry %s: %w", host, err)
	}
	for _, a := range addrs {
		if !publicAddr(a) {
			return fmt.Errorf("%w: %s resolves to %s", ErrPrivateRegistry, host, a)
		}
	}
	return nil
}

// dockerConfigPath is Options.DockerConfig, else $DOCKER_CONFIG/config.json,
// else ~/.docker/config.json.
func (m *Manager) dockerConfigPath() string {
	if m.opts.DockerConfig != "" {
		return m.opts.DockerConfig
	}
	if d := os.Getenv("DOCKER_CONFIG"); d != "" {
		return filepath.Join(d, "config.json")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".docker", "config.json")
	}
	return ""
}

// dockerConfig is the part of Docker's config.json used for registry auth.
// Credential helpers (credsStore, credHelpers) are not run: a server should
// not execute programs named by a config file.
type dockerConfig struct {
	Auths map[string]struct {
		Auth          string `json:"auth"`
		Username      string `json:"username"`
		Password      string `json:"password"`
		IdentityToken string `json:"identitytoken"`
		RegistryToken string `json:"registrytoken"`
	} `json:"auths"`
}

// keychain reads the docker config once per build.
func (m *Manager) keychain() (authn.Keychain, error) {
	p := m.dockerConfigPath()
	if p == "" {
		return configKeychain{}, nil
	}
	b, err := readBounded(p, 1<<20)
	if errors.Is(err, os.ErrNotExist) {
		return configKeychain{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("template: docker config: %w", err)
	}
	var c dockerConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("template: docker config %s: %w", p, err)
	}
	kc := configKeychain{}
	for k, a := range c.Auths {
		ac := authn.AuthConfig{Username: a.Username, Password: a.Password, IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}
		if a.Auth != "" {
			dec, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return nil, fmt.Errorf("template: docker config %s: auth for %q: %w", p, k, err)
			}
			u, pw, ok := strings.Cut(string(dec), ":")
			if !ok {
				return nil, fmt.Errorf("template: docker config %s: auth for %q is not user:password", p, k)
			}
			ac.Username, ac.Password = u, pw
		}
		kc[registryHost(k)] = ac
	}
	return kc, nil
}

// registryHost normalises a config.json key ("https://index.docker.io/v1/",
// "ghcr.io", "http://127.0.0.1:5000") to the registry's host[:port].
func registryHost(k string) string {
	k = strings.TrimPrefix(strings.TrimPrefix(k, "https://"), "http://")
	k, _, _ = strings.Cut(k, "/")
	if k == "docker.io" || k == "registry-1.docker.io" {
		return name.DefaultRegistry
	}
	return k
}

// configKeychain maps registry host → credentials; unknown hosts are
// anonymous.
type configKeychain map[string]authn.AuthConfig

func (kc configKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if ac, ok := kc[r.RegistryStr()]; ok {
		return authn.FromConfig(ac), nil
	}
	return authn.Anonymous, nil
}
