package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ptyBufferBound is more than a terminal can hold between the command and
// the master (tty flip buffers plus line discipline), used like a pipe's
// capacity to tell output written before exit from output written after.
const ptyBufferBound = 256 << 10

// process is one command the server started.
type process struct {
	s    *Server
	id   string
	pid  int
	argv []string
	tag  string
	pty  bool
	log  *eventLog

	outputs  []*output
	detached atomic.Bool // the exit event is out: discard further output
	retained int         // output bytes retained once exited; guarded by s.mu

	mu       sync.Mutex
	reaped   bool  // the leader's status was collected: its pid is not ours
	timedOut bool  // killed at the deadline
	exit     *Exit // set when the exit event is in the log

	stdin       *os.File // pipe write end or the PTY master; nil without stdin
	stdinMu     sync.Mutex
	stdinClosed bool // guarded by mu
}

// output is one stream the server reads: stdout, stderr or the PTY master.
type output struct {
	f         *os.File
	typ       byte
	capacity  int64        // bytes the kernel can buffer between command and us
	total     atomic.Int64 // bytes read so far
	idleSince atomic.Int64 // unix nanos when a read started waiting; 0 while not in read
	done      chan struct{}
}

func (s *Server) handleStart(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
	if err != nil {
		writeErr(w, err)
		return
	}
	spec, err := decodeProcessSpec(body)
	if err != nil {
		writeErr(w, err)
		return
	}
	follow := strings.Contains(r.Header.Get("Accept"), EventsContentType)
	info, p, lr, err := s.start(spec, follow)
	if err != nil {
		writeErr(w, err)
		return
	}
	if !follow {
		writeJSON(w, http.StatusCreated, info)
		return
	}
	// Start and follow in one request: the host's reader of the command's
	// events needs no second round trip. The stream is the one GET
	// .../events sends, after a started frame with the process's info.
	defer p.log.detach(lr)
	raw, err := json.Marshal(info)
	if err != nil {
		writeErr(w, err) // cannot happen: ProcessInfo always encodes
		return
	}
	s.streamEvents(w, r, p, lr, http.StatusCreated, raw)
}

// resolveUser finds the account to run as and the credential to set. An
// agent that is not root can only run commands as itself.
func (s *Server) resolveUser(name string) (account, *syscall.Credential, error) {
	euid := os.Geteuid()
	if name == "" {
		name = strconv.Itoa(euid)
	}
	acct, err := lookupUser(s.opts.etcDir, name)
	if err != nil {
		return account{}, nil, newAPIError(http.StatusBadRequest, CodeUnknownUser, "%v", err)
	}
	if euid == 0 {
		return acct, &syscall.Credential{Uid: acct.UID, Gid: acct.GID, Groups: acct.Groups}, nil
	}
	if int(acct.UID) != euid {
		return account{}, nil, newAPIError(http.StatusForbidden, CodePermissionDenied, "agent is not root and cannot run commands as %q", truncate(name, 64))
	}
	return acct, nil, nil
}

