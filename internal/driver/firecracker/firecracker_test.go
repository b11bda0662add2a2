package firecracker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/agent/client"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/vmimage"
)

// The test binary doubles as a fake firecracker: with fakeSockEnv set it
// serves Firecracker's API on that socket, logs every request to
// fakeLogEnv, and when given a vsock device it serves the agent's HTTP API
// behind Firecracker's "CONNECT <port>" handshake on the device's socket.
const (
	fakeSockEnv = "SPACE_FAKE_FC_SOCK"
	fakeLogEnv  = "SPACE_FAKE_FC_LOG"
)

func TestMain(m *testing.M) {
	if sock := os.Getenv(fakeSockEnv); sock != "" {
		if err := fakeFirecracker(sock, os.Getenv(fakeLogEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "fake firecracker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type apiCall struct {
	Method, Path string
	Body         json.RawMessage
}

func fakeFirecracker(sock, logPath string) error {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(logf)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if len(body) == 0 {
			body = []byte("null")
		}
		_ = enc.Encode(apiCall{r.Method, r.URL.Path, body})
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/machine-config":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"vcpu_count":1,"mem_size_mib":128}`)
		case r.Method == http.MethodPut && r.URL.Path == "/vsock":
			var v struct {
				UDSPath string `json:"uds_path"`
			}
			if err := json.Unmarshal(body, &v); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if err := fakeVsock(v.UDSPath); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		case r.Method == http.MethodPut && r.URL.Path == "/snapshot/load":
			// Firecracker recreates the vsock device, at the path the
			// snapshot recorded: the sandbox dir's vsock.sock.
			if err := fakeVsock(filepath.Join(filepath.Dir(sock), "vsock.sock")); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	return http.Serve(l, mux)
}

// fakeVsock answers CONNECT 1024 like Firecracker and hands the stream to
// a real agent server (only /health is used).
func fakeVsock(path string) error {
	l, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	conns := make(chan net.Conn)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				br := bufio.NewReader(c)
				line, err := br.ReadString('\n')
				if err != nil || line != fmt.Sprintf("CONNECT %d\n", AgentPort) {
					_, _ = io.WriteString(c, "FAILURE\n")
					c.Close()
					return
				}
				_, _ = io.WriteString(c, "OK 1073741824\n")
				conns <- c
			}()
		}
	}()
	go func() {
		_ = agent.NewServer(agent.Options{Version: "fake"}).Serve(context.Background(), chanListener(conns))
	}()
	return nil
}

type chanListener chan net.Conn

func (c chanListener) Accept() (net.Conn, error) { return <-c, nil }
func (c chanListener) Close() error              { return nil }
func (c chanListener) Addr() net.Addr            { return &net.UnixAddr{Name: "fake", Net: "unix"} }

