package attrs

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/space-sandbox/space/internal/criu"
	"github.com/space-sandbox/space/internal/netns/netnstest"
	"github.com/space-sandbox/space/test/testenv"
)

func TestMain(m *testing.M) { netnstest.Main(m) }

// want is what one sandbox must show for every attribute of the table.
type want struct {
	public      bool
	mode        string
	allow       []string
	credentials []string
	memory      int64
	pids        int64
	user        string
	timeout     int64
	onTimeout   string
	autoResume  bool
	autoPause   int64
}

type world struct {
	srv  *testenv.Server
	key  string
	cred string
}

func (w *world) call(t *testing.T, method, path string, body any, code int) map[string]any {
	t.Helper()
	st, m, err := testenv.DoJSON(method, w.srv.Ctrl+path, map[string]string{"X-API-Key": w.key}, body)
	if err != nil || st != code {
		t.Fatalf("%s %s: %d %v %v, want %d", method, path, st, m, err, code)
	}
	return m
}

func (w *world) op(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	op, err := w.srv.WaitOp(w.key, m["operation"].(map[string]any)["id"].(string), 2*time.Minute)
	if err != nil || op["state"] != "succeeded" {
		t.Fatalf("operation: %v %v", op, err)
	}
	return op
}

// check compares a sandbox's record and behaviour with w for one
// attribute row of the table.
func (w *world) check(t *testing.T, sb testenv.Sandbox, row string, x want) {
	t.Helper()
	rec := w.call(t, "GET", "/v1/sandboxes/"+sb.ID, nil, 200)
	num := func(m map[string]any, k string) int64 { f, _ := m[k].(float64); return int64(f) }
	switch row {
	case "public ports (and E2B's traffic token)":
		if got, _ := rec["public_ports"].(bool); got != x.public {
			t.Errorf("public_ports = %v, want %v", got, x.public)
		}
		// Behaviour: a request without a credential is refused (401) on a
		// private sandbox and reaches the (closed) port on a public one.
		resp, err := testenv.HTTP.Get(sb.Data + "/v1/sandboxes/" + sb.ID + "/ports/8999/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		wantCode := http.StatusUnauthorized
		if x.public {
			wantCode = http.StatusBadGateway
		}
		if resp.StatusCode != wantCode {
			t.Errorf("forwarded port without a token: %d, want %d", resp.StatusCode, wantCode)
		}
	case "network policy", "credentials":
		n, _ := rec["network"].(map[string]any)
		mode, _ := n["mode"].(string)
		if mode == "" {
			mode = "blocked"
		}
		strs := func(k string) []string {
			var out []string
			l, _ := n[k].([]any)
			for _, v := range l {
				out = append(out, fmt.Sprint(v))
			}
			return out
		}
		if row == "network policy" && (mode != x.mode || strings.Join(strs("allow"), ",") != strings.Join(x.allow, ",")) {
			t.Errorf("network = %v, want mode %s allow %v", n, x.mode, x.allow)
		}
		if row == "credentials" && strings.Join(strs("credentials"), ",") != strings.Join(x.credentials, ",") {
			t.Errorf("credentials = %v, want %v", strs("credentials"), x.credentials)
		}
	case "limits (cpu, memory, pids, disk)":
		l, _ := rec["limits"].(map[string]any)
		if num(l, "memory_bytes") != x.memory || num(l, "pids") != x.pids {
			t.Errorf("limits = %v, want memory %d pids %d", l, x.memory, x.pids)
		}
	case "default user":
		out, code, err := sb.Run("id -un", "")
		if err != nil || code != 0 || strings.TrimSpace(out) != x.user {
			t.Errorf("default user = %q (%d %v), want %s", out, code, err, x.user)
		}
	case "timeout, on-timeout, auto-pause, auto-resume":
		ar, _ := rec["auto_resume"].(bool)
		ot, _ := rec["on_timeout"].(string)
		if num(rec, "timeout_seconds") != x.timeout || ot != x.onTimeout || ar != x.autoResume || num(rec, "auto_pause_seconds") != x.autoPause {
			t.Errorf("timeout %v on_timeout %v auto_resume %v auto_pause %v; want %+v", rec["timeout_seconds"], rec["on_timeout"], rec["auto_resume"], rec["auto_pause_seconds"], x)
		}
	default:
		t.Fatalf("no check for attribute %q", row)
	}
}

// TestAttributesByPath tests every cell of Table() that the native API
// can observe (the E2B column is test/e2b's attrs.test.mjs).
func TestAttributesByPath(t *testing.T) {
	netnstest.RequireRoot(t)
	if !netnstest.Inside() {
		t.Skip("runs only inside its private network namespace")
	}
	srv, err := testenv.New("space-attrs-")
	if err != nil {
		t.Fatal(err)
	}
	// Its own template dir: it builds a template per run.
	srv.TemplateDir = filepath.Join(srv.Work, "templates")
	srv.Args = []string{"--builtins", "minimal", "--egress", "--egress-dns", "127.0.0.1:53", "--egress-pool", "10.243.0.0/24",
		"--egress-if-prefix", "spat", "--egress-table", "space-attrs", "--warm-templates", "minimal", "--warm-pool", "1"}
	w := &world{srv: srv}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- server log (tail) ----\n%s", srv.LogTail(8000))
		}
		if w.key != "" {
			srv.DeleteSandboxes(w.key)
		}
		srv.Stop()
		srv.Remove()
	})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if w.key, err = srv.CreateKey("p1"); err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitTemplate(w.key, "minimal", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	w.cred = w.call(t, "POST", "/v1/credentials", map[string]any{"name": "c", "secret": "attrs-secret", "host": "api.test"}, 201)["id"].(string)

	// A template whose default user is root, with what its RUN steps saw.
	tpl := fmt.Sprintf("attrs-%d", time.Now().UnixNano()%1e9)
	st, m, err := srv.BuildFile(w.key, "name="+tpl, "FROM minimal\nUSER root\nRUN mkdir -m 777 /probe\nUSER user\nRUN id -un > /probe/user\nUSER root\n")
	if err != nil || st != 202 {
		t.Fatalf("build: %d %v %v", st, m, err)
	}
	w.op(t, m)

	full := map[string]any{"template": tpl, "public_ports": true, "timeout_seconds": 900, "on_timeout": "hibernate", "auto_resume": true,
		"auto_pause_seconds": 3600, "limits": map[string]any{"memory_bytes": 300 << 20, "pids": 300},
		"network": map[string]any{"mode": "allowlist", "allow": []string{"api.test"}, "credentials": []string{w.cred}}}
	fullWant := want{public: true, mode: "allowlist", allow: []string{"api.test:80,443"}, credentials: []string{w.cred}, memory: 300 << 20, pids: 300,
		user: "root", timeout: 900, onTimeout: "hibernate", autoResume: true, autoPause: 3600}
	src, err := srv.CreateSandbox(w.key, full)
	if err != nil {
		t.Fatal(err)
	}
	snap := w.call(t, "POST", "/v1/sandboxes/"+src.ID+"/snapshots", map[string]any{}, 202)
	w.op(t, snap)
	snapID := snap["snapshot"].(map[string]any)["id"].(string)
	// On namespace with scripts/criu.sh's CRIU, the sandbox's network
	// (--egress) no longer keeps its processes out of the snapshot: a
	// restore gives it a new one.
	info := w.call(t, "GET", "/v1/info", nil, 200)
	if _, _, err := criu.ProbeSandboxes(context.Background(), ""); err == nil && info["driver"] == "namespace" {
		sn := w.call(t, "GET", "/v1/snapshots/"+snapID, nil, 200)
		if sn["kind"] != "process" {
			t.Errorf("snapshot of a sandbox with a network: kind %v (%v), want process", sn["kind"], sn["processes"])
		}
		t.Logf("namespace snapshot of a sandbox with a network: %v", sn["processes"])
	}
	fork := func(t *testing.T, req map[string]any) testenv.Sandbox {
		t.Helper()
		m := w.call(t, "POST", "/v1/snapshots/"+snapID+"/fork", req, 202)
		e := m["sandboxes"].([]any)[0].(map[string]any)
		sess := e["session"].(map[string]any)
		op, err := srv.WaitOp(w.key, e["operation"].(map[string]any)["id"].(string), 2*time.Minute)
		if err != nil || op["state"] != "succeeded" {
			t.Fatalf("fork: %v %v", op, err)
		}
		return testenv.Sandbox{ID: e["sandbox"].(map[string]any)["id"].(string), Token: sess["token"].(string), Data: sess["data_url"].(string)}
	}

	// Each native column: how to get its sandbox and what it must show.
	cols := map[string]func(t *testing.T) (testenv.Sandbox, want){
		"create (native and E2B)": func(t *testing.T) (testenv.Sandbox, want) { return src, fullWant },
		"warm-pool hand-out": func(t *testing.T) (testenv.Sandbox, want) {
			req := map[string]any{"template": "minimal", "public_ports": true, "timeout_seconds": 600, "limits": map[string]any{"pids": 200},
				"network": map[string]any{"mode": "allowlist", "allow": []string{"api.test"}, "credentials": []string{w.cred}}}
			st, m, err := testenv.DoJSON("POST", srv.Ctrl+"/v1/sandboxes", map[string]string{"X-API-Key": w.key}, req)
			if err != nil || st != 202 {
				t.Fatalf("create: %d %v %v", st, m, err)
			}
			op := w.op(t, m)
			// A warm instance keeps the id it was made with.
			if res, _ := op["result"].(map[string]any); res["instance"] == res["id"] {
				b, _ := json.Marshal(op)
				t.Fatalf("not handed out from the warm pool: %s", b)
			}
			sess := m["session"].(map[string]any)
			sb := testenv.Sandbox{ID: m["sandbox"].(map[string]any)["id"].(string), Token: sess["token"].(string), Data: sess["data_url"].(string)}
			rec := w.call(t, "GET", "/v1/sandboxes/"+sb.ID, nil, 200)
			mem, _ := rec["limits"].(map[string]any)["memory_bytes"].(float64)
			return sb, want{public: true, mode: "allowlist", allow: []string{"api.test:80,443"}, credentials: []string{w.cred}, memory: int64(mem), pids: 200,
				user: "user", timeout: 600}
		},
		"fork of a snapshot (native)": func(t *testing.T) (testenv.Sandbox, want) {
			// Nothing said: everything is the source's.
			inherit := fork(t, map[string]any{})
			for _, row := range Table() {
				t.Run("inherits "+row.Attribute, func(t *testing.T) { w.check(t, inherit, row.Attribute, fullWant) })
			}
			// Everything said: the request wins.
			f := false
			return fork(t, map[string]any{"public_ports": &f, "network": map[string]any{"mode": "blocked"}, "timeout_seconds": 120,
					"on_timeout": "delete", "auto_resume": false, "auto_pause_seconds": 60, "limits": map[string]any{"pids": 150}}),
				want{public: false, mode: "blocked", memory: 300 << 20, pids: 150, user: "root", timeout: 120, onTimeout: "delete", autoPause: 60}
		},
		"hibernate → resume": func(t *testing.T) (testenv.Sandbox, want) {
			w.op(t, w.call(t, "POST", "/v1/sandboxes/"+src.ID+"/hibernate", nil, 202))
			w.op(t, w.call(t, "POST", "/v1/sandboxes/"+src.ID+"/resume", nil, 202))
			return src, fullWant
		},
		"auto-resume": func(t *testing.T) (testenv.Sandbox, want) {
			w.op(t, w.call(t, "POST", "/v1/sandboxes/"+src.ID+"/pause", nil, 202))
			if _, code, err := src.Run("true", "root"); err != nil || code != 0 {
				t.Fatalf("data-plane call to the paused sandbox: %d %v", code, err)
			}
			return src, fullWant
		},
	}
	for _, path := range Paths() {
		if strings.HasPrefix(path, "create from a snapshot (E2B") {
			continue // test/e2b's TestSDKAttributes, with the real SDK
		}
		t.Run(path, func(t *testing.T) {
			switch {
			case strings.HasPrefix(path, "template-build"):
				// The build's RUN steps ran as its USER, with nothing else
				// of the table to observe from outside but that they ran.
				sb, err := srv.CreateSandbox(w.key, map[string]any{"template": tpl})
				if err != nil {
					t.Fatal(err)
				}
				if out, _, err := sb.Run("cat /probe/user", "root"); err != nil || strings.TrimSpace(out) != "user" {
					t.Errorf("RUN after USER user ran as %q %v", out, err)
				}
				return
			}
			col, ok := cols[path]
			if !ok {
				t.Fatalf("no scenario for path %q", path)
			}
			sb, x := col(t)
			for _, row := range Table() {
				t.Run(row.Attribute, func(t *testing.T) { w.check(t, sb, row.Attribute, x) })
			}
		})
	}
}
