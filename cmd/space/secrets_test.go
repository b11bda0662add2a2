package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Secrets the CLI may find in its environment; none may ever be printed.
const (
	testKey         = "space_k3y-must-never-be-printed"
	testStoreSecret = "pg-passw0rd-must-never-be-printed"
	testCluster     = "cluster-secret-must-never-be-printed-0123456789"
)

// TestNoSecretInHelpOrErrors runs every verb with -h, --help, an unknown
// flag and a bad flag value while the key, a DSN with a password and the
// cluster secret are in the environment, and fails if any of them shows up
// (flag defaults used to be printed in the usage after a flag error).
func TestNoSecretInHelpOrErrors(t *testing.T) {
	bin := buildCLI(t)
	env := append(os.Environ(), "SPACE_API_KEY="+testKey, "SPACE_URL=http://127.0.0.1:9",
		"SPACE_STORE=postgres://space:"+testStoreSecret+"@127.0.0.1:9/space", "SPACE_CLUSTER_SECRET="+testCluster)
	var lines [][]string
	for key := range completionTable {
		if key == "agent" || key == "help" {
			continue
		}
		words := strings.Fields(key)
		lines = append(lines,
			append(append([]string{}, words...), "-h"),
			append(append([]string{}, words...), "--help"),
			append(append([]string{}, words...), "--no-such-flag"),
			append(append([]string{}, words...), "--json=maybe"),
		)
	}
	lines = append(lines,
		[]string{"sandbox", "create", "--env", "FOO"},    // the typo of the issue
		[]string{"sandbox", "create", "--timeout", "30"}, // no unit
		[]string{"sandbox", "exec", "--bogus", "sbx-x", "--", "true"},
		[]string{"sandbox", "list"}, // connection refused: the URL, never the key
		[]string{"keys", "create", "--data-dir", t.TempDir()},
		[]string{"help"}, []string{"--help"}, []string{"no-such-command"},
	)
	for _, args := range lines {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out, _ := cmd.CombinedOutput()
		for _, secret := range []string{testKey, testStoreSecret, testCluster} {
			if strings.Contains(string(out), secret) {
				t.Errorf("space %s printed a secret:\n%s", strings.Join(args, " "), out)
			}
		}
	}
}

// TestKeysRefuseMissingStore: a key made in a directory that holds no
// store is useless (the server answers 401), so `space keys create`
// refuses one and says what to do; --init creates the store on purpose.
func TestKeysRefuseMissingStore(t *testing.T) {
	bin := buildCLI(t)
	dir := t.TempDir()
	cmd := exec.Command(bin, "keys", "create", "--data-dir", dir)
	cmd.Env = append(os.Environ(), "SPACE_STORE=")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no SPACE store at "+dir+"/space.db") || !strings.Contains(string(out), "--init") {
		t.Fatalf("keys create in an empty dir: %v %q", err, out)
	}
	if _, err := os.Stat(dir + "/space.db"); err == nil {
		t.Fatal("keys create made a store without --init")
	}
	cmd = exec.Command(bin, "keys", "create", "--init", "--data-dir", dir)
	cmd.Env = append(os.Environ(), "SPACE_STORE=")
	if out, err := cmd.Output(); err != nil || !strings.HasPrefix(string(out), "space_") {
		t.Fatalf("keys create --init: %v %q", err, out)
	}
	cmd = exec.Command(bin, "keys", "list", "--data-dir", dir)
	cmd.Env = append(os.Environ(), "SPACE_STORE=")
	if out, err := cmd.Output(); err != nil || strings.Count(string(out), "\n") != 2 {
		t.Fatalf("keys list after --init: %v %q", err, out)
	}
	for _, args := range [][]string{{"keys", "help"}, {"keys", "--help"}} {
		if out, err := exec.Command(bin, args...).Output(); err != nil || !strings.Contains(string(out), "revoke KEY_ID") {
			t.Errorf("space %v: %v %q", args, err, out)
		}
	}
}
