package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/space-sandbox/space/internal/uidpool"
)

// TestOwnUIDRangePerSandbox (issue 28): each sandbox of a server runs
// under its own host uid block of the pool, sees the shared template as
// root's, writes files owned by its own block, keeps the block across a
// restart and a kill -9 of the server, a fork lands in a fresh block and
// a hibernated sandbox wakes in one with its files intact; deleting frees
// the block. On both container drivers.
func TestOwnUIDRangePerSandbox(t *testing.T) {
	t.Run("namespace", func(t *testing.T) { ownUIDRanges(t, need(t), "sandboxes") })
	t.Run("gvisor", func(t *testing.T) { ownUIDRanges(t, gvisorEnv(t), "gvisor") })
}

// block reads a sandbox's host uid block and host pid (PID 1, or runsc's
// sandbox process) from its driver state below <data-dir>/<stateSub>.
func block(t *testing.T, e *env, stateSub string, sb *sandbox) (base uint32, pid int, dir string) {
	t.Helper()
	dir = filepath.Join(e.DataDir, stateSub, instanceOf(t, e, sb.ID))
	raw, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		PID     int    `json:"pid"`
		UIDBase uint32 `json:"uid_base"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if st.UIDBase < uidpool.DefaultStart || st.UIDBase%uidpool.BlockSize != 0 {
		t.Fatalf("%s runs under host %d, not a block of the pool", sb.ID, st.UIDBase)
	}
	return st.UIDBase, st.PID, dir
}

func ownUIDRanges(t *testing.T, e *env, stateSub string) {
	a, b := e.create(t, nil), e.create(t, nil)
	defer b.delete(t)
	ba, _, _ := block(t, e, stateSub, a)
	bb, _, _ := block(t, e, stateSub, b)
	if ba == bb {
		t.Fatalf("two sandboxes share host block %d", ba)
	}
	for _, s := range []*sandbox{a, b} {
		base, pid, dir := block(t, e, stateSub, s)
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if want := fmt.Sprintf("Uid:\t%[1]d\t%[1]d\t%[1]d\t%[1]d", base); err != nil || !strings.Contains(string(st), want) {
			t.Errorf("%s: host process %d's status lacks %q (%v)", s.ID, pid, want, err)
		}
		if out, _ := s.sh(t, "stat -c %u:%g /bin/sh /etc /etc/passwd"); strings.TrimSpace(out) != "0:0\n0:0\n0:0" {
			t.Errorf("%s: template not root's inside: %q", s.ID, out)
		}
		s.sh(t, "echo mine > /root/own")
		fi, err := os.Lstat(filepath.Join(dir, "upper", "root", "own"))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != base {
			t.Errorf("%s: its file is host uid %d, want %d", s.ID, st.Uid, base)
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
	if got, _, _ := block(t, e, stateSub, a); got != ba {
		t.Errorf("after restarts a runs under %d, was %d", got, ba)
	}
	if out, ex := a.sh(t, "cat /root/own"); ex.Code != 0 || strings.TrimSpace(out) != "mine" {
		t.Errorf("a after restarts: %+v %q", ex, out)
	}
	c := e.create(t, nil)
	defer c.delete(t)
	if bc, _, _ := block(t, e, stateSub, c); bc == ba || bc == bb {
		t.Errorf("block %d handed out twice", bc)
	}

	// A fork lands in a fresh block with the source's files, owned by
	// root inside.
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
	if bf, _, _ := block(t, e, stateSub, fork); bf == ba || bf == bb {
		t.Errorf("fork runs under a live sandbox's block %d", bf)
	}
	if out, _ := fork.sh(t, "cat /root/own; stat -c %u /root/own"); strings.Join(strings.Fields(out), " ") != "mine 0" {
		t.Errorf("fork's copy of the source's file: %q", out)
	}

	// Hibernate and wake: a new instance, in a block of its own again,
	// with its files root's inside.
	for _, verb := range []string{"hibernate", "resume"} {
		st, m, err := e.call("POST", "/v1/sandboxes/"+b.ID+"/"+verb, e.key, nil)
		if err != nil || st != 202 {
			t.Fatalf("%s: %d %v %v", verb, st, m, err)
		}
		if done := e.waitOp(t, m["operation"].(map[string]any)["id"].(string)); done["state"] != "succeeded" {
			t.Fatalf("%s: %v", verb, done)
		}
	}
	if bw, _, _ := block(t, e, stateSub, b); bw == ba {
		t.Errorf("woken sandbox runs under a's block %d", bw)
	}
	if out, _ := b.sh(t, "cat /root/own; stat -c %u /root/own"); strings.Join(strings.Fields(out), " ") != "mine 0" {
		t.Errorf("woken sandbox's file: %q", out)
	}

	// Deleting frees the block in the host-wide registry.
	_, _, dirA := block(t, e, stateSub, a)
	a.delete(t)
	if o, err := os.ReadFile(filepath.Join(uidpool.DefaultDir, strconv.FormatUint(uint64(ba), 10))); err == nil && string(o) == dirA {
		t.Errorf("block %d still registered to deleted sandbox %s", ba, a.ID)
	}
}