// testDriver builds a driver whose firecracker is the fake and whose
// images are tiny stand-ins (the fake never boots them).
func testDriver(t *testing.T) (*Driver, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "fct") // short: sockets live below it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 (e2fsprogs) is needed to build the disks")
	}
	logPath := filepath.Join(dir, "api.log")
	files := map[string]string{"vmlinux": "\x7fELF fake kernel", "busybox": "fake", "space": "fake agent"}
	for n, c := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mods := filepath.Join(dir, "modules")
	if err := os.MkdirAll(filepath.Join(mods, "kernel"), 0o755); err != nil {
		t.Fatal(err)
	}
	var dep strings.Builder
	for _, m := range []string{"virtio_blk", "virtio_console"} {
		fmt.Fprintf(&dep, "kernel/%s.ko:\n", m)
		if err := os.WriteFile(filepath.Join(mods, "kernel", m+".ko"), []byte("ko"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(mods, "modules.dep"), []byte(dep.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{
		StateDir: filepath.Join(dir, "s"), AgentPath: filepath.Join(dir, "space"),
		Kernel: filepath.Join(dir, "vmlinux"), ModulesDir: mods, Busybox: filepath.Join(dir, "busybox"),
		UpperSize: 64 << 20, Logf: t.Logf, skipHostCheck: true,
		command: func(sock string) *exec.Cmd {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fakeSockEnv+"="+sock, fakeLogEnv+"="+logPath)
			return cmd
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Sweep(context.Background(), nil) })
	return d, rootfs
}

func readCalls(t *testing.T, d *Driver) []apiCall {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(filepath.Dir(d.opts.StateDir), "api.log"))
	if err != nil {
		t.Fatal(err)
	}
	var calls []apiCall
	dec := json.NewDecoder(strings.NewReader(string(b)))
	for {
		var c apiCall
		if err := dec.Decode(&c); errors.Is(err, io.EOF) {
			return calls
		} else if err != nil {
			t.Fatal(err)
		}
		if c.Method == http.MethodGet && c.Path == "/machine-config" {
			continue // the SDK's readiness probe, repeated
		}
		calls = append(calls, c)
	}
}

// TestRequestSequence checks what the driver asks Firecracker for, in
// order, against Firecracker's API (machine config, boot source, drives,
// vsock, InstanceStart; then pause, resume and snapshots), and that the
// agent is reached through the vsock CONNECT handshake.
func TestRequestSequence(t *testing.T) {
	d, rootfs := testDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inst, err := d.Create(ctx, driver.Spec{ID: "fc-a", Hostname: "box-a", RootfsDir: rootfs,
		Limits: driver.Limits{MemoryBytes: 128 << 20, CPUMillis: 2000}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inst.Destroy(context.Background()) })
	fi := inst.(*Instance)
	if err := fi.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fi.Snapshot(ctx, "/snap/mem", "/snap/state", true); err != nil {
		t.Fatal(err)
	}
	if err := fi.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	calls := readCalls(t, d)
	var got []string
	for _, c := range calls {
		got = append(got, c.Method+" "+c.Path)
	}
	want := []string{
		"PUT /machine-config", "PUT /boot-source",
		"PUT /drives/root", "PUT /drives/upper", "PUT /drives/agent",
		"PUT /vsock", "PUT /actions",
		"PATCH /vm", "PUT /snapshot/create", "PATCH /vm",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("API calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	body := func(i int) map[string]any {
		var m map[string]any
		if err := json.Unmarshal(calls[i].Body, &m); err != nil {
			t.Fatalf("%s: %v", got[i], err)
		}
		return m
	}
	if m := body(0); m["vcpu_count"] != 2.0 || m["mem_size_mib"] != float64(128+guestOverheadMiB) || m["track_dirty_pages"] != true {
		t.Errorf("machine-config %v", m)
	}
	if m := body(1); !strings.Contains(m["boot_args"].(string), "space.hostname=box-a") || m["initrd_path"] == nil {
		t.Errorf("boot-source %v", m)
	}
	for i, name := range []string{vmimage.SerialRoot, vmimage.SerialUpper, vmimage.SerialAgent} {
		m := body(2 + i)
		if m["drive_id"] != name || m["is_root_device"] != false || m["is_read_only"] != (name != vmimage.SerialUpper) {
			t.Errorf("drive %s: %v", name, m)
		}
	}
	if m := body(5); m["guest_cid"] != float64(guestCID) || m["uds_path"] != d.vsockPath("fc-a") {
		t.Errorf("vsock %v", m)
	}
	if m := body(6); m["action_type"] != "InstanceStart" {
		t.Errorf("actions %v", m)
	}
	if m := body(7); m["state"] != "Paused" {
		t.Errorf("pause %v", m)
	}
	if m := body(8); m["snapshot_type"] != "Diff" || m["mem_file_path"] != "/snap/mem" {
		t.Errorf("snapshot %v", m)
	}
	if m := body(9); m["state"] != "Resumed" {
		t.Errorf("resume %v", m)
	}

	// Re-adopted by a new driver value, as after a node restart.
	d2 := &Driver{opts: d.opts, disks: d.disks}
	re, err := d2.Attach(ctx, "fc-a")
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	pid := re.(*Instance).PID()
	if err := re.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.sandboxDir("fc-a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox dir left: %v", err)
	}
	if _, _, err := procStat(pid); err == nil && d.alive(re.(*Instance).st) {
		t.Errorf("firecracker process %d still running", pid)
	}
	if _, err := d2.Attach(ctx, "fc-a"); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("attach after destroy: %v", err)
	}
}