// start launches spec. Everything that can fail for a reason the caller
// controls is checked before anything is allocated.
//
// With follow, the process's event log has a reader attached at seq 0 before
// the fork, so no event can be dropped before the caller streams them; the
// caller detaches it.
func (s *Server) start(spec ProcessSpec, follow bool) (_ ProcessInfo, _ *process, _ *logReader, err error) {
	cfg := s.config()
	userName := spec.User
	if userName == "" {
		userName = cfg.User
	}
	acct, cred, err := s.resolveUser(userName)
	if err != nil {
		return ProcessInfo{}, nil, nil, err
	}
	cwd := spec.Cwd
	if cwd == "" {
		cwd = cfg.Cwd
	}
	if cwd != "" {
		if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
			return ProcessInfo{}, nil, nil, newAPIError(http.StatusBadRequest, CodeInvalidCwd, "cwd %q is not a directory", truncate(cwd, 256))
		}
	} else if fi, err := os.Stat(acct.Home); err == nil && fi.IsDir() {
		cwd = acct.Home
	} else {
		cwd = "/"
	}
	argv := spec.Argv
	if spec.Shell != "" {
		argv = []string{"/bin/sh", "-c", spec.Shell}
	}
	env := buildEnv(acct, spec.PTY != nil, cfg.Env, spec.Env)
	prog, err := lookPath(argv[0], envValue(env, "PATH"), cwd)
	if err != nil {
		return ProcessInfo{}, nil, nil, err
	}

	s.mu.Lock()
	switch {
	case s.closing:
		s.mu.Unlock()
		return ProcessInfo{}, nil, nil, newAPIError(http.StatusServiceUnavailable, CodeUnavailable, "agent is shutting down")
	case s.live >= s.opts.MaxProcesses:
		s.mu.Unlock()
		return ProcessInfo{}, nil, nil, newAPIError(http.StatusTooManyRequests, CodeTooManyProcesses, "%d processes are running", s.live)
	}
	s.live++
	id := strconv.FormatUint(s.nextID, 10)
	s.nextID++
	// Counted before closing can be set, so a shutdown waits for this
	// start and then for the goroutines it adds.
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	started := false
	defer func() {
		if !started {
			s.mu.Lock()
			s.live--
			s.mu.Unlock()
		}
	}()

	p := &process{s: s, id: id, argv: argv, tag: spec.Tag, pty: spec.PTY != nil}
	p.log = newEventLog(s.opts.RetainBytes, s.opts.ReaderGrace, s.shutdown)
	var lr *logReader
	if follow {
		lr, _ = p.log.attach(0) // a new log has dropped nothing
		defer func() {
			if err != nil {
				p.log.detach(lr)
			}
		}()
	}
	childFiles, err := p.openFiles(spec)
	if err != nil {
		return ProcessInfo{}, nil, nil, fmt.Errorf("agent: start: %w", err)
	}
	attr := &syscall.ProcAttr{
		Dir: cwd,
		Env: env,
		Sys: &syscall.SysProcAttr{
			Setpgid:    !p.pty,
			Setsid:     p.pty,
			Setctty:    p.pty,
			Ctty:       0, // the child's fd 0 is the tty
			Credential: cred,
		},
	}
	if s.opts.ProcAttr != nil {
		s.opts.ProcAttr(attr.Sys)
	}
	for _, f := range childFiles {
		attr.Files = append(attr.Files, f.Fd()) // Fd makes the child's ends blocking
	}
	pid, status, err := s.reaper.spawn(func() (int, error) {
		return syscall.ForkExec(prog, argv, attr)
	})
	runtime.KeepAlive(childFiles)
	for _, f := range childFiles {
		f.Close()
	}
	if err != nil {
		p.closeOurFiles()
		return ProcessInfo{}, nil, nil, execError(argv[0], err)
	}
	started = true
	p.pid = pid
	// The host makes the agent unkillable by the OOM killer where it can;
	// its commands must not inherit that. Where it cannot (no
	// CAP_SYS_RESOURCE on the host), commands get a higher score than the
	// agent, which needs no privilege, so a memory hog is killed before the
	// agent that runs the sandbox. Fails harmlessly where not permitted.
	_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte(childOOMScore()), 0)

	outputsDone := make(chan struct{})
	s.mu.Lock()
	s.procs[id] = p
	closing := s.closing // a shutdown that began meanwhile did not see p
	s.mu.Unlock()
	s.wg.Add(1 + len(p.outputs))
	if closing {
		defer func() {
			p.killForShutdown()
			p.closeOutputs()
		}()
	}
	var outWG sync.WaitGroup
	outWG.Add(len(p.outputs))
	for _, o := range p.outputs {
		go func() {
			defer s.wg.Done()
			defer outWG.Done()
			p.readOutput(o)
		}()
	}
	go func() {
		outWG.Wait()
		close(outputsDone)
	}()
	go func() {
		defer s.wg.Done()
		p.wait(status, outputsDone, time.Duration(spec.TimeoutMs)*time.Millisecond)
	}()
	return p.info(), p, lr, nil
}

