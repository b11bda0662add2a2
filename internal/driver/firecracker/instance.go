package firecracker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	sdk "github.com/firecracker-microvm/firecracker-go-sdk"
	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"
	"github.com/sirupsen/logrus"

	"github.com/space-sandbox/space/internal/agent/client"
	"github.com/space-sandbox/space/internal/driver"
	"github.com/space-sandbox/space/internal/vmimage"
)

// Instance is one running Firecracker VM.
type Instance struct {
	d      *Driver
	id     string
	st     state
	timing driver.Timing

	mu        sync.Mutex
	destroyed bool
}

var (
	_ driver.Instance = (*Instance)(nil)
	_ driver.Pauser   = (*Instance)(nil)
)

// ID implements driver.Instance.
func (i *Instance) ID() string { return i.id }

// PID is the Firecracker (or jailer-exec'd) process.
func (i *Instance) PID() int { return i.st.PID }

// Timing implements driver.Instance.
func (i *Instance) Timing() driver.Timing { return i.timing }

// Dial implements driver.Instance: a new connection to the agent through
// Firecracker's vsock unix socket.
func (i *Instance) Dial(ctx context.Context) (net.Conn, error) {
	i.mu.Lock()
	destroyed := i.destroyed
	i.mu.Unlock()
	if destroyed {
		return nil, fmt.Errorf("firecracker: sandbox %s: %w", i.id, driver.ErrNotFound)
	}
	return DialVsock(ctx, i.d.vsockPath(i.id), AgentPort)
}

// DialVsock opens a host-initiated vsock connection through Firecracker's
// unix socket at uds: it sends "CONNECT <port>\n" and expects
// "OK <host port>\n" before the stream belongs to the guest's listener.
func DialVsock(ctx context.Context, uds string, port uint32) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "unix", uds)
	if err != nil {
		return nil, fmt.Errorf("firecracker: vsock: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	} else {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	}
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", port); err != nil {
		c.Close()
		return nil, fmt.Errorf("firecracker: vsock connect: %w", err)
	}
	// Read the answer a byte at a time: what follows the newline is the
	// agent's and must stay unread.
	var line []byte
	b := make([]byte, 1)
	for len(line) < 64 {
		if _, err := io.ReadFull(c, b); err != nil {
			c.Close()
			return nil, fmt.Errorf("firecracker: vsock connect to port %d: %w", port, err)
		}
		if b[0] == '\n' {
			break
		}
		line = append(line, b[0])
	}
	if !strings.HasPrefix(string(line), "OK ") {
		c.Close()
		return nil, fmt.Errorf("firecracker: vsock connect to port %d: answer %q", port, line)
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// waitReady polls the agent's health until it answers.
func (i *Instance) waitReady(ctx context.Context) error {
	var last error
	for {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		c := client.New(i.Dial)
		last = c.Health(hctx)
		c.Close()
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(10 * time.Millisecond):
		}
		if !i.d.alive(i.st) {
			return errors.New("the VM exited during boot")
		}
	}
}

// SetLimits implements driver.Instance. Memory and vCPUs are fixed at
// boot (a balloon device could shrink memory; not wired yet).
func (i *Instance) SetLimits(ctx context.Context, l driver.Limits) error {
	if err := vmimage.CheckWritableSize(filepath.Join(i.d.sandboxDir(i.id), "upper.ext4"), l.DiskBytes); err != nil {
		return fmt.Errorf("%s: %w: %w", i.d.Name(), err, driver.ErrUnsupported)
	}
	mem, cpus := i.d.vmSize(l)
	if (l.MemoryBytes > 0 && mem != i.st.MemoryMiB) || (l.CPUMillis > 0 && cpus != i.st.CPUs) {
		return fmt.Errorf("firecracker: resizing a running VM (%d MiB, %d vCPU): %w", i.st.MemoryMiB, i.st.CPUs, driver.ErrUnsupported)
	}
	return nil
}

// OOMKills implements driver.Instance: OOM kills happen in the guest.
func (i *Instance) OOMKills() (uint64, error) {
	return 0, fmt.Errorf("firecracker: OOM kills happen inside the guest: %w", driver.ErrUnsupported)
}

// Destroy implements driver.Instance.
func (i *Instance) Destroy(ctx context.Context) error {
	i.mu.Lock()
	i.destroyed = true
	i.mu.Unlock()
	return i.d.remove(ctx, i.id)
}

func (i *Instance) api() *sdk.Client {
	logger := logrus.New()
	logger.SetOutput(io.Discard)
	return sdk.NewClient(i.d.apiSock(i.id), logrus.NewEntry(logger), false)
}

// Pause implements driver.Pauser (PATCH /vm {"state":"Paused"}).
func (i *Instance) Pause(ctx context.Context) error {
	if _, err := i.api().PatchVM(ctx, &models.VM{State: sdk.String(models.VMStatePaused)}); err != nil {
		return fmt.Errorf("firecracker: pause: %w", err)
	}
	return nil
}

// Resume implements driver.Pauser (PATCH /vm {"state":"Resumed"}).
func (i *Instance) Resume(ctx context.Context) error {
	if _, err := i.api().PatchVM(ctx, &models.VM{State: sdk.String(models.VMStateResumed)}); err != nil {
		return fmt.Errorf("firecracker: resume: %w", err)
	}
	return nil
}

// Snapshot writes the paused VM's memory to memPath and its device state
// to statePath (PUT /snapshot/create). A diff snapshot holds only the
// pages dirtied since the last snapshot (dirty page tracking is on).
func (i *Instance) Snapshot(ctx context.Context, memPath, statePath string, diff bool) error {
	typ := models.SnapshotCreateParamsSnapshotTypeFull
	if diff {
		typ = models.SnapshotCreateParamsSnapshotTypeDiff
	}
	p := &models.SnapshotCreateParams{MemFilePath: sdk.String(memPath), SnapshotPath: sdk.String(statePath), SnapshotType: typ}
	if _, err := i.api().CreateSnapshot(ctx, p); err != nil {
		return fmt.Errorf("firecracker: snapshot: %w", err)
	}
	return nil
}
