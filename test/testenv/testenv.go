// Package testenv runs a real `space server` process for end-to-end tests:
// it builds the binary, starts and restarts the server on loopback, makes
// API keys and speaks JSON over HTTP. The test packages under test/ share it.
package testenv

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RepoRoot finds the module root from the working directory.
func RepoRoot() string {
	wd, _ := os.Getwd()
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	return wd
}

// TemplateCache is the template directory shared by all test packages and
// runs, so templates are built once per machine (SPACE_TEMPLATE_CACHE).
func TemplateCache() string {
	if d := os.Getenv("SPACE_TEMPLATE_CACHE"); d != "" {
		return d
	}
	return "/var/tmp/space-test-templates"
}

// Server is one `space server` process and its directories.
type Server struct {
	Bin, Work, DataDir, RunDir, TemplateDir, LogPath string
	Ctrl, Data                                       string // base URLs, set by Start
	// Args are extra `space server` flags (e.g. "--builtins", "minimal,base").
	Args []string
	// Driver is the --driver flag; "" = $SPACE_TEST_DRIVER, else namespace.
	Driver string
	// Wrap, if set, runs the server through this command (e.g. nsenter
	// into a network namespace the test made); it must exec the server
	// so that signals reach it.
	Wrap []string
	// ExtraFiles are passed to the server as descriptors 3, 4, ... without
	// close-on-exec, as a careless supervisor would leak them.
	ExtraFiles []*os.File

	cmd *exec.Cmd
}

// New makes the directories and builds the binary. prefix names them.
func New(prefix string) (*Server, error) {
	work, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	// The sandboxes' mapped root must traverse the path to the agent binary
	// and state; MkdirTemp makes 0700.
	if err := os.Chmod(work, 0o711); err != nil {
		return nil, err
	}
	s := &Server{Bin: filepath.Join(work, "space"), Work: work, DataDir: filepath.Join(work, "data"),
		TemplateDir: TemplateCache(), LogPath: filepath.Join(work, "server.log")}
	// Agent sockets live here; unix socket paths are short.
	if s.RunDir, err = os.MkdirTemp("/tmp", "spr"); err != nil {
		return nil, err
	}
	// Both binaries, side by side: the server installs space-agent as the
	// sandboxes' PID 1 when it finds it next to itself.
	build := exec.Command("go", "build", "-o", work+"/", "./cmd/space", "./cmd/space-agent")
	build.Dir = RepoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return s, fmt.Errorf("build space: %v\n%s", err, out)
	}
	return s, nil
}

// Start launches the server and waits until it serves. A restart keeps the
// ports, as a real deployment would: clients hold URLs.
func (s *Server) Start() error {
	addrFile := filepath.Join(s.DataDir, "addr.json")
	if err := os.MkdirAll(s.DataDir, 0o711); err != nil {
		return err
	}
	os.Remove(addrFile)
	logf, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	ctrl, data := "127.0.0.1:0", "127.0.0.1:0"
	if s.Ctrl != "" {
		ctrl, data = strings.TrimPrefix(s.Ctrl, "http://"), strings.TrimPrefix(s.Data, "http://")
	}
	// The suites check driver-specific facts (uid maps, per-process OOM
	// kills, PID 1): pin the driver rather than let `auto` pick one.
	drv := s.Driver
	if drv == "" {
		drv = os.Getenv("SPACE_TEST_DRIVER")
	}
	if drv == "" {
		drv = "namespace"
	}
	args := append([]string{"server", "--driver", drv, "--data-dir", s.DataDir, "--run-dir", s.RunDir,
		"--template-dir", s.TemplateDir, "--listen", ctrl, "--data-listen", data,
		"--addr-file", addrFile}, s.Args...)
	argv := append(append(append([]string(nil), s.Wrap...), s.Bin), args...)
	s.cmd = exec.Command(argv[0], argv[1:]...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.ExtraFiles = s.ExtraFiles
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	go func(c *exec.Cmd, f *os.File) { c.Wait(); f.Close() }(s.cmd, logf)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if raw, err := os.ReadFile(addrFile); err == nil {
			var a struct{ Control, Data string }
			if json.Unmarshal(raw, &a) == nil {
				s.Ctrl, s.Data = a.Control, a.Data
				return nil
			}
		}
		if s.cmd.ProcessState != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("server did not start; log:\n%s", s.LogTail(20000))
}

// PID is the server process's pid (0 before Start).
func (s *Server) PID() int {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Kill9 kills the server the hard way and waits until it is gone.
func (s *Server) Kill9() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGKILL)
		for i := 0; i < 300 && s.cmd.ProcessState == nil; i++ {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// Stop asks the server to stop (SIGTERM), then kills it after 5 s.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGTERM)
		for i := 0; i < 500 && s.cmd.ProcessState == nil; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		s.Kill9()
	}
}

// Remove deletes the server's directories (not the shared template cache).
func (s *Server) Remove() {
	os.RemoveAll(s.Work)
	os.RemoveAll(s.RunDir)
}

