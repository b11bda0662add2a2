package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/agent/client"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/qemu/vmux"
	"github.com/space-sandbox/space/internal/vmimage"
)

// Instance is one running VM.
type Instance struct {
	d      *Driver
	id     string
	st     state
	exited <-chan struct{} // closed when the VM exits; nil after Attach
	timing driver.Timing

	mu        sync.Mutex
	sess      *vmux.Session
	active    int         // open streams on sess
	idle      *time.Timer // closes sess after idleClose without streams
	destroyed bool

	limMu sync.Mutex // SetLimits and Checkpoint, one at a time; guards st
}

// idleClose is how long a session with no open stream is kept. QEMU's
// chardev socket serves one client at a time, so an idle session is let go
// for another node process (Attach after a restart) to connect.
const idleClose = time.Second

var (
	_ driver.Instance = (*Instance)(nil)
	_ driver.Pauser   = (*Instance)(nil)
)

func (d *Driver) newInstance(id string, st state, exited <-chan struct{}) *Instance {
	return &Instance{d: d, id: id, st: st, exited: exited}
}

// ID implements driver.Instance.
func (i *Instance) ID() string { return i.id }

// PID is the QEMU process.
func (i *Instance) PID() int { return i.st.PID }

// Timing implements driver.Instance.
func (i *Instance) Timing() driver.Timing { return i.timing }

// waitReady connects to the agent port and waits for the vmux handshake,
// then for GET /health. It keeps one connection while the guest boots:
// the handshake bytes wait in QEMU's socket until the agent opens the port.
//
// attempt, if non-zero, bounds each connection's handshake: Attach uses it,
// because a node that died mid-frame can leave a half frame in the port
// that swallows one handshake.
func (i *Instance) waitReady(ctx context.Context, attempt time.Duration) error {
	sock := i.d.agentSock(i.id)
	for {
		if i.exited != nil {
			select {
			case <-i.exited:
				return errors.New("the VM exited during boot")
			default:
			}
		}
		var nd net.Dialer
		c, err := nd.DialContext(ctx, "unix", sock)
		if err == nil {
			hctx, cancel := ctx, context.CancelFunc(func() {})
			if attempt > 0 {
				hctx, cancel = context.WithTimeout(ctx, attempt)
			}
			s, herr := i.handshake(hctx, c)
			cancel()
			if herr == nil {
				i.mu.Lock()
				i.sess, i.active = s, 0
				i.mu.Unlock()
				return health(ctx, i)
			}
			c.Close()
			err = herr
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-i.exited:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// handshake waits for the agent's answer on c until ctx is done or the VM
// exits.
func (i *Instance) handshake(ctx context.Context, c net.Conn) (*vmux.Session, error) {
	type res struct {
		s   *vmux.Session
		err error
	}
	ch := make(chan res, 1)
	timeout := time.Hour
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	go func() {
		s, err := vmux.Client(c, timeout)
		ch <- res{s, err}
	}()
	select {
	case r := <-ch:
		return r.s, r.err
	case <-i.exited:
		c.Close()
		<-ch
		return nil, errors.New("the VM exited during boot")
	case <-ctx.Done():
		c.Close()
		<-ch
		return nil, ctx.Err()
	}
}

// Dial implements driver.Instance: a new vmux stream on the VM's port,
// reconnecting the session if it broke.
func (i *Instance) Dial(ctx context.Context) (net.Conn, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.destroyed {
		return nil, fmt.Errorf("qemu: sandbox %s: %w", i.id, driver.ErrNotFound)
	}
	if i.sess != nil {
		select {
		case <-i.sess.Done():
			i.sess = nil
		default:
		}
	}
	if i.sess == nil {
		s, err := dialSession(ctx, i.d.agentSock(i.id))
		if err != nil {
			return nil, fmt.Errorf("qemu: sandbox %s: %w", i.id, err)
		}
		i.sess, i.active = s, 0
	}
	st, err := i.sess.Open()
	if err != nil {
		return nil, fmt.Errorf("qemu: sandbox %s: %w", i.id, err)
	}
	i.active++
	if i.idle != nil {
		i.idle.Stop()
		i.idle = nil
	}
	return &trackedConn{Conn: st, i: i, s: i.sess}, nil
}

// trackedConn counts a stream as open until its first Close.
type trackedConn struct {
	net.Conn
	i    *Instance
	s    *vmux.Session
	once sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.i.release(c.s) })
	return err
}

func (i *Instance) release(s *vmux.Session) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.sess != s {
		return
	}
	i.active--
	if i.active > 0 {
		return
	}
	if i.idle != nil {
		i.idle.Stop()
	}
	i.idle = time.AfterFunc(idleClose, func() {
		i.mu.Lock()
		defer i.mu.Unlock()
		if i.sess == s && i.active == 0 {
			_ = s.Close()
			i.sess, i.idle = nil, nil
		}
	})
}

