package sandboxinit

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestArgsRoundTrip(t *testing.T) {
	c := Config{Rootfs: "/t/rootfs", Upper: "/s/x/upper", Work: "/s/x/work", Merged: "/s/x/merged", Hostname: "box-1.local"}
	got, err := ParseArgs(c.Args())
	if err != nil {
		t.Fatal(err)
	}
	if got != c {
		t.Fatalf("got %+v, want %+v", got, c)
	}
	if _, err := ParseArgs(append(c.Args(), "extra")); err == nil {
		t.Error("accepted a stray argument")
	}
	if _, err := ParseArgs([]string{"--nosuch=1"}); err == nil {
		t.Error("accepted an unknown flag")
	}
}

func TestValidate(t *testing.T) {
	good := Config{Rootfs: "/r", Upper: "/u", Work: "/w", Merged: "/m", Hostname: "h"}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	// What the namespace driver passes: names in init's working directory.
	local := Config{Rootfs: "lower", Upper: "upper", Work: "work", Merged: "merged", Hostname: "h"}
	if err := local.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"dotdot":        func(c *Config) { c.Rootfs = "../r" },
		"relative up":   func(c *Config) { c.Upper = "a/../../u" },
		"unclean":       func(c *Config) { c.Upper = "/u/../x" },
		"comma":         func(c *Config) { c.Work = "/w,upperdir=/etc" },
		"colon":         func(c *Config) { c.Rootfs = "/a:/b" },
		"empty":         func(c *Config) { c.Merged = "" },
		"host space":    func(c *Config) { c.Hostname = "a b" },
		"host empty":    func(c *Config) { c.Hostname = "" },
		"host too long": func(c *Config) { c.Hostname = strings.Repeat("a", 65) },
	} {
		c := good
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted %+v", name, c)
		}
	}
}

func TestReadStatus(t *testing.T) {
	tm := Timings{Mounts: 3 * time.Millisecond, Seccomp: time.Microsecond}
	b, _ := json.Marshal(tm)
	got, err := ReadStatus(bytes.NewReader(append([]byte{statusOK}, b...)))
	if err != nil || got != tm {
		t.Fatalf("ok status: %+v %v", got, err)
	}
	_, err = ReadStatus(bytes.NewReader(append([]byte{statusErr}, "mount failed"...)))
	if err == nil || !strings.Contains(err.Error(), "mount failed") {
		t.Fatalf("error status: %v", err)
	}
	if _, err := ReadStatus(bytes.NewReader(nil)); !errors.Is(err, ErrNoStatus) {
		t.Fatalf("empty: %v", err)
	}
	if _, err := ReadStatus(bytes.NewReader([]byte{7})); err == nil {
		t.Fatal("accepted a bad status byte")
	}
	if _, err := ReadStatus(bytes.NewReader([]byte{statusOK, '{'})); err == nil {
		t.Fatal("accepted bad JSON")
	}
}
