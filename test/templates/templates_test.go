// Package templates drives a real `space server` process to build templates
// from images (an uploaded OCI layout, the CLI with a docker-archive, a
// registry reference) and runs a sandbox of one. It needs root.
package templates

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/space-sandbox/space/test/testenv"
)

type server struct {
	*testenv.Server
	bin, dataDir, ctrl, key string
}

func startServer(t *testing.T) *server {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces, overlayfs, chown to the shifted range)")
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("needs /bin/busybox (busybox-static)")
	}
	srv, err := testenv.New("space-tpl-")
	if err != nil {
		t.Fatal(err)
	}
	srv.Args = []string{"--builtins", "minimal"}
	t.Cleanup(func() {
		srv.Stop()
		if t.Failed() {
			t.Logf("server log tail:\n%s", srv.LogTail(10000))
		}
		srv.Remove()
	})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	key, err := srv.CreateKey("p1")
	if err != nil {
		t.Fatal(err)
	}
	return &server{Server: srv, bin: srv.Bin, dataDir: srv.DataDir, ctrl: srv.Ctrl, key: key}
}

func (s *server) call(t *testing.T, method, path string, body io.Reader, ctype string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, s.ctrl+path, body)
	req.Header.Set("X-API-Key", s.key)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

func (s *server) cli(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(s.bin, args...)
	cmd.Env = append(os.Environ(), "SPACE_URL="+s.ctrl, "SPACE_API_KEY="+s.key)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

type opEvent struct {
	State    string `json:"state"`
	Progress int    `json:"progress"`
	Message  string `json:"message"`
	Error    *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Result json.RawMessage `json:"result"`
}

// follow reads an operation's SSE stream until it is done.
func (s *server) follow(t *testing.T, id string) []opEvent { return s.followFrom(t, id, "") }

// followFrom resumes the stream after event lastID (replaying what the
// operation did before the stream connected).
func (s *server) followFrom(t *testing.T, id, lastID string) []opEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.ctrl+"/v1/operations/"+id+"/events", nil)
	req.Header.Set("X-API-Key", s.key)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("events: %v %v", resp, err)
	}
	defer resp.Body.Close()
	var evs []opEvent
	var ended *opEvent // the operation had ended when the stream opened
	skipped := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Data opEvent `json:"data"`
		}
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		if lastID != "" && !skipped {
			// The stream opens with the current state before replaying
			// history from lastID; a resumed follower drops it. If it is
			// final and nothing follows, the operation ended before the
			// stream connected, and that state is the answer.
			skipped = true
			if st := ev.Data.State; st == "succeeded" || st == "failed" || st == "cancelled" {
				ended = &ev.Data
			}
			continue
		}
		evs = append(evs, ev.Data)
		if st := ev.Data.State; st == "succeeded" || st == "failed" || st == "cancelled" {
			return evs
		}
	}
	if ended != nil && len(evs) == 0 && sc.Err() == nil {
		return []opEvent{*ended}
	}
	t.Fatalf("event stream ended early: %v (%+v)", sc.Err(), evs)
	return nil
}

func mkTar(t *testing.T, ents []*tar.Header, bodies map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range ents {
		b := bodies[h.Name]
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(b))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		h.ModTime = time.Unix(1700000000, 0)
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(b)
	}
	tw.Close()
	return buf.Bytes()
}

