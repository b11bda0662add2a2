package cluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/httpx"
	"github.com/space-sandbox/space/internal/snapshot"
)

// Template builds with remote nodes: a replica sends a build to one node
// (PathTemplateBuild: the build's description, then the uploaded archive
// or build context streamed in the same signed body; progress comes back
// as JSON lines), reads its step logs from whichever node has them
// (PathTemplateLog), and nodes copy each other's template trees object by
// object (PathObject), checking each against its digest.
const (
	PathTemplateBuild = "/node/v1/template-build"
	PathTemplateLog   = "/node/v1/template-log"
	PathObject        = "/node/v1/object"
	// PathTemplateAdmin deletes, aliases or collects templates on a node.
	PathTemplateAdmin = "/node/v1/template-admin"
)

// HeaderBodySum carries the hex SHA-256 of a streamed request body: the
// token signs it, the node checks the body against it once read.
const HeaderBodySum = "Space-Body-Sha256"

const (
	// maxBuildSpec bounds a build's description (a build file is at most
	// 256 KiB, base64 in JSON).
	maxBuildSpec = 1 << 20
	// maxBuildPayload bounds the archive or context streamed after it.
	maxBuildPayload = 8<<30 + 1<<20
	// buildWorkLimit bounds one build on a node (a Debian build with
	// many packages is slow).
	buildWorkLimit = time.Hour
	// maxObject bounds one object a node serves a peer (a manifest).
	maxObject = 512 << 20
)

// TemplateBuildSpec describes one build sent to a node.
type TemplateBuildSpec struct {
	// Kind is "source" (Request: busybox, debian, image, or archive with
	// the archive as payload) or "buildfile" (File, with the build
	// context as payload when there is one).
	Kind    string                    `json:"kind"`
	Request core.TemplateBuildRequest `json:"request,omitempty"`
	Name    string                    `json:"name,omitempty"` // the ref a build file's build writes
	File    []byte                    `json:"file,omitempty"`
	// ProjectID: the requester's (a build file's FROM resolves in it);
	// OpID: the operation, which names the step logs.
	ProjectID string `json:"project_id,omitempty"`
	OpID      string `json:"op_id,omitempty"`
	// Payload says a payload follows the description in the body.
	Payload bool `json:"payload,omitempty"`
}

// TemplateBuilder is what a node offers for builds and copies.
type TemplateBuilder interface {
	// BuildTemplate runs a build; payload is the path of the streamed
	// archive or context ("" for none), which the node removes after.
	BuildTemplate(ctx context.Context, spec TemplateBuildSpec, payload string, progress core.Progress) (json.RawMessage, error)
	// TemplateBuildLog opens step's log of build opID (step 0: a JSON
	// list of the steps that have one); ErrNotFound when this node did
	// not run that build.
	TemplateBuildLog(ctx context.Context, opID string, step int) (io.ReadCloser, error)
	// TemplateObject returns an object of a template tree this node
	// advertises (a manifest or one of its chunks), nothing else.
	TemplateObject(ctx context.Context, key string) ([]byte, error)
	// TemplateAdmin deletes, aliases or collects templates on the node
	// (TemplateAdminReq) and returns the JSON of the result.
	TemplateAdmin(ctx context.Context, req TemplateAdminReq) (json.RawMessage, error)
}

// Operations of TemplateAdminReq.
const (
	TemplateDelete = "delete"
	TemplateAlias  = "alias"
	TemplateGC     = "gc"
)

// TemplateAdminReq is one delete, alias or collection a replica sends to
// every ready node. At is the replica's time of the change: a delete's
// tombstone and an alias's layer carry it, so that of two changes to a
// name the later wins on every node, whichever node saw which.
type TemplateAdminReq struct {
	Op    string    `json:"op"`
	Ref   string    `json:"ref,omitempty"`
	Alias string    `json:"alias,omitempty"` // the alias's ref
	At    time.Time `json:"at"`
}

type logReq struct {
	OpID string `json:"op_id"`
	Step int    `json:"step"`
}

type objectReq struct {
	Key string `json:"key"`
}

