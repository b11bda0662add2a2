package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// certFiles serves the data listener's certificate from the operator's
// PEM files (a wildcard certificate for *.<sandbox domain>, so that E2B's
// getHost() URLs, https://<port>-<id>.<domain>, verify). A renewed
// certificate is picked up without a restart: the files are looked at
// again, at most once a second, when a handshake comes.
type certFiles struct {
	cert, key string

	mu      sync.Mutex
	cur     *tls.Certificate
	stamp   [2]time.Time // modification times of cur's files
	checked time.Time
}

// dataTLS returns the data listener's TLS configuration; nil without
// certificate files (plain HTTP). Both files or neither.
func dataTLS(certFile, keyFile string) (*tls.Config, error) {
	if certFile == "" && keyFile == "" {
		return nil, nil
	}
	if certFile == "" || keyFile == "" {
		return nil, errors.New("--data-tls-cert and --data-tls-key go together")
	}
	cf := &certFiles{cert: certFile, key: keyFile}
	if _, err := cf.get(time.Now()); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return cf.get(time.Now())
		},
	}, nil
}

// get returns the certificate, reloading it when its files changed. A
// reload that fails keeps the previous certificate (a renewal caught half
// written must not take the listener down).
func (c *certFiles) get(now time.Time) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil && now.Sub(c.checked) < time.Second {
		return c.cur, nil
	}
	c.checked = now
	var stamp [2]time.Time
	for i, f := range []string{c.cert, c.key} {
		st, err := os.Stat(f)
		if err != nil {
			if c.cur != nil {
				return c.cur, nil
			}
			return nil, fmt.Errorf("data listener TLS: %w", err)
		}
		stamp[i] = st.ModTime()
	}
	if c.cur != nil && stamp == c.stamp {
		return c.cur, nil
	}
	pair, err := tls.LoadX509KeyPair(c.cert, c.key)
	if err != nil {
		if c.cur != nil {
			return c.cur, nil
		}
		return nil, fmt.Errorf("data listener TLS: %w", err)
	}
	c.cur, c.stamp = &pair, stamp
	return c.cur, nil
}