func TestNewRefusesWithoutKVM(t *testing.T) {
	if vmimage.KVMUsable() {
		t.Skip("KVM works here")
	}
	_, err := New(Options{StateDir: t.TempDir(), AgentPath: "/bin/true"})
	if !errors.Is(err, driver.ErrUnsupported) || !strings.Contains(err.Error(), "/dev/kvm") {
		t.Fatalf("New without KVM: %v", err)
	}
}

func TestDialVsockRefused(t *testing.T) {
	dir, err := os.MkdirTemp("", "fcv")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "v.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = bufio.NewReader(c).ReadString('\n')
		_, _ = io.WriteString(c, "FAILURE\n")
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := DialVsock(ctx, sock, AgentPort); err == nil {
		c.Close()
		t.Fatal("CONNECT answered FAILURE but DialVsock succeeded")
	}
}

// TestCheckpointRestoreSequence checks the snapshot requests: Checkpoint
// pauses and writes a Full snapshot into the directory (plus the disk and
// the VM's description); Restore into the same id (the original gone)
// starts a new Firecracker, loads the snapshot with resume_vm and reaches
// the agent; a restore into another id is refused (the snapshot names the
// original's absolute paths).
func TestCheckpointRestoreSequence(t *testing.T) {
	d, rootfs := testDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inst, err := d.Create(ctx, driver.Spec{ID: "fc-c", RootfsDir: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inst.Destroy(context.Background()) })
	ck := filepath.Join(filepath.Dir(d.opts.StateDir), "ck")
	if err := inst.(*Instance).Checkpoint(ctx, ck); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{ckptUpper, ckptConfig} {
		if _, err := os.Stat(filepath.Join(ck, f)); err != nil {
			t.Errorf("checkpoint file %s: %v", f, err)
		}
	}
	pid := inst.(*Instance).PID()
	if err := inst.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Restore(ctx, driver.Spec{ID: "fc-other", RootfsDir: rootfs}, ck); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("restore into another id: %v", err)
	}
	if _, err := os.Stat(d.sandboxDir("fc-other")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused restore left %s: %v", d.sandboxDir("fc-other"), err)
	}
	d2 := &Driver{opts: d.opts, disks: d.disks} // as after a node restart
	re, err := d2.Restore(ctx, driver.Spec{ID: "fc-c", RootfsDir: rootfs}, ck)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if re.(*Instance).PID() == pid {
		t.Error("restore reused the old process")
	}
	c := client.New(re.Dial)
	if err := c.Health(ctx); err != nil {
		t.Errorf("agent after restore: %v", err)
	}
	c.Close()
	calls := readCalls(t, d)
	var got []string
	for _, c := range calls {
		got = append(got, c.Method+" "+c.Path)
	}
	want := []string{
		"PUT /machine-config", "PUT /boot-source",
		"PUT /drives/root", "PUT /drives/upper", "PUT /drives/agent",
		"PUT /vsock", "PUT /actions",
		"PATCH /vm", "PUT /snapshot/create",
		"PUT /snapshot/load",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("API calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var create, load map[string]any
	_ = json.Unmarshal(calls[8].Body, &create)
	_ = json.Unmarshal(calls[9].Body, &load)
	if create["snapshot_type"] != "Full" || create["mem_file_path"] != filepath.Join(ck, ckptMemory) || create["snapshot_path"] != filepath.Join(ck, ckptState) {
		t.Errorf("snapshot/create %v", create)
	}
	if load["snapshot_path"] != filepath.Join(ck, ckptState) || load["mem_file_path"] != filepath.Join(ck, ckptMemory) || load["resume_vm"] != true {
		t.Errorf("snapshot/load %v", load)
	}
	if err := re.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.sandboxDir("fc-c")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox dir left: %v", err)
	}
}
