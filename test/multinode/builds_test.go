package multinode

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/space-sandbox/space/pkg/client"
)

// buildsFile is the build file of the fleet build tests: a COPY from the
// uploaded context, a RUN whose output is in the step log and whose file
// is in the template, and an ENV default.
const buildsFile = `FROM minimal
USER root
COPY app.txt /etc/app.txt
RUN echo run-step-output && echo built-by-run > /etc/hello.txt
ENV GREETING=hi-from-env
`

// TestFleetTemplateBuilds: a template built through replica 1 starts on
// every node. Each node takes one sandbox (--max-sandboxes 1), so three
// creates of the template land one on each node, and each sandbox shows
// the build's files (COPY from the context, a RUN step's file) and its
// ENV. The layers travel node to node over the mutual-TLS node link
// ("node-link": no snapshot store) or through the shared snapshot store
// ("shared-store"); either way the build's status and step logs read the
// same through the other replica, listing names the nodes that have the
// template, and with no node up a build is refused with 503.
func TestFleetTemplateBuilds(t *testing.T) {
	t.Run("node-link", func(t *testing.T) { fleetBuild(t, 3, "", "from node n") })
	t.Run("shared-store", func(t *testing.T) {
		store := "dir:" + t.TempDir()
		fleetBuild(t, 2, store, "from the shared snapshot store")
	})
}

