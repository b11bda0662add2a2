package multinode

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// certsInit makes a node link CA in dir with `space certs init`.
func certsInit(t *testing.T, bin, dir string) {
	t.Helper()
	if out, err := exec.Command(bin, "certs", "init", "--dir", dir).CombinedOutput(); err != nil {
		t.Fatalf("space certs init: %v\n%s", err, out)
	}
}

// certsIssue issues a certificate (role "node" or "server") for name from
// the CA in caDir into a new directory, as `space certs issue` does, and
// returns that directory.
func certsIssue(t *testing.T, bin, caDir, out, role, name string) string {
	t.Helper()
	args := []string{"certs", "issue", "--ca-dir", caDir, "--out", out, "--" + role, name}
	if role == "node" {
		args = append(args, "--host", "127.0.0.1")
	}
	if b, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("space certs issue %s %s: %v\n%s", role, name, err, b)
	}
	return out
}

// withLinkCerts gives every node and server of a cluster a certificate of
// one CA (made under work) and the flag that uses it: the node links of
// the test run over mutual TLS.
func withLinkCerts(t *testing.T, bin, work string, nodes, servers []*proc) {
	t.Helper()
	ca := filepath.Join(work, "link-ca")
	certsInit(t, bin, ca)
	for _, group := range []struct {
		role  string
		procs []*proc
	}{{"node", nodes}, {"server", servers}} {
		for _, p := range group.procs {
			dir := certsIssue(t, bin, ca, filepath.Join(work, "link-"+p.name), group.role, p.name)
			p.args = append(p.args, "--cluster-tls-dir", dir)
		}
	}
}