// LogTail returns up to the last n bytes of the server log.
func (s *Server) LogTail(n int) string {
	log, _ := os.ReadFile(s.LogPath)
	if len(log) > n {
		log = log[len(log)-n:]
	}
	return string(log)
}

// CreateKey makes an API key for a project with `space keys create`;
// extra flags (e.g. "--admin") are passed on.
func (s *Server) CreateKey(project string, extra ...string) (string, error) {
	args := append([]string{"keys", "create", "--data-dir", s.DataDir, "--project", project}, extra...)
	out, err := exec.Command(s.Bin, args...).Output()
	if err != nil {
		return "", fmt.Errorf("keys create: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// WaitTemplate waits until GET /v1/templates/{name} answers 200; a 404
// (the build failed) ends the wait at once.
func (s *Server) WaitTemplate(key, name string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		st, m, _ := DoJSON("GET", s.Ctrl+"/v1/templates/"+name, map[string]string{"X-API-Key": key}, nil)
		if st == 200 {
			return nil
		}
		if st == 404 {
			return fmt.Errorf("template %s unavailable: %v", name, m)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("template %s not ready after %v; server log:\n%s", name, d, s.LogTail(20000))
}

// BuildFile posts a build file to POST /v1/templates/build?<query> (e.g.
// "name=x&public=true") and returns the status and decoded answer.
func (s *Server) BuildFile(key, query, file string) (int, map[string]any, error) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormField("buildfile")
	fw.Write([]byte(file))
	mw.Close()
	req, err := http.NewRequest("POST", s.Ctrl+"/v1/templates/build?"+query, &body)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("X-API-Key", key)
	resp, err := HTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&m); err != nil {
		return resp.StatusCode, nil, fmt.Errorf("decode build answer: %w", err)
	}
	return resp.StatusCode, m, nil
}

// HTTP is the client the tests use.
var HTTP = &http.Client{Timeout: 2 * time.Minute}

// DoJSON sends body (nil, []byte, string or a value to encode) and decodes a
// JSON answer; a non-JSON answer is an error.
func DoJSON(method, url string, hdr map[string]string, body any) (int, map[string]any, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		raw, _ := json.Marshal(b)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	for k, v := range hdr {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := HTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	var m map[string]any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &m); err != nil {
			return resp.StatusCode, nil, fmt.Errorf("non-JSON answer (%d): %.200s", resp.StatusCode, raw)
		}
	}
	return resp.StatusCode, m, nil
}

// CgroupBase is the cgroup directory name the server uses for its
// sandboxes; internal/server derives it from the data dir the same way.
func (s *Server) CgroupBase() string {
	sum := sha256.Sum256([]byte(filepath.Clean(s.DataDir)))
	return "space-" + hex.EncodeToString(sum[:4])
}

// RemoveCgroupBase removes the server's per-data-dir cgroup directories,
// which only succeeds once they are empty (all sandboxes gone).
func (s *Server) RemoveCgroupBase() {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + s.CgroupBase())
	more, _ := filepath.Glob("/sys/fs/cgroup/*/*/*/" + s.CgroupBase()) // v1 memory under the node's own cgroup
	for _, d := range append(dirs, more...) {
		os.Remove(d)
	}
}

// DeleteSandboxes deletes every live sandbox of key's project and waits
// for the deletes, so that a test's sandboxes do not outlive its server
// (they would: sandboxes survive a server stop by design). It lists again
// until none is left, for up to five minutes: a benchmark leaves thousands,
// more than one page, and sandboxes still being created refuse a delete
// (it gives up after 30 s in which no delete was accepted).
func (s *Server) DeleteSandboxes(key string) {
	if s.Ctrl == "" || key == "" {
		return
	}
	hdr := map[string]string{"X-API-Key": key}
	stuck := 0 // rounds in a row in which no delete was accepted
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline) && stuck < 30; {
		st, m, err := DoJSON("GET", s.Ctrl+"/v1/sandboxes?state=creating,running,paused,hibernated&limit=1000", hdr, nil)
		if err != nil || st != http.StatusOK {
			return
		}
		list, _ := m["sandboxes"].([]any)
		if len(list) == 0 {
			return
		}
		var ops []string
		for _, it := range list {
			sb, _ := it.(map[string]any)
			id, _ := sb["id"].(string)
			if id == "" {
				continue
			}
			if st, m, err := DoJSON("DELETE", s.Ctrl+"/v1/sandboxes/"+id, hdr, nil); err == nil && st == http.StatusAccepted {
				if op, ok := m["operation"].(map[string]any); ok {
					ops = append(ops, op["id"].(string))
				}
			}
		}
		for _, op := range ops {
			DoJSON("GET", s.Ctrl+"/v1/operations/"+op+"?wait=30s", hdr, nil)
		}
		if len(ops) == 0 {
			stuck++
			time.Sleep(time.Second)
		} else {
			stuck = 0
		}
	}
}

// FreeAddr returns a loopback address nothing listens on (at the moment:
// for a server that must know its port before it starts).
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
