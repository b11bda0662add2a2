package multinode

import (
	"os"
	"testing"
	"time"
)

// TestDataPlaneWakesAnyNode: idle sandboxes on node 2 of three pause (or
// hibernate at their timeout) and wake on a data-plane call sent to node
// 3's listener. A paused one thaws on its own node; a hibernated one is
// woken through the scheduler from whichever listener took the call: on
// its own node, or, when that node is drained, on another node sharing
// the snapshot store, the call being sent on to where it woke.
func TestDataPlaneWakesAnyNode(t *testing.T) {
	snapDir, err := os.MkdirTemp("", "space-wake-snaps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(snapDir) })
	c := newFleet(t, fleetOpts{nodes: 3, replicas: 1, snapStore: "dir:" + snapDir})
	s := c.servers[0]
	admin := c.adminKey()
	n2, n3 := c.nodes[1], c.nodes[2]
	// Sandboxes land on node 2: the others are drained while they are
	// created.
	onNode2 := func(extra map[string]any) (id, tok string) {
		t.Helper()
		for _, p := range []*proc{c.nodes[0], n3} {
			if st, m := c.as(admin, s, "POST", "/v1/nodes/"+p.name+"/drain", nil); st != 202 {
				t.Fatalf("drain %s: %d %v", p.name, st, m)
			} else {
				parseDrain(t, c.waitOp(s, opID(m), time.Minute))
			}
		}
		req := map[string]any{"template": "minimal", "limits": map[string]any{"memory_bytes": 32 << 20}, "auto_resume": true}
		for k, v := range extra {
			req[k] = v
		}
		m := c.mustCall(s, "POST", "/v1/sandboxes", req)
		if done := c.waitOp(s, opID(m), 60*time.Second); done["state"] != "succeeded" {
			t.Fatalf("create: %v", done)
		}
		sb, sess := m["sandbox"].(map[string]any), m["session"].(map[string]any)
		if sb["node"] != n2.name {
			t.Fatalf("created on %v with the others drained", sb["node"])
		}
		id, tok = sb["id"].(string), sess["token"].(string)
		if out, code, err := exec1(n2.addr["data"], tok, id, "sh", "-c", "echo kept-"+id+" > /tmp/kept"); err != nil || code != 0 {
			t.Fatalf("write in %s: %q %d %v", id, out, code, err)
		}
		for _, p := range []*proc{c.nodes[0], n3} {
			if st, m := c.as(admin, s, "POST", "/v1/nodes/"+p.name+"/undrain", nil); st != 200 {
				t.Fatalf("undrain %s: %d %v", p.name, st, m)
			}
		}
		return id, tok
	}
	waitState := func(id, want string, limit time.Duration) {
		t.Helper()
		t0 := time.Now()
		for st := ""; st != want; {
			if time.Since(t0) > limit {
				t.Fatalf("sandbox %s is %s after %v, want %s", id, st, limit, want)
			}
			time.Sleep(200 * time.Millisecond)
			st, _ = c.mustCall(s, "GET", "/v1/sandboxes/"+id, nil)["state"].(string)
		}
		t.Logf("sandbox %s %s after %v", id, want, time.Since(t0).Round(time.Millisecond))
	}
	wakeVia3 := func(id, tok, wantNode string) {
		t.Helper()
		t0 := time.Now()
		if out, code, err := exec1(n3.addr["data"], tok, id, "cat", "/tmp/kept"); err != nil || code != 0 || out != "kept-"+id+"\n" {
			t.Fatalf("call to %s through %s's listener: %q %d %v", id, n3.name, out, code, err)
		}
		sb := c.mustCall(s, "GET", "/v1/sandboxes/"+id, nil)
		if sb["state"] != "running" || wantNode != "" && sb["node"] != wantNode || wantNode == "" && sb["node"] == n2.name {
			t.Fatalf("after the call through %s: %s is %v on %v", n3.name, id, sb["state"], sb["node"])
		}
		t.Logf("sandbox %s woke on %v by a call to %s's listener in %v", id, sb["node"], n3.name, time.Since(t0).Round(time.Millisecond))
	}

	// Auto-pause: idle for 2 s, paused by the replica, thawed on node 2.
	paused, ptok := onNode2(map[string]any{"auto_pause_seconds": 2})
	waitState(paused, "paused", 30*time.Second)
	wakeVia3(paused, ptok, n2.name)

	// Hibernated at its timeout: woken on node 2 again.
	hib, htok := onNode2(map[string]any{"timeout_seconds": 2, "on_timeout": "hibernate"})
	waitState(hib, "hibernated", 90*time.Second)
	wakeVia3(hib, htok, n2.name)

	// Hibernated on a node that is then drained: the call wakes it on
	// another node, and is answered from there. Node 3, whose listener
	// takes the call, is drained too: the call goes to node 2 (the
	// record's), which wakes it on node 1 and sends the call on there.
	if done := c.waitOp(s, opID(c.mustCall(s, "POST", "/v1/sandboxes/"+hib+"/hibernate", nil)), 60*time.Second); done["state"] != "succeeded" {
		t.Fatalf("hibernate: %v", done)
	}
	st, m := c.as(admin, s, "POST", "/v1/nodes/"+n2.name+"/drain", nil)
	if st != 202 {
		t.Fatalf("drain %s: %d %v", n2.name, st, m)
	}
	if res := parseDrain(t, c.waitOp(s, opID(m), 2*time.Minute)); res.hib != 1 {
		t.Fatalf("drain of %s with one hibernated sandbox: %+v", n2.name, res)
	}
	if st, m := c.as(admin, s, "POST", "/v1/nodes/"+n3.name+"/drain", nil); st != 202 {
		t.Fatalf("drain %s: %d %v", n3.name, st, m)
	} else {
		parseDrain(t, c.waitOp(s, opID(m), 2*time.Minute))
	}
	wakeVia3(hib, htok, c.nodes[0].name)

	for _, id := range []string{paused, hib} {
		if done := c.waitOp(s, opID(c.mustCall(s, "DELETE", "/v1/sandboxes/"+id, nil)), 60*time.Second); done["state"] != "succeeded" {
			t.Fatalf("delete %s: %v", id, done)
		}
	}
}
