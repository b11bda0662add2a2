package spawner

import (
	"context"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// helperArg makes the test binary the helper.
const helperArg = "spawner-test-helper"

func TestMain(m *testing.M) {
	if len(os.Args) == 2 && os.Args[1] == helperArg {
		if err := Serve(HelperFD); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func startHelper(t *testing.T) *Client {
	t.Helper()
	c, err := Start(context.Background(), os.Args[0], []string{helperArg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func shell(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/bin/sh", "/usr/bin/sh"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("no /bin/sh")
	return ""
}

func devNull(t *testing.T) *os.File {
	t.Helper()
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// waitExit waits for a pidfd to turn readable (the process exited).
func waitExit(t *testing.T, f *os.File) {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 10_000)
	if err != nil || n != 1 {
		t.Fatalf("pidfd not readable after 10s (n=%d, %v)", n, err)
	}
}

func TestSpawnOutputExtraFilesAndExit(t *testing.T) {
	sh := shell(t)
	c := startHelper(t)
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	extraR, extraW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer extraR.Close()
	req := Request{Path: sh, Args: []string{"sh", "-c", `echo "out $FOO $(pwd)"; echo extra >&3; exit 3`}, Env: []string{"FOO=bar"}, Dir: "/"}
	p, err := c.Spawn(context.Background(), req, []*os.File{outW, outW, extraW})
	outW.Close()
	extraW.Close()
	if err != nil {
		t.Fatal(err)
	}
	if p.Pid <= 0 || p.PidFD == nil {
		t.Fatalf("pid %d, pidfd %v", p.Pid, p.PidFD)
	}
	defer p.PidFD.Close()
	out, _ := io.ReadAll(outR)
	extra, _ := io.ReadAll(extraR)
	if string(out) != "out bar /\n" || string(extra) != "extra\n" {
		t.Fatalf("stdout %q, fd 3 %q", out, extra)
	}
	waitExit(t, p.PidFD)
	if err := p.Exit(5 * time.Second); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("exit: %v, want exit status 3", err)
	}
}

func TestSpawnSignalThroughPidfd(t *testing.T) {
	sh := shell(t)
	c := startHelper(t)
	devnull := devNull(t)
	p, err := c.Spawn(context.Background(), Request{Path: sh, Args: []string{"sh", "-c", "sleep 60"}}, []*os.File{devnull, devnull})
	if err != nil {
		t.Fatal(err)
	}
	defer p.PidFD.Close()
	if err := unix.PidfdSendSignal(int(p.PidFD.Fd()), unix.SIGKILL, nil, 0); err != nil {
		t.Fatal(err)
	}
	waitExit(t, p.PidFD)
	if err := p.Exit(5 * time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("exit: %v, want killed", err)
	}
}

func TestSpawnStartFailure(t *testing.T) {
	c := startHelper(t)
	devnull := devNull(t)
	_, err := c.Spawn(context.Background(), Request{Path: "/nonexistent/binary"}, []*os.File{devnull, devnull})
	if err == nil || IsHelperFailure(err) || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("err = %v, want the start's own error", err)
	}
	// The helper serves on after a failed start.
	if !c.Alive() {
		t.Fatal("helper died after a failed start")
	}
}

func TestHelperGone(t *testing.T) {
	c := startHelper(t)
	_ = c.cmd.Process.Kill()
	<-c.dead
	if c.Alive() {
		t.Fatal("Alive after the helper was killed")
	}
	devnull := devNull(t)
	_, err := c.Spawn(context.Background(), Request{Path: "/bin/true"}, []*os.File{devnull, devnull})
	if !IsHelperFailure(err) {
		t.Fatalf("err = %v, want a helper failure", err)
	}
}

func TestStartWithoutHelperMode(t *testing.T) {
	sh := shell(t)
	if _, err := Start(context.Background(), sh, []string{"-c", "exit 0"}); err == nil {
		t.Fatal("Start succeeded with a binary that is no helper")
	}
}

func TestHelperExitsWithCaller(t *testing.T) {
	c := startHelper(t)
	_ = c.conn.Close()
	select {
	case <-c.dead:
	case <-time.After(10 * time.Second):
		t.Fatal("helper still runs 10s after its caller's end closed")
	}
}

// TestSpawnNamespacesReaped starts the namespace driver's kind of child (a
// new user and pid namespace, uid map written by the helper) and checks
// that a kill through the caller's pidfd leaves no zombie: the caller's
// pidfd is non-blocking, and the helper's wait must not inherit that.
func TestSpawnNamespacesReaped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for user namespaces with a uid map")
	}
	sh := shell(t)
	c := startHelper(t)
	devnull := devNull(t)
	idMap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}}
	attr := syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNS,
		UidMappings: idMap, GidMappings: idMap, GidMappingsEnableSetgroups: true,
		Credential: &syscall.Credential{}, Setsid: true,
	}
	for i := 0; i < 3; i++ {
		p, err := c.Spawn(context.Background(), Request{Path: sh, Args: []string{"sh", "-c", "sleep 60 & sleep 60"}, Attr: attr}, []*os.File{devnull, devnull})
		if err != nil {
			t.Fatal(err)
		}
		uidMap, _ := os.ReadFile("/proc/" + strconv.Itoa(p.Pid) + "/uid_map")
		if f := strings.Fields(string(uidMap)); len(f) != 3 || f[1] != "100000" {
			t.Errorf("uid_map %q, want 0 100000 65536", uidMap)
		}
		if err := unix.PidfdSendSignal(int(p.PidFD.Fd()), unix.SIGKILL, nil, 0); err != nil {
			t.Fatal(err)
		}
		waitExit(t, p.PidFD)
		if err := p.Exit(5 * time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
			t.Errorf("exit: %v, want killed", err)
		}
		_ = p.PidFD.Close()
		deadline := time.Now().Add(5 * time.Second)
		for {
			if _, err := os.Stat("/proc/" + strconv.Itoa(p.Pid)); os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pid %d not reaped 5s after its exit was reported", p.Pid)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
