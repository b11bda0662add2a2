package qemu

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeQMP serves one QMP session on sock: a greeting, then answers by
// command name from replies (each a list of JSON lines sent in order, so
// an event can precede the answer). It records whether getfd came with a
// descriptor.
func fakeQMP(t *testing.T, sock string, replies map[string][]string) (gotFD chan bool) {
	t.Helper()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	gotFD = make(chan bool, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		uc := c.(*net.UnixConn)
		_, _ = uc.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
		buf, oob := make([]byte, 64<<10), make([]byte, 128)
		for {
			n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			var req struct {
				Execute string `json:"execute"`
			}
			if err := json.Unmarshal(buf[:n], &req); err != nil {
				return
			}
			if req.Execute == "getfd" {
				msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
				fds := 0
				for _, m := range msgs {
					if rights, err := unix.ParseUnixRights(&m); err == nil {
						fds += len(rights)
						for _, fd := range rights {
							unix.Close(fd)
						}
					}
				}
				gotFD <- fds == 1
			}
			out, ok := replies[req.Execute]
			if !ok {
				out = []string{`{"return": {}}`}
			}
			for _, line := range out {
				_, _ = uc.Write([]byte(line + "\n"))
			}
		}
	}()
	return gotFD
}

// TestQMPClient checks the QMP client against a fake monitor: events are
// skipped, errors surface with QEMU's class and text, a failed migration
// is an error, and getfd carries the file descriptor.
func TestQMPClient(t *testing.T) {
	dir, err := os.MkdirTemp("", "qmp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "q.sock")
	gotFD := fakeQMP(t, sock, map[string][]string{
		"query-status":  {`{"event": "STOP", "data": {}}`, `{"return": {"status": "paused", "running": false}}`},
		"migrate":       {`{"error": {"class": "GenericError", "desc": "boom"}}`},
		"query-migrate": {`{"return": {"status": "failed", "error-desc": "disk full"}}`},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := dialQMP(ctx, sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if st, err := q.status(); err != nil || st != "paused" {
		t.Errorf("status %q %v", st, err)
	}
	if err := q.run("migrate", map[string]any{"uri": "fd:x"}, nil); err == nil || !strings.Contains(err.Error(), "GenericError: boom") {
		t.Errorf("migrate error: %v", err)
	}
	if err := q.waitMigration(ctx); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("failed migration: %v", err)
	}
	f, err := os.Create(filepath.Join(dir, "img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := q.runFD("getfd", map[string]any{"fdname": "x"}, nil, f); err != nil {
		t.Fatal(err)
	}
	select {
	case ok := <-gotFD:
		if !ok {
			t.Error("getfd arrived without exactly one descriptor")
		}
	case <-ctx.Done():
		t.Fatal("no getfd seen")
	}
}

// TestDialQMPGivesUp checks dialQMP stops waiting for a socket that never
// appears when the VM exits.
func TestDialQMPGivesUp(t *testing.T) {
	exited := make(chan struct{})
	close(exited)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := dialQMP(ctx, filepath.Join(t.TempDir(), "none.sock"), exited); err == nil || ctx.Err() != nil {
		t.Fatalf("dialQMP of a missing socket with the VM gone: %v (ctx %v)", err, ctx.Err())
	}
}
