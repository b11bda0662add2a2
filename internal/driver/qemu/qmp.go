package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// qmpConn is one QMP session on a VM's monitor socket: capabilities
// negotiated, commands run one at a time, asynchronous events skipped.
type qmpConn struct {
	c   *net.UnixConn
	dec *json.Decoder
}

// dialQMP connects to sock and negotiates capabilities. The socket may not
// exist yet right after QEMU starts, so it retries until ctx ends or
// exited closes.
func dialQMP(ctx context.Context, sock string, exited <-chan struct{}) (*qmpConn, error) {
	for {
		var nd net.Dialer
		c, err := nd.DialContext(ctx, "unix", sock)
		if err == nil {
			q := &qmpConn{c: c.(*net.UnixConn), dec: json.NewDecoder(bufio.NewReader(c))}
			if dl, ok := ctx.Deadline(); ok {
				_ = c.SetDeadline(dl)
			} else {
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			}
			if err := q.greet(); err != nil {
				c.Close()
				return nil, err
			}
			return q, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("qemu: qmp: %w (last: %v)", ctx.Err(), err)
		case <-exited:
			return nil, errors.New("qemu: qmp: the VM exited")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (q *qmpConn) Close() error { return q.c.Close() }

func (q *qmpConn) greet() error {
	var greeting map[string]json.RawMessage
	if err := q.dec.Decode(&greeting); err != nil {
		return fmt.Errorf("qemu: qmp greeting: %w", err)
	}
	if _, ok := greeting["QMP"]; !ok {
		return errors.New("qemu: qmp: no greeting")
	}
	return q.run("qmp_capabilities", nil, nil)
}

// run executes command with args (nil for none) and decodes its return
// value into out (nil to ignore it).
func (q *qmpConn) run(command string, args, out any) error {
	return q.runFD(command, args, out, nil)
}

// runFD is run with a file descriptor passed alongside the command
// (SCM_RIGHTS), as `getfd` needs.
func (q *qmpConn) runFD(command string, args, out any, f *os.File) error {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("qemu: qmp %s: %w", command, err)
	}
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	if _, _, err := q.c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("qemu: qmp %s: %w", command, err)
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
		if err := q.dec.Decode(&resp); err != nil {
			return fmt.Errorf("qemu: qmp %s: %w", command, err)
		}
		if resp.Event != "" {
			continue
		}
		if resp.Error != nil {
			return fmt.Errorf("qemu: qmp %s: %s: %s", command, resp.Error.Class, resp.Error.Desc)
		}
		if out != nil && len(resp.Return) > 0 {
			if err := json.Unmarshal(resp.Return, out); err != nil {
				return fmt.Errorf("qemu: qmp %s: %w", command, err)
			}
		}
		return nil
	}
}

// status is the VM's run state ("running", "paused", "inmigrate",
// "postmigrate", ...).
func (q *qmpConn) status() (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	err := q.run("query-status", nil, &st)
	return st.Status, err
}

// waitMigration polls query-migrate until the migration completes or
// fails.
func (q *qmpConn) waitMigration(ctx context.Context) error {
	wait := time.Millisecond
	for {
		var m struct {
			Status      string `json:"status"`
			ErrorDesc   string `json:"error-desc"`
			TotalTimeMS int64  `json:"total-time"`
		}
		if err := q.run("query-migrate", nil, &m); err != nil {
			return err
		}
		switch m.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("qemu: migration %s: %s", m.Status, m.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("qemu: migration (%s): %w", m.Status, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}