func fleetBuild(t *testing.T, nodes int, snapStore, copiedFrom string) {
	c := newFleet(t, fleetOpts{nodes: nodes, replicas: 2, snapStore: snapStore,
		nodeArgs: func(int) []string { return []string{"--max-sandboxes", "1"} }})
	a, b := c.servers[0], c.servers[1]
	ctxDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(ctxDir, "app.txt"), []byte("from-the-context\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	st, m := c.buildFile(a, "hello", buildsFile, ctxDir)
	if st != 202 {
		t.Fatalf("build through %s: %d %v", a.name, st, m)
	}
	op := c.waitOp(b, opID(m), 3*time.Minute) // followed through the other replica
	if op["state"] != "succeeded" {
		t.Fatalf("build: %v", op)
	}
	built := time.Since(t0)
	res, _ := op["result"].(map[string]any)
	tmpl, _ := res["template"].(map[string]any)
	builder := ""
	if ns, _ := tmpl["nodes"].([]any); len(ns) == 1 {
		builder, _ = ns[0].(string)
	}
	if builder == "" {
		t.Fatalf("the build's result names no node: %v", res)
	}
	// The step logs, through the other replica: the RUN step's output.
	logs := c.mustCall(b, "GET", "/v1/templates/builds/"+opID(m)+"/logs", nil)
	steps, _ := logs["steps"].([]any)
	if len(steps) == 0 {
		t.Fatalf("no step logs through %s: %v", b.name, logs)
	}
	n := int(steps[0].(map[string]any)["step"].(float64))
	if text := c.getText(b, fmt.Sprintf("/v1/templates/builds/%s/logs?step=%d", opID(m), n)); !strings.Contains(text, "run-step-output") {
		t.Errorf("step %d log through %s: %q", n, b.name, text)
	}

	// Every node gets the template (listing says which have it).
	var want []string
	for _, p := range c.nodes {
		want = append(want, p.name)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		got := c.templateNodes(b, "hello")
		if slices.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("template hello on %v, want %v", got, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
	spread := time.Since(t0)
	for _, p := range c.nodes {
		if p.name != builder {
			waitLog(t, p, copiedFrom)
		}
	}
	// And it is in the listing of both replicas, once.
	for _, s := range c.servers {
		list := c.mustCall(s, "GET", "/v1/templates", nil)
		k := 0
		for _, x := range list["templates"].([]any) {
			if tm := x.(map[string]any); tm["name"] == "hello" {
				k++
				if tm["digest"] != tmpl["digest"] || tm["source"] != "buildfile" {
					t.Errorf("listing on %s: %v, built %v", s.name, tm, tmpl)
				}
			}
		}
		if k != 1 {
			t.Errorf("listing on %s has hello %d times", s.name, k)
		}
	}

	// One sandbox per node, each showing the build's content.
	c.onEveryNode(a, b, "hello", buildsCheck, "built-by-run\nfrom-the-context\nhi-from-env\n")
	t.Logf("built on %s in %v; on all %d nodes %v after the build started", builder, built.Round(time.Millisecond), len(c.nodes), spread.Round(time.Millisecond))

	// A rebuild of the name through the other replica wins on every node:
	// once the listing shows its digest on all of them, every sandbox of
	// the name has the new tree.
	st, m = c.buildFile(b, "hello", strings.Replace(buildsFile, "built-by-run", "rebuilt", 1), ctxDir)
	if st != 202 {
		t.Fatalf("rebuild: %d %v", st, m)
	}
	op = c.waitOp(a, opID(m), 3*time.Minute)
	if op["state"] != "succeeded" {
		t.Fatalf("rebuild: %v", op)
	}
	digest := op["result"].(map[string]any)["template"].(map[string]any)["digest"]
	if digest == tmpl["digest"] {
		t.Fatalf("the rebuild kept digest %v", digest)
	}
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, got := c.call(a, "GET", "/v1/templates/hello", nil)
		if got["digest"] == digest && slices.Equal(c.templateNodes(a, "hello"), want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rebuilt hello: %v, want digest %v on %v", got, digest, want)
		}
	}
	c.onEveryNode(a, b, "hello", buildsCheck, "rebuilt\nfrom-the-context\nhi-from-env\n")

	// A node that joins after the builds (the last one, restarted on an
	// empty data dir) copies the newest build of the template too.
	last := c.nodes[len(c.nodes)-1]
	last.signal(syscall.SIGTERM)
	last.dataDir += "-new"
	c.dirs = append(c.dirs, last.dataDir)
	last.setArg("--data-dir", last.dataDir)
	last.setArg("--template-dir", filepath.Join(last.dataDir, "templates"))
	last.start(t)
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, got := c.call(a, "GET", "/v1/templates/hello", nil)
		if got["digest"] == digest && slices.Equal(c.templateNodes(a, "hello"), want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s joined: %v, want digest %v on %v", last.name, got, digest, want)
		}
	}
	c.onEveryNode(a, b, "hello", buildsCheck, "rebuilt\nfrom-the-context\nhi-from-env\n")

	// A JSON build (busybox) through the other replica spreads the same way.
	st, m = c.call(b, "POST", "/v1/templates", map[string]any{"name": "bb", "source": "busybox", "env": map[string]string{"K": "v"}})
	if st != 202 {
		t.Fatalf("busybox build: %d %v", st, m)
	}
	if op := c.waitOp(a, opID(m), 2*time.Minute); op["state"] != "succeeded" {
		t.Fatalf("busybox build: %v", op)
	}
	for deadline := time.Now().Add(90 * time.Second); !slices.Equal(c.templateNodes(a, "bb"), want); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("template bb on %v, want %v", c.templateNodes(a, "bb"), want)
		}
	}
	// An uploaded image archive (POST /v1/templates/upload) too: the
	// archive is streamed to the building node.
	if snapStore == "" {
		req, _ := http.NewRequest("POST", a.addr["control"]+"/v1/templates/upload?name=up", bytes.NewReader(imageArchive(t)))
		req.Header.Set("Content-Type", "application/x-tar")
		req.Header.Set("X-API-Key", c.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		m = nil
		json.NewDecoder(resp.Body).Decode(&m)
		resp.Body.Close()
		if resp.StatusCode != 202 {
			t.Fatalf("upload: %d %v", resp.StatusCode, m)
		}
		if op := c.waitOp(b, opID(m), 2*time.Minute); op["state"] != "succeeded" {
			t.Fatalf("upload build: %v", op)
		}
		for deadline := time.Now().Add(90 * time.Second); !slices.Equal(c.templateNodes(b, "up"), want); time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("template up on %v, want %v", c.templateNodes(b, "up"), want)
			}
		}
		c.onEveryNode(a, b, "up", "cat /etc/upload.txt", "from-the-archive\n")
	}

	fleetTemplateAdmin(c, a, b, want)
	if snapStore != "" {
		return
	}
	// No node up: once the replica sees every node gone (their heartbeats
	// older than the timeout), a build is refused at once.
	for _, p := range c.nodes {
		p.signal(syscall.SIGTERM)
	}
	for deadline := time.Now().Add(3 * nodeTimeout); ; time.Sleep(100 * time.Millisecond) {
		if st, _ := c.call(a, "GET", "/v1/templates/minimal", nil); st == 503 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the nodes still look ready %v after they stopped", 3*nodeTimeout)
		}
	}
	st, m = c.call(a, "POST", "/v1/templates", map[string]any{"name": "t2", "source": "busybox"})
	e, _ := m["error"].(map[string]any)
	if st != 503 || e["code"] != "unavailable" || !strings.Contains(fmt.Sprint(e["message"]), "no node is ready") {
		t.Fatalf("build with no node up: %d %v, want 503 unavailable", st, m)
	}
}

