package cluster

// A small CA for the node link (`space certs`), for installs without a PKI
// of their own: ECDSA P-256 keys, a CA that signs leaves only (path length
// 0), node certificates for server and client auth (a node also calls
// other nodes) naming the node and its addresses, server (replica)
// certificates for client auth only.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"

	"github.com/space-sandbox/space/internal/core"
)

// CertRole is what a certificate of the node link is for.
type CertRole string

// Roles of node link certificates.
const (
	RoleNode   CertRole = "node"   // serves the node RPC; may call other nodes
	RoleServer CertRole = "server" // a replica: calls nodes
)

// CertRequest describes a leaf certificate.
type CertRequest struct {
	Role CertRole
	// Name is the node's --name or the replica's --node-name: the
	// certificate's common name, and (nodes) a DNS name in it, which is
	// how a replica recognises the node whatever address it registered.
	Name string
	// Hosts are further DNS names or IP addresses of a node (its RPC
	// URL's host).
	Hosts    []string
	Validity time.Duration
}

// NewCA returns a CA certificate and its key (PEM).
func NewCA(commonName string, validity time.Duration, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"SPACE node link"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create CA certificate: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// IssueCert signs a leaf certificate for req with the CA (PEM in, PEM out).
func IssueCert(caCertPEM, caKeyPEM []byte, req CertRequest, now time.Time) (certPEM, keyPEM []byte, err error) {
	ca, caKey, err := parseCA(caCertPEM, caKeyPEM)
	if err != nil {
		return nil, nil, err
	}
	if !nodeNameOK(req.Name) {
		return nil, nil, fmt.Errorf("certificate name %.80q: want a node or server name (lower-case letters, digits, '.', '_', '-'): %w", req.Name, core.ErrInvalid)
	}
	tpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: req.Name, Organization: []string{"SPACE " + string(req.Role)}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(req.Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if tpl.NotAfter.After(ca.NotAfter) {
		tpl.NotAfter = ca.NotAfter
	}
	switch req.Role {
	case RoleNode:
		tpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		tpl.DNSNames = []string{req.Name}
		for _, h := range req.Hosts {
			if ip := net.ParseIP(h); ip != nil {
				tpl.IPAddresses = append(tpl.IPAddresses, ip)
			} else if h != "" {
				tpl.DNSNames = append(tpl.DNSNames, h)
			}
		}
	case RoleServer:
		if len(req.Hosts) > 0 {
			return nil, nil, fmt.Errorf("a server certificate is for client auth only: no hosts: %w", core.ErrInvalid)
		}
		tpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	default:
		return nil, nil, fmt.Errorf("certificate role %q: want node or server: %w", req.Role, core.ErrInvalid)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("create certificate: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

func parseCA(certPEM, keyPEM []byte) (*x509.Certificate, any, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, nil, errors.New("CA certificate: no PEM certificate")
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !ca.IsCA {
		return nil, nil, errors.New("CA certificate: not a CA")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, nil, errors.New("CA key: no PEM block")
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("CA key: %w", err)
	}
	pub, ok := key.(*ecdsa.PrivateKey)
	if !ok || !pub.PublicKey.Equal(ca.PublicKey) {
		return nil, nil, errors.New("CA key does not match the CA certificate")
	}
	return ca, key, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return n
}

// nodeNameOK is the node name rule (server.nodeNameRE): 1–63 of
// [a-z0-9._-], starting with a letter or digit.
func nodeNameOK(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || i > 0 && (r == '.' || r == '_' || r == '-')
		if !ok {
			return false
		}
	}
	return true
}
