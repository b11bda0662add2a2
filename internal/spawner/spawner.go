// Package spawner starts processes from a small helper process instead of
// from the caller.
//
// A fork copies the page tables of the forking process. Go's os/exec can
// use CLONE_VFORK|CLONE_VM (no copy) except when the child gets a new user
// namespace: then the parent must write the child's uid and gid maps
// before the child execs, so every namespace sandbox's PID 1 is a full
// fork. Forked from a server with hundreds of MiB mapped, that copy was
// about 5 ms of CPU per create (a fifth of a create/exec/delete cycle's
// CPU under 16 clients, issue 25). The helper is the slim agent binary
// started once in a mode that does nothing but fork on request: a few MiB
// mapped, so its forks are cheap whatever the server's size.
//
// The caller and the helper talk over a SOCK_SEQPACKET socket pair. Each
// request is one message: the JSON Request, and as rights a reply socket
// (one end of a fresh pair) followed by the child's stdout, stderr and
// extra descriptors. The helper forks, answers on the reply socket with the
// pid and a non-blocking pidfd (the caller watches and signals the child
// through it; the helper is its parent and reaps it), and writes the child's exit
// status there when it ends. The helper exits when the caller's end of the
// pair closes (the caller exited); running children are not touched.
package spawner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Request is one process to start; its descriptors travel beside it.
type Request struct {
	Path string
	Args []string
	Env  []string
	Dir  string
	// Attr is passed to the fork as it is, but for PidFD (the caller
	// gets a pidfd anyway).
	Attr syscall.SysProcAttr
}

type reply struct {
	Pid  int    `json:",omitempty"`
	Err  string `json:",omitempty"`
	Exit string `json:",omitempty"` // second message: the child's wait status
}

// maxFiles bounds the descriptors of one request: the reply socket,
// stdout, stderr and up to this many less three extra.
const maxFiles = 16

// maxMsg bounds one request's JSON (args and env of a sandbox's PID 1 are
// a few hundred bytes).
const maxMsg = 64 << 10

// Client is the caller's end: it starts the helper and sends it requests.
// It is safe for concurrent use.
type Client struct {
	conn *net.UnixConn
	cmd  *exec.Cmd
	dead chan struct{} // closed once the helper has exited
}

// Start runs path with args as the helper, the pair's other end as its fd
// 3 (the helper then calls Serve on it). It waits for the helper's hello,
// so a binary that does not know the mode fails here rather than on the
// first request.
func Start(ctx context.Context, path string, args []string) (*Client, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("spawner: socketpair: %w", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "spawner")
	theirs := os.NewFile(uintptr(fds[1]), "spawner-helper")
	defer theirs.Close()
	conn, err := fileConn(mine)
	if err != nil {
		_ = theirs.Close()
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stderr = os.Stderr
	cmd.Env = []string{}
	if err := cmd.Start(); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("spawner: start %s: %w", path, err)
	}
	c := &Client{conn: conn, cmd: cmd, dead: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(c.dead)
	}()
	_ = theirs.Close()
	deadline := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetReadDeadline(deadline)
	b := make([]byte, 16)
	n, err := conn.Read(b)
	_ = conn.SetReadDeadline(time.Time{})
	if err != nil || string(b[:n]) != hello {
		c.Close()
		return nil, fmt.Errorf("spawner: %s %v gave no hello (%q, %v)", path, args, b[:n], err)
	}
	return c, nil
}

const hello = "spawner"

// HelperFD is the helper's end of the pair in the helper.
const HelperFD = 3

// Close stops the helper; children it started run on.
func (c *Client) Close() {
	_ = c.conn.Close()
	select {
	case <-c.dead:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.dead
	}
}

// Alive reports whether the helper still runs.
func (c *Client) Alive() bool {
	select {
	case <-c.dead:
		return false
	default:
		return true
	}
}

// Process is a child started through the helper.
type Process struct {
	Pid int
	// PidFD refers to the child (the caller owns it).
	PidFD *os.File
	reply *net.UnixConn
}

// Exit waits for the helper's report of the child's end: nil for status 0,
// else the error os/exec gave. Call it once the child is known to have
// exited (its pidfd turned readable); it gives up after wait.
func (p *Process) Exit(wait time.Duration) error {
	defer p.reply.Close()
	_ = p.reply.SetReadDeadline(time.Now().Add(wait))
	b := make([]byte, 4096)
	n, err := p.reply.Read(b)
	if err != nil {
		return fmt.Errorf("spawner: no exit status: %w", err)
	}
	var r reply
	if err := json.Unmarshal(b[:n], &r); err != nil {
		return fmt.Errorf("spawner: exit status: %w", err)
	}
	if r.Exit != "" {
		return errors.New(r.Exit)
	}
	return nil
}

// Release drops the reply socket without waiting for an exit status.
func (p *Process) Release() { _ = p.reply.Close() }