// openFiles creates the command's stdio. It returns the child's ends; the
// server's ends are kept in p.
func (p *process) openFiles(spec ProcessSpec) (child []*os.File, err error) {
	if spec.PTY != nil {
		master, slave, err := openPTY(spec.PTY.Cols, spec.PTY.Rows)
		if err != nil {
			return nil, err
		}
		p.stdin = master
		p.outputs = []*output{{f: master, typ: EventStdout, capacity: ptyBufferBound, done: make(chan struct{})}}
		return []*os.File{slave, slave, slave}, nil
	}
	var closers []*os.File
	defer func() {
		if err != nil {
			for _, f := range closers {
				f.Close()
			}
		}
	}()
	var stdin *os.File
	if spec.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		closers = append(closers, r, w)
		stdin, p.stdin = r, w
	} else if f, err := os.Open(os.DevNull); err == nil {
		closers = append(closers, f)
		stdin = f
	} else {
		// A sandbox without /dev/null: an empty pipe reads as EOF.
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		w.Close()
		closers = append(closers, r)
		stdin = r
	}
	child = []*os.File{stdin}
	for _, typ := range []byte{EventStdout, EventStderr} {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		closers = append(closers, r, w)
		child = append(child, w)
		// A larger pipe lets a fast writer run on instead of blocking every
		// 64 KiB; best effort (the host's pipe-max-size may be lower).
		unix.FcntlInt(w.Fd(), unix.F_SETPIPE_SZ, outputPipeSize)
		capacity, err := unix.FcntlInt(w.Fd(), unix.F_GETPIPE_SZ, 0)
		if err != nil {
			capacity = 1 << 20
		}
		p.outputs = append(p.outputs, &output{f: r, typ: typ, capacity: int64(capacity), done: make(chan struct{})})
	}
	return child, nil
}

// closeOurFiles releases the server's ends after a failed start.
func (p *process) closeOurFiles() {
	if p.stdin != nil {
		p.stdin.Close()
	}
	for _, o := range p.outputs {
		o.f.Close()
	}
}

// execError classifies a failed fork/exec.
func execError(name string, err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.EAGAIN:
			return newAPIError(http.StatusTooManyRequests, CodeTooManyProcesses, "cannot fork: %v", err)
		case syscall.ENOMEM:
			return newAPIError(http.StatusServiceUnavailable, CodeUnavailable, "cannot fork: %v", err)
		}
	}
	return newAPIError(http.StatusBadRequest, CodeExecFailed, "cannot run %q: %v", truncate(name, 256), err)
}

