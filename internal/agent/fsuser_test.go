package agent_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/space-sandbox/space/internal/agent"
	"github.com/space-sandbox/space/internal/agent/client"
)

// userDir makes a directory that others may traverse, owned by uid:gid.
func userDir(t *testing.T, uid, gid int) string {
	t.Helper()
	base, err := os.MkdirTemp("", "agent-fsuser")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	return dir
}

func owner(t *testing.T, p string) string {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return fmt.Sprintf("%d:%d", st.Uid, st.Gid)
}

// TestFilesAsUser: every file route acts with the requesting user's
// permissions (the kernel checks them: the agent's thread takes the user's
// ids), what it creates is the user's, and the agent's own identity is
// intact afterwards.
func TestFilesAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as other users")
	}
	etc := t.TempDir()
	os.WriteFile(filepath.Join(etc, "passwd"), []byte("root:x:0:0::/root:/bin/sh\n"+
		"alice:x:4242:4343::/home/alice:/bin/sh\nbob:x:4545:4545::/home/bob:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(etc, "group"), []byte("alice:x:4343:\nteam:x:4444:alice\n"), 0o644)
	a := startAgent(t, agent.WithEtcDir(agent.Options{}, etc))
	alice, bob, root := a.As("alice"), a.As("bob"), a.As("root")
	ctx := testCtx(t)

	// root (0755): base; private (0700, like /root) with a secret;
	// pub (1777, like /tmp) with a file of root's; home (alice's);
	// team (root:team 0770).
	base := userDir(t, 0, 0)
	private, pub, home, team := filepath.Join(base, "private"), filepath.Join(base, "pub"), filepath.Join(base, "home"), filepath.Join(base, "team")
	for _, d := range []struct {
		p        string
		mode     os.FileMode
		uid, gid int
	}{{private, 0o700, 0, 0}, {pub, 0o777 | os.ModeSticky, 0, 0}, {home, 0o755, 4242, 4343}, {team, 0o770, 0, 4444}} {
		os.Mkdir(d.p, 0o700)
		os.Chmod(d.p, d.mode)
		os.Chown(d.p, d.uid, d.gid)
	}
	secret := filepath.Join(private, "secret")
	os.WriteFile(secret, []byte("root only"), 0o644)
	rootsFile := filepath.Join(pub, "roots")
	os.WriteFile(rootsFile, []byte("r"), 0o644)
	os.Symlink(secret, filepath.Join(home, "link"))

	denied := func(what string, err error) {
		t.Helper()
		if !client.IsPermissionDenied(err) || !client.HasCode(err, agent.CodePermissionDenied) {
			t.Errorf("%s: %v, want 403 permission_denied", what, err)
		} else if !strings.Contains(err.Error(), "alice") {
			t.Errorf("%s: the error does not name the user: %v", what, err)
		}
	}

	// Writes land as the user, with the mode asked for.
	f := filepath.Join(pub, "new", "f")
	if err := alice.Upload(ctx, f, 0o640, strings.NewReader("hi")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{f, filepath.Dir(f)} {
		if o := owner(t, p); o != "4242:4343" {
			t.Errorf("%s owned by %s, want alice", p, o)
		}
	}
	if fi, _ := os.Stat(f); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v", fi.Mode())
	}
	if err := alice.Mkdir(ctx, filepath.Join(home, "a", "b")); err != nil {
		t.Fatal(err)
	}
	if o := owner(t, filepath.Join(home, "a", "b")); o != "4242:4343" {
		t.Errorf("mkdir: owned by %s", o)
	}

	// What alice may not do, the routes refuse as a command would be.
	denied("upload into a 0700 dir", alice.Upload(ctx, filepath.Join(private, "x"), 0o644, strings.NewReader("x")))
	denied("upload into a root dir", alice.Upload(ctx, filepath.Join(base, "x"), 0o644, strings.NewReader("x")))
	denied("mkdir in a 0700 dir", alice.Mkdir(ctx, filepath.Join(private, "sub")))
	_, _, err := alice.Download(ctx, secret)
	denied("download from a 0700 dir", err)
	_, _, err = alice.Download(ctx, filepath.Join(home, "link"))
	denied("download through a symlink into a 0700 dir", err)
	_, err = alice.Stat(ctx, secret)
	denied("stat in a 0700 dir", err)
	_, err = alice.ListDir(ctx, private)
	denied("list a 0700 dir", err)
	denied("remove another's file in a sticky dir", alice.Remove(ctx, rootsFile, false))
	denied("move another's file in a sticky dir", alice.Move(ctx, rootsFile, filepath.Join(pub, "stolen")))
	denied("move into a 0700 dir", alice.Move(ctx, f, filepath.Join(private, "f")))
	if ents, _ := os.ReadDir(private); len(ents) != 1 {
		t.Errorf("private dir now holds %d entries (temporary files left?)", len(ents))
	}
	if b, _ := os.ReadFile(rootsFile); string(b) != "r" {
		t.Errorf("root's file changed: %q", b)
	}
	// Supplementary groups count: alice is in team, bob is not.
	if err := alice.Upload(ctx, filepath.Join(team, "t"), 0o644, strings.NewReader("t")); err != nil {
		t.Errorf("upload into a group-writable dir of alice's group: %v", err)
	}
	if err := bob.Upload(ctx, filepath.Join(team, "b"), 0o644, strings.NewReader("b")); !client.IsPermissionDenied(err) {
		t.Errorf("bob wrote into team's dir: %v", err)
	}
	// A file alice may write in a directory she may not: rewritten in
	// place, as "> file" would; bob may do neither.
	hers := filepath.Join(base, "hers")
	os.WriteFile(hers, []byte("old content"), 0o644)
	os.Chown(hers, 4242, 4343)
	if err := alice.Upload(ctx, hers, 0o600, strings.NewReader("new")); err != nil {
		t.Errorf("rewrite own file in a root dir: %v", err)
	} else if b, _ := os.ReadFile(hers); string(b) != "new" || owner(t, hers) != "4242:4343" {
		t.Errorf("rewritten file: %q owned by %s", b, owner(t, hers))
	}
	if err := bob.Upload(ctx, hers, 0o644, strings.NewReader("bob")); !client.IsPermissionDenied(err) {
		t.Errorf("bob rewrote alice's 0600 file: %v", err)
	}
	// root may do all of it.
	rc, _, err := root.Download(ctx, secret)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "root only" {
		t.Errorf("root read %q", b)
	}
	if _, err := a.As("nobody-here").Stat(ctx, base); !client.HasCode(err, agent.CodeUnknownUser) {
		t.Errorf("unknown user: %v", err)
	}

	// Without a user the configured default user acts; root still can.
	if err := a.SetConfig(ctx, agent.Config{User: "alice"}); err != nil {
		t.Fatal(err)
	}
	denied("default user into a 0700 dir", a.Upload(ctx, filepath.Join(private, "d"), 0o644, strings.NewReader("x")))
	if err := root.Upload(ctx, filepath.Join(private, "r"), 0o644, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	if o := owner(t, filepath.Join(private, "r")); o != "0:0" {
		t.Errorf("root's upload owned by %s", o)
	}
	a.SetConfig(ctx, agent.Config{})

	// Many requests of both users at once: no thread keeps alice's ids.
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := 0; i < 50; i++ {
		wg.Add(2)
		go func(i int) {
			defer wg.Done()
			p := filepath.Join(pub, fmt.Sprintf("a%d", i))
			if err := alice.Upload(ctx, p, 0o644, bytes.NewReader(make([]byte, 64<<10))); err != nil {
				errs <- err
			} else if o := owner(t, p); o != "4242:4343" {
				errs <- fmt.Errorf("%s owned by %s", p, o)
			}
		}(i)
		go func(i int) {
			defer wg.Done()
			p := filepath.Join(private, fmt.Sprintf("r%d", i))
			if err := root.Upload(ctx, p, 0o644, strings.NewReader("x")); err != nil {
				errs <- err
			} else if o := owner(t, p); o != "0:0" {
				errs <- fmt.Errorf("%s owned by %s", p, o)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	tasks, _ := filepath.Glob("/proc/self/task/*/status")
	for _, st := range tasks {
		b, err := os.ReadFile(st)
		if err != nil {
			continue // thread gone
		}
		for _, line := range strings.Split(string(b), "\n") {
			if (strings.HasPrefix(line, "Uid:") || strings.HasPrefix(line, "Gid:")) && strings.Join(strings.Fields(line)[1:], " ") != "0 0 0 0" {
				t.Errorf("thread %s: %s", filepath.Base(filepath.Dir(st)), line)
			}
		}
	}
	// Commands are unaffected.
	if res := run(t, a, agent.ProcessSpec{Shell: "id -u; cat " + secret}); res.stdout.String() != "0\nroot only" {
		t.Errorf("command as root: %q %q", res.stdout.String(), res.stderr.String())
	}
}
