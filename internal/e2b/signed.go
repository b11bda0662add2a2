package e2b

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/node"
)

// maxSignatureBytes bounds the signature query parameter ("v1_" and 43
// base64 characters).
const maxSignatureBytes = 64

// serveSigned serves GET and POST /files authorized by a signed URL
// (sandbox.downloadUrl / uploadUrl) instead of X-Access-Token: signature =
// "v1_" + base64(sha256("<path>:<read|write>:<username>:<token>[:<exp>]"))
// without padding. The token is the sandbox's envdAccessToken, a stable
// session token (auth.Sessions.IssueStable) that the server recomputes: it
// accepts a signature made with any of them still valid. The sandbox comes
// from E2b-Sandbox-Id or a "<port>-<id>.<domain>" Host, as for every envd
// call; a URL with neither (the SDK's, built on E2B_SANDBOX_URL, as a
// browser or curl sends it) is matched against the node's running
// sandboxes.
func (e *Envd) serveSigned(w http.ResponseWriter, r *http.Request) {
	op := map[string]string{http.MethodGet: "read", http.MethodPost: "write"}[r.Method]
	if op == "" {
		envdError(w, r, http.StatusNotFound, "envd route "+r.Method+" "+r.URL.Path+" is not supported")
		return
	}
	q := r.URL.Query()
	sig, p, user, expStr := q.Get("signature"), q.Get("path"), q.Get("username"), q.Get("signature_expiration")
	if len(sig) > maxSignatureBytes || len(p) > maxPathBytes || len(user) > maxUserBytes || len(expStr) > 20 {
		envdError(w, r, http.StatusUnauthorized, "invalid signature")
		return
	}
	if expStr != "" {
		exp, err := strconv.ParseInt(expStr, 10, 64)
		if err != nil {
			envdError(w, r, http.StatusUnauthorized, "invalid signature_expiration")
			return
		}
		if time.Now().Unix() > exp {
			envdError(w, r, http.StatusUnauthorized, "signature expired")
			return
		}
	}
	id := sandboxIDOf(r)
	var sb *node.Sandbox
	switch {
	case id == "":
		// The SDK builds the URL on E2B_SANDBOX_URL, which names no
		// sandbox: the signature itself says which one it is.
		var err error
		if sb, err = e.signedSandbox(r.Context(), sig, p, op, user, expStr); err != nil {
			envdError(w, r, http.StatusServiceUnavailable, "busy: retry")
			return
		}
		if sb == nil {
			envdError(w, r, http.StatusUnauthorized, "invalid signature (no sandbox running here signed it)")
			return
		}
	case len(id) > 128:
		envdError(w, r, http.StatusUnauthorized, "invalid sandbox id")
		return
	default:
		// Like E2B's edge: a sandbox that does not run here is 502.
		var err error
		if sb, err = e.o.Node.Sandbox(id); err != nil {
			envdError(w, r, http.StatusBadGateway, "sandbox "+id+" is not running")
			return
		}
		if !e.signedBy(sb, sig, p, op, user, expStr) {
			envdError(w, r, http.StatusUnauthorized, "invalid signature")
			return
		}
	}
	// The signed username is who the request acts as: neither a "user"
	// parameter nor an Authorization header may change it.
	c := &call{sb: sb, user: user, signed: true, keepalive: defaultKeepWait}
	r = r.WithContext(context.WithValue(r.Context(), callKey{}, c))
	if op == "read" {
		e.download(w, r, c)
	} else {
		e.upload(w, r, c)
	}
}

// stableTokens returns sb's valid stable tokens, from the cache when they
// were computed within the current second.
func (e *Envd) stableTokens(sb *node.Sandbox) []string {
	now := time.Now().Unix()
	e.tokMu.Lock()
	defer e.tokMu.Unlock()
	key := sb.ProjectID + "/" + sb.ID
	if c, ok := e.toks[key]; ok && c.sec == now {
		return c.toks
	}
	toks := e.o.Sessions.StableTokens(sb.ProjectID, sb.ID, e.o.SessionTTL)
	if len(e.toks) >= maxTokenSets {
		// Signed URLs that name their sandbox never scan: bound the
		// cache here too.
		e.dropStale(now)
	}
	e.toks[key] = stableSet{sec: now, toks: toks}
	return toks
}

// maxTokenSets is the cache size past which stale entries are dropped on
// insert (a node runs far fewer sandboxes).
const maxTokenSets = 4096

// pruneTokens drops cached tokens older than the current second (they
// would be recomputed anyway; gone sandboxes leave nothing behind).
func (e *Envd) pruneTokens() {
	e.tokMu.Lock()
	defer e.tokMu.Unlock()
	e.dropStale(time.Now().Unix())
}

// dropStale deletes the cache entries not computed in second now; the
// caller holds tokMu.
func (e *Envd) dropStale(now int64) {
	for k, c := range e.toks {
		if c.sec != now {
			delete(e.toks, k)
		}
	}
}

// signedBy reports whether one of sb's valid stable tokens made sig.
func (e *Envd) signedBy(sb *node.Sandbox, sig, p, op, user, expStr string) bool {
	ok := false
	for _, tok := range e.stableTokens(sb) {
		if subtle.ConstantTimeCompare([]byte(sig), []byte(fileSignature(p, op, user, tok, expStr))) == 1 {
			ok = true
		}
	}
	return ok
}

// signedSandbox finds the running sandbox of this node whose token made
// sig (nil: none). One search runs at a time; a request waits for its
// turn while its context lives. With the tokens cached per second, a
// flood of forged URLs costs one SHA-256 per token per running sandbox
// each, and the HMACs at most once a second.
func (e *Envd) signedSandbox(ctx context.Context, sig, p, op, user, expStr string) (*node.Sandbox, error) {
	if !strings.HasPrefix(sig, "v1_") {
		return nil, nil
	}
	select {
	case e.scan <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-e.scan }()
	e.pruneTokens()
	for _, sb := range e.o.Node.Running() {
		if e.signedBy(sb, sig, p, op, user, expStr) {
			return sb, nil
		}
	}
	return nil, nil
}

// fileSignature is the SDK's getSignature (src/sandbox/signature.ts).
func fileSignature(path, op, user, token, exp string) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if exp != "" {
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}