// lookPath finds file in the command's PATH (not the agent's), relative
// entries taken from cwd. Names with a slash are left to exec.
func lookPath(file, pathEnv, cwd string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", newAPIError(http.StatusBadRequest, CodeExecFailed, "%q: executable file not found in $PATH", truncate(file, 256))
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// readOutput turns one stream into events until EOF (or EIO: a PTY whose
// every slave is closed) or until the file is closed (exit or shutdown).
func (p *process) readOutput(o *output) {
	defer close(o.done)
	if !p.pty {
		// A PTY master stays open until the command has exited: closing
		// it hangs the terminal up and SIGHUPs a command that merely
		// closed its stdio before exiting (cat does).
		defer o.f.Close()
	}
	// Start small (most commands print little) and grow to the chunk size
	// while reads keep filling the buffer.
	buf := make([]byte, 4<<10)
	for {
		o.idleSince.Store(time.Now().UnixNano())
		n, err := o.f.Read(buf)
		o.idleSince.Store(0)
		if n > 0 {
			o.total.Add(int64(n))
			if !p.detached.Load() {
				var data []byte
				if n >= len(buf)*3/4 {
					// Hand the (mostly full) buffer over instead of
					// copying: bulk output moves without a memcpy.
					data = buf[:n:n]
					size := len(buf)
					if n == size && size < MaxOutputChunk {
						size *= 2
					}
					buf = make([]byte, size)
				} else {
					data = make([]byte, n)
					copy(data, buf[:n])
				}
				p.log.append(o.typ, data)
			}
		}
		if err != nil {
			return
		}
		// Batch bulk output, like Nagle: a writer that emits page-sized
		// writes back to back (head, cat, most stdio) would otherwise
		// cost one event per page all the way to the client. A short
		// pause lets the pipe fill; line-sized interactive output is
		// never delayed.
		if n >= bulkWrite && n < len(buf) {
			time.Sleep(bulkPause)
		}
	}
}

const (
	outputPipeSize = 1 << 20
	bulkWrite      = 4 << 10
	bulkPause      = 250 * time.Microsecond
)

// wait collects the exit status, enforces the timeout, waits for the output
// to be read and then appends the exit event: always the last event.
func (p *process) wait(status <-chan unix.WaitStatus, outputsDone <-chan struct{}, timeout time.Duration) {
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	var ws unix.WaitStatus
	timedOut := false
	select {
	case ws = <-status:
	case <-deadline:
		select {
		case ws = <-status: // it exited just in time
		default:
			timedOut = true
			p.mu.Lock()
			p.timedOut = true
			p.mu.Unlock()
			p.kill()
			ws = <-status
		}
	}
	p.s.reaper.release()
	p.mu.Lock()
	p.reaped = true
	p.mu.Unlock()

	p.awaitOutput(outputsDone)
	p.detached.Store(true)

	exit := Exit{Code: ws.ExitStatus(), TimedOut: timedOut}
	if ws.Signaled() {
		exit.Code = -1
		exit.Signal = signalName(ws.Signal())
	}
	payload, err := json.Marshal(exit)
	if err != nil {
		payload = []byte(`{"exit_code":-1,"error":"encoding exit"}`)
	}
	p.log.appendFinal(payload)
	p.mu.Lock()
	p.exit = &exit
	p.mu.Unlock()
	if p.stdin != nil {
		p.stdin.Close() // on a PTY this also stops a reader left by the grace period
	}
	p.s.finished(p)
}

// awaitOutput returns when the command's output has been read. Background
// children may hold the pipes open long after the command exited; the output
// is then considered complete once every stream has either hit EOF, waited
// ExitGrace for data that did not come, or delivered more bytes since the
// exit than the kernel could have buffered before it (so the rest is newer
// than the exit). Time blocked on a slow reader does not count as idle, so
// backpressure never truncates output written before the exit.
func (p *process) awaitOutput(outputsDone <-chan struct{}) {
	select {
	case <-outputsDone:
		return
	case <-p.s.shutdown:
		return
	default:
	}
	base := make([]int64, len(p.outputs))
	for i, o := range p.outputs {
		base[i] = o.total.Load()
	}
	grace := p.s.opts.ExitGrace
	tick := time.NewTicker(min(max(grace/4, 5*time.Millisecond), 100*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-outputsDone:
			return
		case <-p.s.shutdown:
			return
		case <-tick.C:
		}
		now := time.Now().UnixNano()
		complete := true
		for i, o := range p.outputs {
			select {
			case <-o.done:
				continue
			default:
			}
			idle := o.idleSince.Load()
			if o.total.Load()-base[i] > o.capacity || (idle != 0 && now-idle >= int64(grace)) {
				continue
			}
			complete = false
		}
		if complete {
			return
		}
	}
}

// kill sends SIGKILL to the command's process group (and to the command
// itself, should it have left the group).
func (p *process) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pid <= 0 || p.reaped {
		return
	}
	syscall.Kill(-p.pid, syscall.SIGKILL)
	syscall.Kill(p.pid, syscall.SIGKILL)
}

// killForShutdown is kill, and also reaches background children left in
// the group of a command that has exited, if they still hold its output
// open (so the group still has members and its id cannot have been reused).
func (p *process) killForShutdown() {
	p.kill()
	p.mu.Lock()
	reaped := p.reaped
	p.mu.Unlock()
	if !reaped {
		return
	}
	for _, o := range p.outputs {
		select {
		case <-o.done:
		default:
			syscall.Kill(-p.pid, syscall.SIGKILL)
			return
		}
	}
}

// closeOutputs stops the output readers at shutdown.
func (p *process) closeOutputs() {
	for _, o := range p.outputs {
		o.f.Close()
	}
	if p.stdin != nil {
		p.stdin.Close()
	}
}

func (s *Server) finished(p *process) {
	retained := p.log.retained()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live--
	p.retained = retained
	s.exited = append(s.exited, p)
	s.exitedB += retained
	for len(s.exited) > s.opts.MaxExited || (len(s.exited) > 1 && s.exitedB > s.opts.RetainExitedBytes) {
		old := s.exited[0]
		delete(s.procs, old.id)
		s.exitedB -= old.retained
		s.exited[0] = nil
		s.exited = s.exited[1:]
	}
}

