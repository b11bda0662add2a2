package cohost

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/space-sandbox/space/internal/netns/netnstest"
	"github.com/space-sandbox/space/test/testenv"
)

// cgroupLeft lists the cgroup directories named base, base-gvisor or
// base-qemu in every hierarchy, managed or not.
func cgroupLeft(base string) []string {
	var out []string
	for _, name := range []string{base, base + "-gvisor", base + "-qemu"} {
		for depth := 1; depth <= 5; depth++ {
			m, _ := filepath.Glob("/sys/fs/cgroup/" + strings.Repeat("*/", depth) + name)
			out = append(out, m...)
		}
	}
	return out
}

func tableExists(t *testing.T, name string) bool {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == name {
			return true
		}
	}
	return false
}

// TestStopLeavesNothing: a server stopped with SIGTERM at any moment of its
// life (start-up included) with no sandboxes left leaves nothing of its
// own on the host: no nftables table, veth, cgroup directory (in any
// hierarchy) or run dir. The gvisor driver's runsc makes cgroups in
// hierarchies the server does not manage; those count too.
func TestStopLeavesNothing(t *testing.T) {
	netnstest.RequireRoot(t)
	if !netnstest.Inside() {
		t.Skip("runs only inside its private network namespace")
	}
	drivers := []string{"namespace"}
	if os.Getenv("SPACE_RUNSC") != "" {
		drivers = append(drivers, "gvisor")
	}
	for _, drv := range drivers {
		for _, when := range []string{"table made", "serving", "after a sandbox"} {
			t.Run(drv+"/"+when, func(t *testing.T) {
				srv, err := testenv.New("space-stop-")
				if err != nil {
					t.Fatal(err)
				}
				defer srv.Remove()
				args := []string{"server", "--driver", drv, "--data-dir", srv.DataDir, "--run-dir", srv.RunDir, "--template-dir", srv.TemplateDir,
					"--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0", "--addr-file", filepath.Join(srv.Work, "addr.json"),
					"--builtins", "minimal", "--egress", "--egress-dns", "127.0.0.1:53", "--egress-pool", "10.244.0.0/24",
					"--egress-if-prefix", "cot", "--egress-table", "space-cot"}
				if drv == "gvisor" {
					args = append(args, "--runsc", os.Getenv("SPACE_RUNSC"))
				}
				cmd := exec.Command(srv.Bin, args...)
				log, _ := os.Create(srv.LogPath)
				defer log.Close()
				cmd.Stdout, cmd.Stderr = log, log
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				exited := make(chan error, 1)
				go func() { exited <- cmd.Wait() }()
				deadline := time.Now().Add(60 * time.Second)
				waitFor := func(what string, ok func() bool) {
					for !ok() {
						if time.Now().After(deadline) {
							cmd.Process.Kill()
							t.Fatalf("%s: timed out; log:\n%s", what, srv.LogTail(4000))
						}
						time.Sleep(5 * time.Millisecond)
					}
				}
				waitFor("nftables table", func() bool { return tableExists(t, "space-cot") })
				if when != "table made" {
					waitFor("serving", func() bool { _, err := os.Stat(filepath.Join(srv.Work, "addr.json")); return err == nil })
				}
				if when == "after a sandbox" {
					srv.Ctrl = readCtrl(t, filepath.Join(srv.Work, "addr.json"))
					key, err := srv.CreateKey("p1")
					if err != nil {
						t.Fatal(err)
					}
					if err := srv.WaitTemplate(key, "minimal", time.Minute); err != nil {
						t.Fatal(err)
					}
					sb, err := srv.CreateSandbox(key, nil)
					if err != nil {
						t.Fatal(err)
					}
					st, m, err := testenv.DoJSON("DELETE", srv.Ctrl+"/v1/sandboxes/"+sb.ID, map[string]string{"X-API-Key": key}, nil)
					if err != nil || st != 202 {
						t.Fatalf("delete: %d %v %v", st, m, err)
					}
					if _, err := srv.WaitOp(key, m["operation"].(map[string]any)["id"].(string), time.Minute); err != nil {
						t.Fatal(err)
					}
				}
				cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(30 * time.Second):
					cmd.Process.Kill()
					t.Fatalf("no exit 30 s after SIGTERM; log:\n%s", srv.LogTail(4000))
				}
				var left []string
				for i := 0; i < 50; i++ {
					left = nil
					if tableExists(t, "space-cot") {
						left = append(left, "nftables table space-cot")
					}
					for _, l := range links(t, "cot") {
						left = append(left, "link "+l)
					}
					left = append(left, cgroupLeft(srv.CgroupBase())...)
					if _, err := os.Stat(srv.RunDir); err == nil {
						left = append(left, "run dir "+srv.RunDir)
					}
					if len(left) == 0 {
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
				t.Errorf("left on the host after SIGTERM (%s): %v\nlog:\n%s", when, left, srv.LogTail(3000))
			})
		}
	}
}

func readCtrl(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var a struct{ Control string }
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatal(err)
	}
	return a.Control
}
