package guest

import (
	"os"
	"path/filepath"
	"testing"
)

func TestFindPort(t *testing.T) {
	sys := t.TempDir()
	for port, name := range map[string]string{"vport0p1": "other", "vport1p1": "space.agent"} {
		d := filepath.Join(sys, "class", "virtio-ports", port)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "name"), []byte(name+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := FindPort(sys, "space.agent"); err != nil || p != "/dev/vport1p1" {
		t.Fatalf("FindPort = %q, %v", p, err)
	}
	if _, err := FindPort(sys, "nope"); err == nil {
		t.Fatal("found a port that is not there")
	}
}

func TestCmdlineParam(t *testing.T) {
	cl := "console=ttyS0 quiet space.hostname=box-a panic=-1\n"
	if v, ok := CmdlineParam(cl, CmdlineHostname); !ok || v != "box-a" {
		t.Fatalf("got %q %v", v, ok)
	}
	if _, ok := CmdlineParam(cl, "space.host"); ok {
		t.Fatal("prefix matched")
	}
}
