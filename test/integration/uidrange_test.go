package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/space-sandbox/space/internal/uidpool"
)

// uidBase reads a sandbox's host range from inside ("0 BASE 65536").
func uidBase(t *testing.T, sb *sandbox) uint32 {
	t.Helper()
	out, ex := sb.sh(t, "cat /proc/self/uid_map")
	f := strings.Fields(out)
	if ex.Code != 0 || len(f) != 3 || f[0] != "0" || f[2] != "65536" {
		t.Fatalf("uid_map of %s: %+v %q", sb.ID, ex, out)
	}
	b, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(b)
}

// TestOwnUIDRangePerSandbox (issue 28): each sandbox of a server runs
// under its own host uid block of the pool, sees the shared template as
// root's, writes files owned by its own block, keeps the block across a
// restart and a kill -9 of the server, and a fork lands in a fresh one.
func TestOwnUIDRangePerSandbox(t *testing.T) {
	e := need(t)
	a, b := e.create(t, nil), e.create(t, nil)
	defer b.delete(t)
	ba, bb := uidBase(t, a), uidBase(t, b)
	if ba == bb || ba < uidpool.DefaultStart || bb < uidpool.DefaultStart || ba%uidpool.BlockSize != 0 || bb%uidpool.BlockSize != 0 {
		t.Fatalf("sandbox blocks %d and %d: not distinct blocks of the pool", ba, bb)
	}
	for _, s := range []struct {
		sb   *sandbox
		base uint32
	}{{a, ba}, {b, bb}} {
		pid := namespacePID(t, e, instanceOf(t, e, s.sb.ID))
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if want := fmt.Sprintf("Uid:\t%[1]d\t%[1]d\t%[1]d\t%[1]d", s.base); err != nil || !strings.Contains(string(st), want) {
			t.Errorf("%s: PID 1's host status lacks %q (%v)", s.sb.ID, want, err)
		}
		if out, _ := s.sb.sh(t, "stat -c %u:%g /bin/sh /etc /etc/passwd"); strings.TrimSpace(out) != "0:0\n0:0\n0:0" {
			t.Errorf("%s: template not root's inside: %q", s.sb.ID, out)
		}
		s.sb.sh(t, "echo mine > /root/own")
		fi, err := os.Lstat(filepath.Join(e.DataDir, "sandboxes", instanceOf(t, e, s.sb.ID), "upper", "root", "own"))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != s.base {
			t.Errorf("%s: its file is host uid %d, want %d", s.sb.ID, st.Uid, s.base)
		}
	}

	// A restart and a kill -9 keep every block.
	e.Stop()
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	e.Kill9()
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	if got := uidBase(t, a); got != ba {
		t.Errorf("after restarts a runs under %d, was %d", got, ba)
	}
	c := e.create(t, nil)
	defer c.delete(t)
	if bc := uidBase(t, c); bc == ba || bc == bb {
		t.Errorf("block %d handed out twice", bc)
	}

	// A fork lands in a fresh block with the source's files.
	st, m, err := e.call("POST", "/v1/sandboxes/"+a.ID+"/snapshots", e.key, nil)
	if err != nil || st != 202 {
		t.Fatalf("snapshot: %d %v %v", st, m, err)
	}
	done := e.waitOp(t, m["operation"].(map[string]any)["id"].(string))
	if done["state"] != "succeeded" {
		t.Fatalf("snapshot: %v", done)
	}
	st, m, err = e.call("POST", "/v1/snapshots/"+done["result"].(map[string]any)["id"].(string)+"/fork", e.key, map[string]any{"count": 1})
	if err != nil || st != 202 {
		t.Fatalf("fork: %d %v %v", st, m, err)
	}
	item := m["sandboxes"].([]any)[0].(map[string]any)
	if done := e.waitOp(t, item["operation"].(map[string]any)["id"].(string)); done["state"] != "succeeded" {
		t.Fatalf("fork: %v", done)
	}
	sess := item["session"].(map[string]any)
	fork := &sandbox{e: e, ID: item["sandbox"].(map[string]any)["id"].(string), Token: sess["token"].(string), Data: sess["data_url"].(string)}
	defer fork.delete(t)
	if bf := uidBase(t, fork); bf == ba || bf == bb {
		t.Errorf("fork runs under a live sandbox's block %d", bf)
	}
	if out, _ := fork.sh(t, "cat /root/own; stat -c %u /root/own"); strings.Fields(out)[0] != "mine" || strings.Fields(out)[1] != "0" {
		t.Errorf("fork's copy of the source's file: %q", out)
	}

	// Deleting frees the block in the host-wide registry.
	dirA := filepath.Join(e.DataDir, "sandboxes", instanceOf(t, e, a.ID))
	a.delete(t)
	if o, err := os.ReadFile(filepath.Join(uidpool.DefaultDir, strconv.FormatUint(uint64(ba), 10))); err == nil && string(o) == dirA {
		t.Errorf("block %d still registered to deleted sandbox %s", ba, a.ID)
	}
}
