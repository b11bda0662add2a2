package auth

import (
	"encoding/binary"
	"strconv"
	"strings"
	"time"
)

// portTokenPrefix marks a port token: it opens forwarded ports of one
// sandbox and nothing else (no commands, no files), so it can be put in a
// preview link or handed to a browser.
const portTokenPrefix = "spt_"

// AnyPort in a port token grants every port of its sandbox.
const AnyPort = 0

// PortGrant is what a valid port token grants.
type PortGrant struct {
	ProjectID string
	SandboxID string
	Port      int // AnyPort for every port
	Expires   time.Time
}

// IssuePort returns a port token for one port of a sandbox (or AnyPort),
// valid for ttl. It is signed with the session key under its own domain, so
// it can never pass as a session token or the other way round.
func (s *Sessions) IssuePort(projectID, sandboxID string, port int, ttl time.Duration) (string, time.Time) {
	exp := s.now().Add(ttl).UTC().Truncate(time.Second)
	return s.seal(portTokenPrefix, portDomain, exp, randomNonce(), projectID+"/"+sandboxID+"/"+strconv.Itoa(port)), exp
}

// VerifyPort checks a port token and returns its grant. The caller still
// checks that the grant covers the sandbox and port asked for (Covers).
func (s *Sessions) VerifyPort(token string) (PortGrant, error) {
	payload, err := s.open(token, portTokenPrefix, portDomain)
	if err != nil {
		return PortGrant{}, err
	}
	parts := strings.Split(string(payload[16:]), "/")
	if len(parts) != 3 {
		return PortGrant{}, ErrInvalid
	}
	port, err := strconv.Atoi(parts[2])
	if err != nil || port < 0 || port > 65535 {
		return PortGrant{}, ErrInvalid
	}
	exp := time.Unix(int64(binary.BigEndian.Uint64(payload[:8])), 0).UTC()
	if !s.now().Before(exp) {
		return PortGrant{}, ErrExpired
	}
	return PortGrant{ProjectID: parts[0], SandboxID: parts[1], Port: port, Expires: exp}, nil
}

// Covers reports whether the grant opens port of sandbox id.
func (g PortGrant) Covers(id string, port int) bool {
	return g.SandboxID == id && (g.Port == AnyPort || g.Port == port)
}
