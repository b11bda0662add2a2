package agent

import (
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestCleanPath(t *testing.T) {
	ok := map[string]string{
		"/":          "/",
		"/a/b/":      "/a/b",
		"//a//b/./c": "/a/b/c",
		"/a/./b":     "/a/b",
	}
	for in, want := range ok {
		got, err := cleanPath(in)
		if err != nil || got != want {
			t.Errorf("cleanPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := []string{"", "a", "./a", "../a", "/a/../b", "/..", "/a/..", "/a\x00b", "/" + strings.Repeat("a", MaxPathBytes)}
	for _, in := range bad {
		if got, err := cleanPath(in); err == nil {
			t.Errorf("cleanPath(%q) = %q, want error", truncate(in, 20), got)
		}
	}
}

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"/", "/a/b", "a", "/a/../b", "/a/./b//", "/\x00", "/..a/b..", "//", "/a/b/.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := cleanPath(in)
		if err != nil {
			return
		}
		if !strings.HasPrefix(got, "/") || path.Clean(got) != got || strings.IndexByte(got, 0) >= 0 || len(got) > MaxPathBytes {
			t.Fatalf("cleanPath(%q) = %q: not a clean absolute path", in, got)
		}
		for _, e := range strings.Split(got, "/") {
			if e == ".." {
				t.Fatalf("cleanPath(%q) = %q contains ..", in, got)
			}
		}
	})
}

func FuzzProcessSpecDecode(f *testing.F) {
	for _, s := range []string{
		`{"argv":["true"]}`,
		`{"shell":"echo hi","env":{"A":"B"},"cwd":"/tmp","timeout_ms":10}`,
		`{"argv":["a"],"shell":"b"}`,
		`{"argv":["x"],"pty":{"cols":80,"rows":24},"stdin":true,"user":"nobody","tag":"t"}`,
		`{"argv":["x"],"bogus":1}`,
		`{"argv":["x"]} {}`,
		`{"argv":[""]}`,
		`{"shell":"x","env":{"A=B":"c"}}`,
		`{"shell":"x","cwd":"rel"}`,
		`{"shell":"x","timeout_ms":-1}`,
		`[]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := decodeProcessSpec(data)
		if err != nil {
			return
		}
		if (len(spec.Argv) == 0) == (spec.Shell == "") {
			t.Fatalf("accepted spec without exactly one of argv/shell: %+v", spec)
		}
		if len(spec.Argv) > MaxArgs || spec.TimeoutMs < 0 {
			t.Fatalf("accepted out-of-range spec")
		}
		if spec.Cwd != "" {
			if c, err := cleanPath(spec.Cwd); err != nil || c != spec.Cwd {
				t.Fatalf("accepted bad cwd %q", spec.Cwd)
			}
		}
		for k, v := range spec.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
				t.Fatalf("accepted bad env %q", k)
			}
		}
		if spec.PTY != nil && (spec.PTY.Cols == 0 || spec.PTY.Rows == 0) {
			t.Fatalf("accepted zero pty size")
		}
	})
}

func TestDecodeProcessSpecLimits(t *testing.T) {
	big := make([]string, MaxArgs+1)
	for i := range big {
		big[i] = "x"
	}
	b, _ := json.Marshal(ProcessSpec{Argv: big})
	if _, err := decodeProcessSpec(b); err == nil {
		t.Error("too many args accepted")
	}
	b, _ = json.Marshal(ProcessSpec{Argv: []string{strings.Repeat("a", MaxArgBytes)}})
	if _, err := decodeProcessSpec(b); err == nil {
		t.Error("oversized argv accepted")
	}
}

func TestParseSignal(t *testing.T) {
	ok := map[string]syscall.Signal{`"SIGTERM"`: syscall.SIGTERM, `"term"`: syscall.SIGTERM, `"9"`: syscall.SIGKILL, `15`: syscall.SIGTERM, `"SIGUSR1"`: syscall.SIGUSR1, `34`: 34}
	for in, want := range ok {
		got, err := parseSignal(json.RawMessage(in))
		if err != nil || got != want {
			t.Errorf("parseSignal(%s) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{``, `0`, `65`, `-1`, `"SIGNOPE"`, `"0"`, `true`, `{}`, `1.5`} {
		if got, err := parseSignal(json.RawMessage(in)); err == nil {
			t.Errorf("parseSignal(%s) = %v, want error", in, got)
		}
	}
	if signalName(syscall.SIGKILL) != "SIGKILL" {
		t.Errorf("signalName(SIGKILL) = %q", signalName(syscall.SIGKILL))
	}
}

func TestLookupUser(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "passwd"), []byte(
		"root:x:0:0:root:/root:/bin/sh\n"+
			"broken line\n"+
			"bad:x:notanumber:1::/home/bad:/bin/sh\n"+
			"alice:x:1000:1000:Alice:/home/alice:/bin/bash\n"+
			"norel:x:1001:1001::relative:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "group"), []byte(
		"root:x:0:\n"+
			"alice:x:1000:\n"+
			"wheel:x:10:bob,alice\n"+
			"docker:x:999:alice\n"+
			"other:x:50:bob\n"), 0o644)
	a, err := lookupUser(dir, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if a.UID != 1000 || a.GID != 1000 || a.Home != "/home/alice" || len(a.Groups) != 3 || a.Groups[0] != 1000 || a.Groups[1] != 10 || a.Groups[2] != 999 {
		t.Errorf("alice = %+v", a)
	}
	if a, err := lookupUser(dir, "1000"); err != nil || a.Name != "alice" {
		t.Errorf("uid 1000 = %+v, %v", a, err)
	}
	if a, err := lookupUser(dir, "4242"); err != nil || a.UID != 4242 || a.GID != 0 || a.Home != "/" {
		t.Errorf("uid 4242 = %+v, %v", a, err)
	}
	if a, err := lookupUser(dir, "norel"); err != nil || a.Home != "/" {
		t.Errorf("norel = %+v, %v", a, err)
	}
	for _, u := range []string{"nobody", "bad", "", "a:b", "a\nb", strings.Repeat("x", 300)} {
		if _, err := lookupUser(dir, u); err == nil {
			t.Errorf("lookupUser(%q) succeeded", truncate(u, 20))
		}
	}
	// No passwd at all: numeric users still work.
	if a, err := lookupUser(t.TempDir(), "0"); err != nil || a.Name != "root" || a.Home != "/root" {
		t.Errorf("uid 0 without passwd = %+v, %v", a, err)
	}
}

func TestEventLogDropsWithoutReader(t *testing.T) {
	l := newEventLog(10, time.Nanosecond, nil)
	for i := 0; i < 5; i++ {
		if !l.append(EventStdout, []byte("abcd")) {
			t.Fatal("append failed")
		}
	}
	if l.first != 4 || l.next != 6 || l.bytes != 8 {
		t.Fatalf("first=%d next=%d bytes=%d", l.first, l.next, l.bytes)
	}
	if _, err := l.attach(2); err != errEventsGone {
		t.Fatalf("attach(2) = %v, want errEventsGone", err)
	}
	if r, err := l.attach(3); err != nil {
		t.Fatalf("attach(3) = %v", err)
	} else {
		l.detach(r)
	}
}

func TestEventLogBlocksForReader(t *testing.T) {
	l := newEventLog(10, time.Nanosecond, nil)
	r, err := l.attach(0)
	if err != nil {
		t.Fatal(err)
	}
	l.append(EventStdout, []byte("abcdefgh"))
	done := make(chan struct{})
	go func() {
		l.append(EventStdout, []byte("ijkl")) // over budget: must wait for r
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("append did not block while the reader lagged")
	case <-time.After(50 * time.Millisecond):
	}
	l.mu.Lock()
	r.pos = 1
	l.appendWaiting = false
	l.broadcastLocked()
	l.mu.Unlock()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("append stayed blocked after the reader advanced")
	}
	if l.first != 2 {
		t.Fatalf("first = %d, want 2 (event 1 sent, then dropped)", l.first)
	}
	l.detach(r)
}