func (p *process) info() ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	info := ProcessInfo{ID: p.id, PID: p.pid, Argv: p.argv, Tag: p.tag, PTY: p.pty, Running: p.exit == nil}
	if p.exit != nil {
		e := *p.exit
		info.Exit = &e
	}
	return info
}

func (s *Server) handleGetProcess(w http.ResponseWriter, r *http.Request, p *process) {
	writeJSON(w, http.StatusOK, p.info())
}

func (s *Server) handleListProcesses(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	procs := make([]*process, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	list := ProcessList{Processes: make([]ProcessInfo, 0, len(procs))}
	for _, p := range procs {
		info := p.info()
		info.Argv = briefArgv(info.Argv)
		list.Processes = append(list.Processes, info)
	}
	sort.Slice(list.Processes, func(i, j int) bool {
		a, b := list.Processes[i].ID, list.Processes[j].ID
		return len(a) < len(b) || (len(a) == len(b) && a < b)
	})
	writeJSON(w, http.StatusOK, list)
}

// maxListedArgv bounds the argv bytes per process in a listing, so a list of
// every process stays small; GET /v1/processes/{id} has the whole argv.
const maxListedArgv = 2 << 10

// briefArgv shortens argv to about maxListedArgv bytes, marking the cut
// with "...".
func briefArgv(argv []string) []string {
	total := 0
	for i, a := range argv {
		total += len(a)
		if total > maxListedArgv {
			out := append([]string(nil), argv[:i]...)
			return append(out, truncate(a, max(0, maxListedArgv-(total-len(a)))))
		}
	}
	return argv
}

func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request, p *process) {
	var after uint64
	if q := r.URL.Query().Get("after"); q != "" {
		n, err := strconv.ParseUint(q, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, CodeBadRequest, "after must be an unsigned integer")
			return
		}
		after = n
	}
	lr, err := p.log.attach(after)
	if err != nil {
		writeError(w, http.StatusGone, CodeEventsGone, "events after the requested seq were dropped from retention")
		return
	}
	defer p.log.detach(lr)
	s.streamEvents(w, r, p, lr, http.StatusOK, nil)
}

// streamEvents answers with status and p's events after lr's position as
// frames, following live ones to the exit event. A started payload, if
// any, goes first as an EventStarted frame (seq 0).
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, p *process, lr *logReader, status int, started []byte) {
	w.Header().Set("Content-Type", EventsContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	rc := http.NewResponseController(w)
	bw, _ := s.writers.Get().(*bufio.Writer)
	if bw == nil {
		bw = bufio.NewWriterSize(w, 64<<10)
	} else {
		bw.Reset(w)
	}
	defer func() {
		bw.Reset(nil)
		s.writers.Put(bw)
	}()
	if started != nil {
		var hdr [FrameHeaderSize]byte
		hdr[8] = EventStarted
		binary.BigEndian.PutUint32(hdr[9:13], uint32(len(started)))
		bw.Write(hdr[:])
		bw.Write(started) // a failed write shows at the next flush
	}
	err := p.log.stream(r.Context(), lr, bw, func() error {
		if err := bw.Flush(); err != nil {
			return err
		}
		return rc.Flush()
	})
	if err != nil && r.Context().Err() == nil {
		p.s.opts.Logf("agent: events stream of process %s: %v", p.id, err)
	}
}

func (s *Server) handleStdin(w http.ResponseWriter, r *http.Request, p *process) {
	if r.ContentLength > MaxStdinChunk {
		writeError(w, http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("stdin chunk larger than %d bytes", MaxStdinChunk))
		return
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxStdinChunk))
	if err != nil {
		writeErr(w, err)
		return
	}
	if err := p.writeStdin(r.Context(), data); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// stdinState reports why stdin cannot be written, or nil.
func (p *process) stdinState() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.stdin == nil:
		return newAPIError(http.StatusConflict, CodeNoStdin, "process was started without stdin")
	case p.stdinClosed:
		return newAPIError(http.StatusConflict, CodeStdinClosed, "stdin is closed")
	case p.exit != nil || p.reaped:
		return newAPIError(http.StatusConflict, CodeNotRunning, "process is not running")
	}
	return nil
}