// Spawn starts one process through the helper. files are the child's fds
// 1, 2, 3, ... (stdout, stderr, then the extra files); fd 0 is /dev/null.
// The child is started when Spawn returns without error (its exec
// succeeded, as with exec.Cmd.Start).
func (c *Client) Spawn(ctx context.Context, req Request, files []*os.File) (*Process, error) {
	if len(files) < 2 || len(files)+1 > maxFiles {
		return nil, fmt.Errorf("spawner: %d files (need stdout, stderr and at most %d more)", len(files), maxFiles-3)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("spawner: %w", err)
	}
	if len(b) > maxMsg {
		return nil, fmt.Errorf("spawner: request of %d bytes is too long", len(b))
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("spawner: socketpair: %w", err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "spawner-reply")
	defer theirs.Close()
	rc, err := fileConn(os.NewFile(uintptr(fds[0]), "spawner-reply"))
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = rc.Close()
		}
	}()
	raw := []int{int(theirs.Fd())}
	for _, f := range files {
		raw = append(raw, int(f.Fd()))
	}
	if _, _, err := c.conn.WriteMsgUnix(b, unix.UnixRights(raw...), nil); err != nil {
		return nil, fmt.Errorf("spawner: send: %w: %w", err, errHelper)
	}
	_ = theirs.Close() // the helper holds its copy; EOF on rc if it dies
	stop := context.AfterFunc(ctx, func() { _ = rc.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := rc.ReadMsgUnix(buf, oob)
	if err != nil || n == 0 {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		// The request went out: a child may exist, holding the caller's
		// descriptors, so the caller must not start another with them.
		return nil, fmt.Errorf("spawner: no answer (%v)", err)
	}
	var r reply
	if err := json.Unmarshal(buf[:n], &r); err != nil {
		return nil, fmt.Errorf("spawner: answer: %w", err)
	}
	pidfd, perr := parseFD(oob[:oobn])
	if r.Err != "" {
		if pidfd != nil {
			_ = pidfd.Close()
		}
		return nil, errors.New(r.Err)
	}
	if perr != nil || r.Pid <= 0 {
		return nil, fmt.Errorf("spawner: answer without pid or pidfd (%v)", perr)
	}
	ok = true
	return &Process{Pid: r.Pid, PidFD: pidfd, reply: rc}, nil
}

// errHelper marks a request that never reached the helper (it is gone):
// nothing was started, so the caller may start the process another way.
var errHelper = errors.New("spawner helper failed")

// IsHelperFailure reports whether err means the request never reached the
// helper.
func IsHelperFailure(err error) bool { return errors.Is(err, errHelper) }

// parseFD returns the one descriptor a reply carries (closing any more).
func parseFD(oob []byte) (*os.File, error) {
	files := filesOf(oob)
	if len(files) == 0 {
		return nil, errors.New("no descriptor")
	}
	closeAll(files[1:])
	return files[0], nil
}

func fileConn(f *os.File) (*net.UnixConn, error) {
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("spawner: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		_ = c.Close()
		return nil, errors.New("spawner: not a unix socket")
	}
	return uc, nil
}

// Serve is the helper's side on fd (the pair's end it got as fd 3): it
// answers requests until the caller's end closes, then returns. Children
// still running are left alone (once the helper exits they are reparented
// to the host's init or subreaper, which reaps them).
func Serve(fd int) error {
	unix.CloseOnExec(fd)
	conn, err := fileConn(os.NewFile(uintptr(fd), "spawner"))
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(hello)); err != nil {
		return fmt.Errorf("spawner: hello: %w", err)
	}
	buf := make([]byte, maxMsg)
	oob := make([]byte, unix.CmsgSpace(4*maxFiles))
	for {
		n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("spawner: read: %w", err)
		}
		if n == 0 && oobn == 0 {
			return nil // the caller is gone
		}
		files := filesOf(oob[:oobn])
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || len(files) < 3 {
			closeAll(files)
			continue // malformed: no reply socket to answer on, or cut
		}
		var req Request
		if err := json.Unmarshal(buf[:n], &req); err != nil {
			answer(files[0], reply{Err: "spawner: bad request: " + err.Error()})
			closeAll(files)
			continue
		}
		go spawn(req, files)
	}
}

// spawn starts one request's process, answers, and reports its end.
func spawn(req Request, files []*os.File) {
	replyTo := files[0]
	attr := req.Attr
	attr.PidFD = nil
	cmd := &exec.Cmd{
		Path:        req.Path,
		Args:        req.Args,
		Env:         req.Env,
		Dir:         req.Dir,
		Stdout:      files[1],
		Stderr:      files[2],
		ExtraFiles:  files[3:],
		SysProcAttr: &attr,
	}
	err := cmd.Start()
	closeAll(files[1:])
	if err != nil {
		answer(replyTo, reply{Err: fmt.Sprintf("start %s: %v", req.Path, err)})
		_ = replyTo.Close()
		return
	}
	// A pidfd of its own for the caller, not the one os/exec waits on: the
	// caller's is non-blocking (for its poller), and that flag, on a shared
	// open file, would turn the Wait below into EAGAIN. The child cannot
	// have been reaped yet: only that Wait reaps it.
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		answer(replyTo, reply{Err: fmt.Sprintf("pidfd_open %d: %v", cmd.Process.Pid, err)})
		_ = replyTo.Close()
		return
	}
	b, _ := json.Marshal(reply{Pid: cmd.Process.Pid})
	_ = unix.Sendmsg(int(replyTo.Fd()), b, unix.UnixRights(pidfd), nil, 0)
	_ = unix.Close(pidfd)
	werr := cmd.Wait()
	var r reply
	if werr != nil {
		r.Exit = werr.Error()
	}
	b, _ = json.Marshal(r)
	_ = unix.Sendmsg(int(replyTo.Fd()), b, nil, nil, 0)
	_ = replyTo.Close()
}

func answer(f *os.File, r reply) {
	b, _ := json.Marshal(r)
	_ = unix.Sendmsg(int(f.Fd()), b, nil, nil, 0)
}

func filesOf(oob []byte) []*os.File {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var out []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			out = append(out, os.NewFile(uintptr(fd), "spawned-fd"))
		}
	}
	return out
}

func closeAll(files []*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}
