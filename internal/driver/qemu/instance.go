package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/driver/qemu/vmux"
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

// SetLimits implements driver.Instance. A VM's memory and vCPUs are fixed
// at boot (no balloon or hotplug here), and the guest kernel, not the
// host, bounds its tasks; limits equal to the boot size are accepted.
func (i *Instance) SetLimits(ctx context.Context, l driver.Limits) error {
	mem, cpus := i.d.vmSize(l)
	if (l.MemoryBytes > 0 && mem != i.st.MemoryMiB) || (l.CPUMillis > 0 && cpus != i.st.CPUs) {
		return fmt.Errorf("qemu: resizing a running VM (%d MiB, %d vCPU): %w", i.st.MemoryMiB, i.st.CPUs, driver.ErrUnsupported)
	}
	return nil
}

// OOMKills implements driver.Instance. OOM kills happen in the guest
// kernel, which the host does not see.
func (i *Instance) OOMKills() (uint64, error) {
	return 0, fmt.Errorf("qemu: OOM kills happen inside the guest: %w", driver.ErrUnsupported)
}

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
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "unix", i.d.qmpSock(i.id))
	if err != nil {
		return fmt.Errorf("qemu: qmp: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	} else {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	return qmpExchange(c, command)
}

// qmpExchange reads the greeting, negotiates capabilities and runs
// command, skipping asynchronous events.
func qmpExchange(c net.Conn, command string) error {
	dec := json.NewDecoder(bufio.NewReader(c))
	var greeting map[string]json.RawMessage
	if err := dec.Decode(&greeting); err != nil {
		return fmt.Errorf("qemu: qmp greeting: %w", err)
	}
	if _, ok := greeting["QMP"]; !ok {
		return errors.New("qemu: qmp: no greeting")
	}
	for _, cmd := range []string{"qmp_capabilities", command} {
		if err := json.NewEncoder(c).Encode(map[string]string{"execute": cmd}); err != nil {
			return fmt.Errorf("qemu: qmp %s: %w", cmd, err)
		}
		for {
			var resp struct {
				Return json.RawMessage `json:"return"`
				Error  *struct {
					Class string `json:"class"`
					Desc  string `json:"desc"`
				} `json:"error"`
				Event string `json:"event"`
			}
			if err := dec.Decode(&resp); err != nil {
				return fmt.Errorf("qemu: qmp %s: %w", cmd, err)
			}
			if resp.Event != "" {
				continue
			}
			if resp.Error != nil {
				return fmt.Errorf("qemu: qmp %s: %s: %s", cmd, resp.Error.Class, resp.Error.Desc)
			}
			break
		}
	}
	return nil
}