// writeStdin writes data, blocking while the command does not read (pipe
// backpressure) until ctx ends. Writes are serialized so chunks never mix.
func (p *process) writeStdin(ctx context.Context, data []byte) error {
	if err := p.stdinState(); err != nil {
		return err
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		p.stdin.SetWriteDeadline(time.Unix(1, 0))
	})
	_, err := p.stdin.Write(data)
	if !stop() {
		<-fired
	}
	p.stdin.SetWriteDeadline(time.Time{})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("agent: stdin write: %w", ctx.Err())
	case errors.Is(err, syscall.EPIPE):
		return newAPIError(http.StatusConflict, CodeStdinClosed, "the command closed its stdin")
	case errors.Is(err, os.ErrClosed), errors.Is(err, syscall.EIO):
		if serr := p.stdinState(); serr != nil {
			return serr
		}
		return newAPIError(http.StatusConflict, CodeNotRunning, "process is not running")
	}
	return fmt.Errorf("agent: stdin write: %w", err)
}

func (s *Server) handleStdinClose(w http.ResponseWriter, r *http.Request, p *process) {
	if err := p.closeStdin(r.Context()); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// closeStdin closes the pipe (the command reads EOF). On a PTY it types the
// EOF character instead: closing the master would hang up the terminal.
func (p *process) closeStdin(ctx context.Context) error {
	if err := p.stdinState(); err != nil {
		return err
	}
	p.mu.Lock()
	p.stdinClosed = true
	p.mu.Unlock()
	if !p.pty {
		p.stdin.Close() // also ends a write blocked on a full pipe
		return nil
	}
	return p.writePTYEOF(ctx)
}

func (p *process) writePTYEOF(ctx context.Context) error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	p.stdin.SetWriteDeadline(time.Now().Add(5 * time.Second))
	defer p.stdin.SetWriteDeadline(time.Time{})
	if _, err := p.stdin.Write([]byte{4}); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("agent: pty eof: %w", err)
	}
	return nil
}

func (s *Server) handleSignal(w http.ResponseWriter, r *http.Request, p *process) {
	var req SignalRequest
	if err := decodeJSON(http.MaxBytesReader(w, r.Body, 4096), &req); err != nil {
		writeErr(w, err)
		return
	}
	sig, err := parseSignal(req.Signal)
	if err != nil {
		writeErr(w, err)
		return
	}
	if err := p.signal(sig); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// signal sends sig to the command's process group. Once the command has been
// reaped its pid may be reused, so nothing is sent.
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped || p.exit != nil {
		return newAPIError(http.StatusConflict, CodeNotRunning, "process is not running")
	}
	err := syscall.Kill(-p.pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		err = syscall.Kill(p.pid, sig) // it left its group
	}
	if errors.Is(err, syscall.ESRCH) {
		return newAPIError(http.StatusConflict, CodeNotRunning, "process is not running")
	}
	if err != nil {
		return fmt.Errorf("agent: signal: %w", err)
	}
	return nil
}

func (s *Server) handleResize(w http.ResponseWriter, r *http.Request, p *process) {
	var req ResizeRequest
	if err := decodeJSON(http.MaxBytesReader(w, r.Body, 4096), &req); err != nil {
		writeErr(w, err)
		return
	}
	if req.Cols == 0 || req.Rows == 0 {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "cols and rows must be non-zero")
		return
	}
	if !p.pty {
		writeError(w, http.StatusConflict, CodeNotPTY, "process has no terminal")
		return
	}
	if err := setPTYSize(p.stdin, req.Cols, req.Rows); err != nil {
		if errors.Is(err, os.ErrClosed) {
			writeError(w, http.StatusConflict, CodeNotRunning, "process is not running")
			return
		}
		writeErr(w, fmt.Errorf("agent: resize: %w", err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// childOOMScore is the oom_score_adj for commands: 0 when the agent itself
// is protected (the host set it to -1000), else well above the agent's.
func childOOMScore() string {
	raw, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return "0"
	}
	own, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || own <= -500 {
		return "0"
	}
	return strconv.Itoa(min(own+500, 1000))
}