// busyboxImage is a two-layer image: busybox and accounts below; a
// whiteout, an opaque dir and new files above.
func busyboxImage(t *testing.T, env ...string) v1.Image {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	d := func(n string, mode int64, uid int) *tar.Header {
		return &tar.Header{Name: n, Typeflag: tar.TypeDir, Mode: mode, Uid: uid, Gid: uid}
	}
	ents := []*tar.Header{d("bin/", 0o755, 0), {Name: "bin/busybox", Mode: 0o755}}
	for _, a := range []string{"sh", "cat", "ls", "id", "pwd", "echo", "env"} {
		ents = append(ents, &tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox"})
	}
	ents = append(ents, d("etc/", 0o755, 0), &tar.Header{Name: "etc/passwd"}, &tar.Header{Name: "etc/group"},
		&tar.Header{Name: "etc/motd"}, d("tmp/", 0o1777, 0), d("proc/", 0o555, 0), d("sys/", 0o555, 0), d("dev/", 0o755, 0),
		d("app/", 0o755, 1000), &tar.Header{Name: "app/old", Uid: 1000, Gid: 1000})
	l1 := mkTar(t, ents, map[string][]byte{
		"bin/busybox": bb,
		"etc/passwd":  []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/app:/bin/sh\n"),
		"etc/group":   []byte("root:x:0:\napp:x:1000:\n"),
		"etc/motd":    []byte("lower\n"),
		"app/old":     []byte("old\n"),
	})
	l2 := mkTar(t, []*tar.Header{{Name: "etc/.wh.motd"}, d("app/", 0o755, 1000), {Name: "app/.wh..wh..opq"},
		{Name: "app/hello", Uid: 1000, Gid: 1000}}, map[string][]byte{"app/hello": []byte("from layer 2\n")})
	var ls []v1.Layer
	for _, b := range [][]byte{l1, l2} {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Env: append([]string{"PATH=/bin", "FOO=bar"}, env...), WorkingDir: "/app", User: "app", Cmd: []string{"sh"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

func ociLayoutTar(t *testing.T, img v1.Image) []byte {
	t.Helper()
	lp, err := layout.Write(t.TempDir(), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	root := string(lp)
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, _ := d.Info()
		h, _ := tar.FileInfoHeader(fi, "")
		h.Name = rel
		tw.WriteHeader(h)
		if d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			tw.Write(b)
		}
		return nil
	})
	tw.Close()
	return buf.Bytes()
}

func TestImageTemplatesEndToEnd(t *testing.T) {
	s := startServer(t)
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)

	// 1. Upload an OCI layout over the API and follow the build's SSE stream.
	tplName := "e2e-oci-" + suffix
	st, m := s.call(t, "POST", "/v1/templates/upload?name="+tplName, bytes.NewReader(ociLayoutTar(t, busyboxImage(t, "RUN="+suffix))), "application/x-tar")
	if st != 202 {
		t.Fatalf("upload: %d %v", st, m)
	}
	opID := m["operation"].(map[string]any)["id"].(string)
	evs := s.follow(t, opID)
	last := evs[len(evs)-1]
	if last.State != "succeeded" {
		t.Fatalf("build: %+v", last)
	}
	prev, layerMsgs := -1, 0
	for _, e := range evs {
		if e.Progress < prev {
			t.Errorf("progress went back: %d after %d (%q)", e.Progress, prev, e.Message)
		}
		prev = e.Progress
		if strings.Contains(e.Message, "layer ") {
			layerMsgs++
		}
	}
	t.Logf("%d progress events, %d naming a layer", len(evs), layerMsgs)
	var info struct {
		Digest, Source, Cwd, User string
		Env                       map[string]string
		Cmd                       []string
	}
	json.Unmarshal(last.Result, &info)
	if info.Source != "archive" || info.Cwd != "/app" || info.User != "app" || info.Env["FOO"] != "bar" || len(info.Cmd) != 1 {
		t.Errorf("template info %+v", info)
	}

	// 2. A sandbox of it sees exactly the image: files, env, cwd, user.
	out, errOut, err := s.cli(t, "sandbox", "create", "--template", tplName)
	if err != nil {
		t.Fatalf("sandbox create: %v\n%s%s", err, out, errOut)
	}
	sbID := strings.TrimSpace(out)
	defer s.cli(t, "sandbox", "rm", sbID)
	out, errOut, err = s.cli(t, "sandbox", "exec", sbID, "--shell", `pwd; id -u; echo "$FOO"; ls /app; cat /etc/motd 2>/dev/null || echo no-motd`)
	if err != nil {
		t.Fatalf("exec: %v\n%s%s", err, out, errOut)
	}
	if want := "/app\n1000\nbar\nhello\nno-motd\n"; out != want {
		t.Errorf("in the sandbox:\n%q\nwant\n%q", out, want)
	}

	// 3. The CLI uploads a docker-archive and shows progress.
	var docker bytes.Buffer
	tag, _ := name.NewTag("example.com/e2e:cli")
	if err := tarball.Write(tag, busyboxImage(t, "CLI="+suffix), &docker); err != nil {
		t.Fatal(err)
	}
	arch := filepath.Join(t.TempDir(), "image.tar")
	os.WriteFile(arch, docker.Bytes(), 0o644)
	out, errOut, err = s.cli(t, "template", "build", "e2e-docker-"+suffix, "--archive", arch)
	if err != nil {
		t.Fatalf("cli build: %v\n%s%s", err, out, errOut)
	}
	if !strings.Contains(out, "built e2e-docker-") || !strings.Contains(errOut, "template.build") {
		t.Errorf("cli output %q, progress %q", out, errOut)
	}
	t.Logf("cli progress:\n%s", errOut)

	// 4. A registry reference: the server refuses a loopback registry by
	// default (no probing of internal hosts), and bad references are 400.
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/e2e/img:1"
	r, _ := name.ParseReference(ref)
	if err := remote.Write(r, busyboxImage(t)); err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"name": "e2e-reg-" + suffix, "source": "image", "image": ref})
	st, m = s.call(t, "POST", "/v1/templates", bytes.NewReader(body), "application/json")
	if st != 202 {
		t.Fatalf("image build: %d %v", st, m)
	}
	evs = s.follow(t, m["operation"].(map[string]any)["id"].(string))
	if last := evs[len(evs)-1]; last.State != "failed" || last.Error == nil || !strings.Contains(last.Error.Message, "not public") {
		t.Errorf("loopback registry: %+v", last)
	}
	for _, bad := range []map[string]any{
		{"name": "x", "source": "image"},
		{"name": "x", "source": "image", "image": "a b"},
		{"name": "x", "source": "busybox", "image": "alpine"},
		{"name": "x", "source": "archive"},
	} {
		body, _ := json.Marshal(bad)
		if st, m := s.call(t, "POST", "/v1/templates", bytes.NewReader(body), "application/json"); st != 400 {
			t.Errorf("%v: %d %v", bad, st, m)
		}
	}
	if st, m := s.call(t, "POST", "/v1/templates/upload?name=..", strings.NewReader("x"), "application/x-tar"); st != 400 {
		t.Errorf("bad upload name: %d %v", st, m)
	}
	st, m = s.call(t, "POST", "/v1/templates/upload?name=e2e-junk-"+suffix, strings.NewReader("not a tarball"), "application/x-tar")
	if st != 202 {
		t.Fatalf("junk upload: %d %v", st, m)
	}
	if last := s.follow(t, m["operation"].(map[string]any)["id"].(string)); last[len(last)-1].State != "failed" {
		t.Errorf("junk archive built: %+v", last[len(last)-1])
	}
	// Every upload's spool file is gone once its build is done.
	if left, _ := filepath.Glob(filepath.Join(os.TempDir(), "space-template-upload-*")); len(left) > 0 {
		t.Errorf("upload spool files left: %v", left)
	}
}