// buildLine is one line of a build's answer: progress, then a result or
// an error.
type buildLine struct {
	Pct     *int            `json:"pct,omitempty"`
	Message string          `json:"message,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// TemplateRoutes serves the template routes of the node RPC in front of
// next (the rest of it), with the same request tokens.
func TemplateRoutes(next http.Handler, tb TemplateBuilder, v *Verifier, logf func(string, ...any)) http.Handler {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case PathTemplateBuild, PathTemplateLog, PathObject, PathTemplateAdmin:
		default:
			next.ServeHTTP(w, r)
			return
		}
		tok, ok := postToken(w, r)
		if !ok {
			return
		}
		if r.URL.Path == PathTemplateBuild {
			serveBuild(w, r, tb, v, tok, logf)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
		if err != nil {
			httpx.WriteError(w, err)
			return
		}
		if err := v.Verify(tok, r.Method, r.URL.Path, body); err != nil {
			logf("node rpc %s from %s refused: %v", r.URL.Path, r.RemoteAddr, err)
			httpx.WriteError(w, httpx.Errorf(http.StatusUnauthorized, "unauthorized", "node token refused"))
			return
		}
		ctx := r.Context()
		if r.URL.Path == PathTemplateAdmin {
			var in TemplateAdminReq
			if err := decode(body, &in); err != nil {
				writeErr(w, err)
				return
			}
			switch in.Op {
			case TemplateDelete, TemplateAlias, TemplateGC:
			default:
				writeErr(w, fmt.Errorf("template op %.40q: %w", in.Op, core.ErrInvalid))
				return
			}
			out, err := tb.TemplateAdmin(ctx, in)
			if err != nil {
				writeErr(w, err)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Write(out)
			return
		}
		if r.URL.Path == PathObject {
			var in objectReq
			if err := decode(body, &in); err != nil {
				writeErr(w, err)
				return
			}
			data, err := tb.TemplateObject(ctx, in.Key)
			if err != nil {
				writeErr(w, err)
				return
			}
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write(data)
			return
		}
		var in logReq
		if err := decode(body, &in); err != nil {
			writeErr(w, err)
			return
		}
		if in.Step < 0 || in.Step > 1000 {
			writeErr(w, fmt.Errorf("step %d: %w", in.Step, core.ErrInvalid))
			return
		}
		rc, err := tb.TemplateBuildLog(ctx, in.OpID, in.Step)
		if err != nil {
			writeErr(w, err)
			return
		}
		defer rc.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		io.Copy(w, rc)
	})
}

// serveBuild authenticates a build by its declared body hash, reads the
// description and the payload (to a temp file), checks the hash, and runs
// the build, answering progress lines as it goes.
func serveBuild(w http.ResponseWriter, r *http.Request, tb TemplateBuilder, v *Verifier, tok string, logf func(string, ...any)) {
	var sum [sha256.Size]byte
	if b, err := hex.DecodeString(r.Header.Get(HeaderBodySum)); err != nil || len(b) != len(sum) {
		httpx.WriteError(w, httpx.Errorf(http.StatusBadRequest, "invalid_argument", "missing or bad %s header", HeaderBodySum))
		return
	} else {
		copy(sum[:], b)
	}
	if err := v.VerifySum(tok, r.Method, r.URL.Path, sum); err != nil {
		logf("node rpc %s from %s refused: %v", r.URL.Path, r.RemoteAddr, err)
		httpx.WriteError(w, httpx.Errorf(http.StatusUnauthorized, "unauthorized", "node token refused"))
		return
	}
	// An upload takes as long as it takes; the listener's read timeout
	// is for small RPC bodies.
	http.NewResponseController(w).SetReadDeadline(time.Time{})
	h := sha256.New()
	br := bufio.NewReaderSize(io.TeeReader(http.MaxBytesReader(w, r.Body, maxBuildSpec+maxBuildPayload), h), 64<<10)
	line, err := readLine(br, maxBuildSpec)
	if err != nil {
		writeErr(w, fmt.Errorf("build description: %v: %w", err, core.ErrInvalid))
		return
	}
	var spec TemplateBuildSpec
	if err := decode(line, &spec); err != nil {
		writeErr(w, err)
		return
	}
	payload := ""
	if spec.Payload {
		f, err := os.CreateTemp("", "space-node-build-")
		if err != nil {
			writeErr(w, fmt.Errorf("build payload: %w", err))
			return
		}
		payload = f.Name()
		defer os.Remove(payload)
		_, err = io.Copy(f, br)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			writeErr(w, fmt.Errorf("build payload: %v: %w", err, core.ErrInvalid))
			return
		}
	} else if _, err := io.Copy(io.Discard, io.LimitReader(br, 1)); err != nil {
		writeErr(w, fmt.Errorf("build body: %v: %w", err, core.ErrInvalid))
		return
	}
	if !bytes.Equal(h.Sum(nil), sum[:]) {
		logf("node rpc %s from %s refused: body does not match its signed hash", r.URL.Path, r.RemoteAddr)
		httpx.WriteError(w, httpx.Errorf(http.StatusUnauthorized, "unauthorized", "node token refused"))
		return
	}
	// The build goes on if the replica goes away: its tree is published
	// all the same, and the replicas settle the operation.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), buildWorkLimit)
	defer cancel()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	send := func(l buildLine) {
		mu.Lock()
		defer mu.Unlock()
		if enc.Encode(l) == nil {
			rc.Flush()
		}
	}
	res, err := tb.BuildTemplate(ctx, spec, payload, func(pct int, msg string) {
		send(buildLine{Pct: &pct, Message: msg})
	})
	if err != nil {
		l := buildLine{Error: &struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}{core.ErrorCode(err), err.Error()}}
		send(l)
		return
	}
	send(buildLine{Result: res})
}

// readLine reads up to and without '\n', at most max bytes.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var out []byte
	for {
		chunk, err := br.ReadSlice('\n')
		out = append(out, chunk...)
		if len(out) > max+1 {
			return nil, fmt.Errorf("longer than %d bytes", max)
		}
		if err == nil {
			return out[:len(out)-1], nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

// streaming is c's HTTP client without an overall timeout: a build or a
// log lasts as long as its context allows.
func (c *Client) streaming() *http.Client {
	return &http.Client{Transport: c.http.Transport}
}

// BuildTemplate runs a build on the node: spec, then the file at payload
// ("" for none) streamed in the same body; progress is called with the
// node's progress lines. It returns the node's result document.
func (c *Client) BuildTemplate(ctx context.Context, spec TemplateBuildSpec, payload string, progress core.Progress) (json.RawMessage, error) {
	spec.Payload = payload != ""
	line, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("node %s: encode: %w", c.Name, err)
	}
	line = append(line, '\n')
	h := sha256.New()
	h.Write(line)
	size := int64(len(line))
	var body io.Reader = bytes.NewReader(line)
	if payload != "" {
		f, err := os.Open(payload)
		if err != nil {
			return nil, fmt.Errorf("build payload: %w", err)
		}
		defer f.Close()
		n, err := io.Copy(h, f)
		if err != nil {
			return nil, fmt.Errorf("build payload: %w", err)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return nil, fmt.Errorf("build payload: %w", err)
		}
		size += n
		body = io.MultiReader(body, io.LimitReader(f, n))
	}
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+PathTemplateBuild, body)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", c.Name, err)
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set(HeaderBodySum, hex.EncodeToString(sum[:]))
	req.Header.Set("Authorization", authScheme+c.s.SignSum(c.Name, http.MethodPost, PathTemplateBuild, sum))
	resp, err := c.do(ctx, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxRPCBody)
	for sc.Scan() {
		var l buildLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("node %s: bad build answer: %v: %w", c.Name, err, core.ErrUnavailable)
		}
		switch {
		case l.Error != nil:
			return nil, fmt.Errorf("node %s: %.2000s: %w", c.Name, l.Error.Message, sentinel(l.Error.Code))
		case l.Result != nil:
			return l.Result, nil
		case l.Pct != nil && progress != nil:
			progress(*l.Pct, l.Message)
		}
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("node %s: %w", c.Name, ctx.Err())
	}
	return nil, fmt.Errorf("node %s: the build's answer ended early (%v): %w", c.Name, sc.Err(), core.ErrUnavailable)
}

// do sends req and returns a 200 answer; an error envelope becomes its
// core sentinel, an unreachable node ErrUnavailable.
func (c *Client) do(ctx context.Context, req *http.Request) (*http.Response, error) {
	resp, err := c.streaming().Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("node %s: %w", c.Name, ctx.Err())
		}
		return nil, fmt.Errorf("node %s unreachable: %v: %w", c.Name, err, core.ErrUnavailable)
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var env struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if json.Unmarshal(raw, &env) != nil || env.Error.Code == "" {
		return nil, fmt.Errorf("node %s: HTTP %d: %w", c.Name, resp.StatusCode, core.ErrUnavailable)
	}
	return nil, fmt.Errorf("node %s: %.500s: %w", c.Name, env.Error.Message, sentinel(env.Error.Code))
}

// post sends a signed JSON request to a raw route and returns the answer.
func (c *Client) post(ctx context.Context, path string, in any) (*http.Response, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("node %s: encode: %w", c.Name, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", c.Name, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", authScheme+c.s.Sign(c.Name, http.MethodPost, path, body))
	return c.do(ctx, req)
}

// TemplateBuildLog opens step's log of build opID on the node (step 0: the
// JSON list of steps with a log).
func (c *Client) TemplateBuildLog(ctx context.Context, opID string, step int) (io.ReadCloser, error) {
	resp, err := c.post(ctx, PathTemplateLog, logReq{OpID: opID, Step: step})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// TemplateAdmin sends a delete, alias or collection to the node and
// returns its JSON answer.
func (c *Client) TemplateAdmin(ctx context.Context, req TemplateAdminReq) (json.RawMessage, error) {
	resp, err := c.post(ctx, PathTemplateAdmin, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("node %s: %v: %w", c.Name, err, core.ErrUnavailable)
	}
	return raw, nil
}

// Object returns an object of a template tree the node advertises,
// refusing one larger than max.
func (c *Client) Object(ctx context.Context, key string, max int64) ([]byte, error) {
	resp, err := c.post(ctx, PathObject, objectReq{Key: key})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, fmt.Errorf("node %s: read %s: %v: %w", c.Name, key, err, core.ErrUnavailable)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("node %s: %s larger than %d bytes: %w", c.Name, key, max, core.ErrInvalid)
	}
	return data, nil
}

// PeerObjects reads template objects from another node, as a read-only
// snapshot.Backend (the snapshot store checks each against its digest).
type PeerObjects struct{ C *Client }

var _ snapshot.Backend = PeerObjects{}

var errReadOnly = errors.New("a peer node's objects are read-only")

func (p PeerObjects) Get(ctx context.Context, key string, max int64) ([]byte, error) {
	data, err := p.C.Object(ctx, key, min(max, maxObject))
	if errors.Is(err, core.ErrNotFound) {
		return nil, fmt.Errorf("%w: %w", os.ErrNotExist, err)
	}
	return data, err
}
func (p PeerObjects) Put(context.Context, string, []byte) error { return errReadOnly }
func (p PeerObjects) Stat(context.Context, string) (snapshot.ObjectInfo, error) {
	return snapshot.ObjectInfo{}, errReadOnly
}
func (p PeerObjects) List(context.Context, string, func(snapshot.ObjectInfo) error) error {
	return errReadOnly
}
func (p PeerObjects) Delete(context.Context, string) error { return errReadOnly }
func (p PeerObjects) String() string                       { return "node " + p.C.Name }

// BuildNode picks the node a template build runs on: of the ready nodes
// that have the first template of base (a build file's FROM, in the order
// it resolves) that some ready node has, or of all ready nodes, the one
// with the most free memory and CPU (the shares left, added). None ready:
// ErrUnavailable.
func (r *Remote) BuildNode(ctx context.Context, base ...string) (*Client, error) {
	nodes, err := r.listNodes(ctx)
	if err != nil {
		return nil, err
	}
	now := r.o.Now()
	hasBase := func(core.NodeRecord) bool { return true }
	for _, ref := range base {
		has := func(n core.NodeRecord) bool { return slices.Contains(n.Templates, ref) }
		if slices.ContainsFunc(nodes, func(n core.NodeRecord) bool { return r.fresh(n, now) && has(n) }) {
			hasBase = has
			break
		}
	}
	best, bestScore := "", -1.0
	for _, n := range nodes {
		if !r.fresh(n, now) || !hasBase(n) {
			continue
		}
		score := 0.0
		if n.MemoryBytes > 0 {
			score += float64(n.MemoryBytes-n.UsedMemoryBytes) / float64(n.MemoryBytes)
		}
		if n.CPUMillis > 0 {
			score += float64(n.CPUMillis-n.UsedCPUMillis) / float64(n.CPUMillis)
		}
		if score > bestScore {
			best, bestScore = n.Name, score
		}
	}
	if best == "" {
		return nil, fmt.Errorf("no ready node to build the template on: %w", core.ErrUnavailable)
	}
	return r.client(ctx, best)
}

// TemplateBuildLog finds build opID's log on the ready node that ran it.
func (r *Remote) TemplateBuildLog(ctx context.Context, opID string, step int) (io.ReadCloser, error) {
	nodes, err := r.listNodes(ctx)
	if err != nil {
		return nil, err
	}
	now := r.o.Now()
	for _, n := range nodes {
		if !r.fresh(n, now) {
			continue
		}
		c, err := r.client(ctx, n.Name)
		if err != nil {
			continue
		}
		rc, err := c.TemplateBuildLog(ctx, opID, step)
		if err == nil {
			return rc, nil
		}
		if !errors.Is(err, core.ErrNotFound) {
			r.o.Logf("build %s: logs on node %s: %v", opID, n.Name, err)
		}
	}
	return nil, fmt.Errorf("no ready node has logs of build %s: %w", opID, core.ErrNotFound)
}

// NodeClient returns the client of node name (ErrNotFound: no such node).
func (r *Remote) NodeClient(ctx context.Context, name string) (*Client, error) {
	return r.client(ctx, name)
}

// ReadyNodes returns the nodes (not replicas) whose heartbeat is fresh.
func (r *Remote) ReadyNodes(ctx context.Context) ([]core.NodeRecord, error) {
	nodes, err := r.listNodes(ctx)
	if err != nil {
		return nil, err
	}
	now := r.o.Now()
	var out []core.NodeRecord
	for _, n := range nodes {
		if r.fresh(n, now) {
			out = append(out, n)
		}
	}
	return out, nil
}