// fleetTemplateAdmin: an alias made through one replica is on every node;
// a builtin cannot be deleted; a delete through the other replica while a
// node is away removes the template everywhere, and the node that missed
// it drops its copy when it is back (the tombstone wins over its older
// build) while the alias keeps working; a collection runs on every node.
func fleetTemplateAdmin(c *cluster, a, b *proc, want []string) {
	t := c.t
	t.Helper()
	if st, m := c.call(a, "POST", "/v1/templates/hello/alias", map[string]any{"alias": "hello2"}); st != 200 {
		t.Fatalf("alias: %d %v", st, m)
	}
	for deadline := time.Now().Add(60 * time.Second); !slices.Equal(c.templateNodes(b, "hello2"), want); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("alias hello2 on %v, want %v", c.templateNodes(b, "hello2"), want)
		}
	}
	admin := c.adminKey()
	if st, m := c.as(admin, b, "DELETE", "/v1/templates/minimal", nil); st != 409 {
		t.Errorf("delete a builtin: %d %v, want 409", st, m)
	}
	away := c.nodes[0]
	away.signal(syscall.SIGTERM)
	time.Sleep(500 * time.Millisecond)
	if st, m := c.call(b, "DELETE", "/v1/templates/hello", nil); st != 204 {
		t.Fatalf("delete: %d %v", st, m)
	}
	away.start(t) // back, with its older build of hello on disk
	// Replica A learns of the delete from the nodes' next heartbeats; once
	// it shows hello gone, hello must stay gone with the node back.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		st, m := c.call(a, "GET", "/v1/templates/hello", nil)
		if st == 404 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hello through replica %s 10 s after its delete: %d %v, want 404", a.name, st, m)
		}
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		if st, m := c.call(a, "GET", "/v1/templates/hello", nil); st != 404 {
			t.Fatalf("hello after its delete (node %s was away): %d %v, want 404", away.name, st, m)
		}
	}
	// Placement reads each node's own list: a node still offering hello
	// would take this create.
	if st, m := c.call(b, "POST", "/v1/sandboxes", map[string]any{"template": "hello"}); st != 404 {
		t.Fatalf("create of deleted hello once node %s is back: %d %v, want 404", away.name, st, m)
	}
	if got := c.templateNodes(a, "hello2"); !slices.Equal(got, want) {
		t.Fatalf("alias hello2 after the delete of hello on %v, want %v", got, want)
	}
	c.onEveryNode(a, b, "hello2", buildsCheck, "rebuilt\nfrom-the-context\nhi-from-env\n")
	if st, m := c.as(admin, a, "POST", "/v1/templates/gc", nil); st != 200 {
		t.Errorf("gc: %d %v", st, m)
	}
}