// SetLimits implements driver.Instance. CPU bandwidth is the host
// cgroup's quota on QEMU, changed at once. Memory is the guest's size:
// shrinking (or growing back up to the boot size) moves the virtio
// balloon, and the host cgroup follows it; growing past the boot size
// needs memory hotplug, which is not done, and fails with
// driver.ErrUnsupported. The vCPU count is fixed at boot, and Pids is
// not applied: the guest kernel bounds the sandbox's tasks, the host
// cgroup only QEMU's own threads.
func (i *Instance) SetLimits(ctx context.Context, l driver.Limits) error {
	i.limMu.Lock()
	defer i.limMu.Unlock()
	if err := vmimage.CheckWritableSize(filepath.Join(i.d.sandboxDir(i.id), "upper.ext4"), l.DiskBytes); err != nil {
		return fmt.Errorf("%s: %w: %w", i.d.Name(), err, driver.ErrUnsupported)
	}
	target := i.st.MemoryMiB
	if l.MemoryBytes > 0 {
		target, _ = i.d.vmSize(l)
	}
	if target > i.st.MemoryMiB {
		return fmt.Errorf("qemu: growing a running VM past its boot size (%d MiB, asked %d MiB): %w", i.st.MemoryMiB, target, driver.ErrUnsupported)
	}
	g := i.d.cg.Open(i.st.Cgroups)
	cur := i.st.MemoryMiB
	if i.st.BalloonMiB > 0 {
		cur = i.st.BalloonMiB
	}
	// Growing: the host budget first, then the guest; shrinking: the
	// guest first, and the host budget once the guest gave it back.
	if target >= cur {
		if err := g.SetLimits(i.d.hostLimits(target, l)); err != nil {
			return fmt.Errorf("qemu: cgroup: %w", err)
		}
	}
	if target != cur {
		if err := i.balloon(ctx, target); err != nil {
			return err
		}
	}
	if target < cur {
		if err := g.SetLimits(i.d.hostLimits(target, l)); err != nil {
			return fmt.Errorf("qemu: cgroup: %w", err)
		}
	}
	i.st.Limits = l
	i.st.BalloonMiB = target
	if target == i.st.MemoryMiB {
		i.st.BalloonMiB = 0
	}
	return i.d.writeState(i.id, i.st)
}

// balloon sets the guest's size to mib and waits until the guest has
// given back (or taken) the difference.
func (i *Instance) balloon(ctx context.Context, mib int) error {
	q, err := dialQMP(ctx, i.d.qmpSock(i.id), i.exited)
	if err != nil {
		return err
	}
	defer q.Close()
	want := int64(mib) << 20
	if err := q.run("balloon", map[string]any{"value": want}, nil); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, balloonTimeout)
	defer cancel()
	for {
		var b struct {
			Actual int64 `json:"actual"`
		}
		if err := q.run("query-balloon", nil, &b); err != nil {
			return err
		}
		if d := b.Actual - want; d > -1<<20 && d < 1<<20 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("qemu: sandbox %s: the guest is at %d MiB, not the %d MiB asked: %w", i.id, b.Actual>>20, mib, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// balloonTimeout bounds how long the guest gets to move its balloon.
const balloonTimeout = 20 * time.Second

// OOMKills implements driver.Instance: the guest kernel's count
// (oom_kill in /proc/vmstat, read through the agent). It is the
// sandbox's own word, fit for labelling an exit, not for policy. An OOM
// kill of QEMU by the host cgroup ends the whole sandbox instead.
func (i *Instance) OOMKills() (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := client.New(i.Dial)
	defer c.Close()
	rc, _, err := c.Download(ctx, "/proc/vmstat")
	if err != nil {
		return 0, fmt.Errorf("qemu: sandbox %s: vmstat: %w", i.id, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 64<<10))
	if err != nil {
		return 0, fmt.Errorf("qemu: sandbox %s: vmstat: %w", i.id, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("qemu: sandbox %s: vmstat: %w", i.id, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("qemu: sandbox %s: no oom_kill in the guest's vmstat", i.id)
}

// Done is closed when the VM exits on its own (nil for an instance
// re-adopted with Attach: its QEMU is not this process's child).
func (i *Instance) Done() <-chan struct{} { return i.exited }

// Destroy implements driver.Instance: SIGKILL to QEMU (there is no guest
// state worth a clean shutdown), then sockets and disk files go.
func (i *Instance) Destroy(ctx context.Context) error {
	i.mu.Lock()
	i.destroyed = true
	if i.idle != nil {
		i.idle.Stop()
		i.idle = nil
	}
	if i.sess != nil {
		_ = i.sess.Close()
		i.sess = nil
	}
	i.mu.Unlock()
	return i.d.remove(ctx, i.id)
}

// Pause implements driver.Pauser (QMP stop: vCPUs halt, the guest clock
// stops with them).
func (i *Instance) Pause(ctx context.Context) error { return i.qmp(ctx, "stop") }

// Resume implements driver.Pauser (QMP cont).
func (i *Instance) Resume(ctx context.Context) error { return i.qmp(ctx, "cont") }

// qmp runs one argument-less QMP command on the VM's monitor socket.
func (i *Instance) qmp(ctx context.Context, command string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	q, err := dialQMP(ctx, i.d.qmpSock(i.id), i.exited)
	if err != nil {
		return err
	}
	defer q.Close()
	return q.run(command, nil, nil)
}