// buildsCheck prints the files and ENV the build file gives a template.
const buildsCheck = "cat /etc/hello.txt /etc/app.txt; echo $GREETING"

// onEveryNode creates one sandbox of template through a on each node
// (they take one each), checks through b that script prints want in each,
// and deletes them.
func (c *cluster) onEveryNode(a, b *proc, template, script, want string) {
	t := c.t
	t.Helper()
	onNode := map[string]string{}
	for i := range c.nodes {
		st, m := c.call(a, "POST", "/v1/sandboxes", map[string]any{"template": template})
		if st != 202 {
			t.Fatalf("create %d: %d %v", i, st, m)
		}
		sb := m["sandbox"].(map[string]any)
		if done := c.waitOp(a, opID(m), 60*time.Second); done["state"] != "succeeded" {
			t.Fatalf("create on %v: %v", sb["node"], done)
		}
		onNode[sb["node"].(string)] = sb["id"].(string)
	}
	if len(onNode) != len(c.nodes) {
		t.Fatalf("sandboxes on %v, want one on each of the %d nodes", onNode, len(c.nodes))
	}
	for node, id := range onNode {
		url, tok := c.session(b, id)
		out, code, err := exec1(url, tok, id, "sh", "-c", script)
		if err != nil || code != 0 || out != want {
			t.Errorf("template content on node %s (sandbox %s): %q %d %v, want %q", node, id, out, code, err, want)
		}
	}
	for _, id := range onNode {
		if st, m := c.call(b, "DELETE", "/v1/sandboxes/"+id, nil); st != 202 {
			t.Errorf("delete %s: %d %v", id, st, m)
		} else {
			c.waitOp(b, opID(m), 60*time.Second)
		}
	}
}

// buildFile posts a build file and the directory dir as its context.
func (c *cluster) buildFile(s *proc, name, file, dir string) (int, map[string]any) {
	c.t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("buildfile", "Spacefile")
	fw.Write([]byte(file))
	part, _ := mw.CreateFormFile("context", "context.tar")
	if err := client.WriteContextTar(dir, part); err != nil {
		c.t.Fatal(err)
	}
	mw.Close()
	req, _ := http.NewRequest("POST", s.addr["control"]+"/v1/templates/build?name="+name, &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("X-API-Key", c.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

// getText GETs path on s and returns the body of a 200.
func (c *cluster) getText(s *proc, path string) string {
	c.t.Helper()
	req, _ := http.NewRequest("GET", s.addr["control"]+path, nil)
	req.Header.Set("X-API-Key", c.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		c.t.Fatalf("GET %s on %s: %d %s", path, s.name, resp.StatusCode, raw)
	}
	return string(raw)
}

// templateNodes returns the nodes s says have template name (sorted).
func (c *cluster) templateNodes(s *proc, name string) []string {
	c.t.Helper()
	st, m := c.call(s, "GET", "/v1/templates/"+name, nil)
	if st != 200 {
		return nil
	}
	var out []string
	ns, _ := m["nodes"].([]any)
	for _, x := range ns {
		out = append(out, x.(string))
	}
	sort.Strings(out)
	return out
}

// imageArchive is a docker-archive of a one-layer image: busybox (sh, cat)
// and /etc/upload.txt.
func imageArchive(t *testing.T) []byte {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("needs /bin/busybox: %v", err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	at := time.Unix(1700000000, 0)
	for _, d := range []string{"bin/", "etc/", "tmp/", "proc/", "sys/", "dev/"} {
		tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: at})
	}
	for name, body := range map[string][]byte{"bin/busybox": bb, "etc/upload.txt": []byte("from-the-archive\n")} {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(body)), ModTime: at})
		tw.Write(body)
	}
	for _, a := range []string{"sh", "cat"} {
		tw.WriteHeader(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", ModTime: at})
	}
	tw.Close()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Env: []string{"PATH=/bin"}, Cmd: []string{"sh"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("space.test/up:1")
	var out bytes.Buffer
	if err := tarball.Write(tag, img, &out); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}
