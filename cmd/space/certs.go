package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/space-sandbox/space/internal/cluster"
)

const certsUsage = `usage:
  space certs init  --dir CA_DIR [--days 3650]
      a CA for the node link: CA_DIR/ca.crt and CA_DIR/ca.key (keep ca.key off the nodes and servers)
  space certs issue --ca-dir CA_DIR --out DIR (--node NAME [--host H,…] | --server NAME) [--days 365]
      DIR/tls.crt, DIR/tls.key and DIR/ca.crt for one node (its --name, plus the hosts of its --rpc-url)
      or one server replica (--node-name); give DIR to --cluster-tls-dir`

func runCerts(args []string) error {
	if len(args) == 0 {
		return usagef("%s", certsUsage)
	}
	switch args[0] {
	case "init":
		return certsInit(args[1:])
	case "issue":
		return certsIssue(args[1:])
	case "-h", "--help", "help":
		fmt.Println(certsUsage)
		return nil
	}
	return usagef("unknown certs verb %q\n%s", args[0], certsUsage)
}

func certsInit(args []string) error {
	fs := flag.NewFlagSet("certs init", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory for ca.crt and ca.key (required)")
	days := fs.Int("days", 3650, "validity in days")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *dir == "" || *days <= 0 || fs.NArg() > 0 {
		return usagef("%s", certsUsage)
	}
	crt, key := filepath.Join(*dir, "ca.crt"), filepath.Join(*dir, "ca.key")
	for _, p := range []string{crt, key} {
		if _, err := os.Stat(p); err == nil {
			return fmt.Errorf("%s exists: a new CA would orphan every certificate it signed (remove it first to start over)", p)
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	certPEM, keyPEM, err := cluster.NewCA("SPACE node link CA", time.Duration(*days)*24*time.Hour, time.Now())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	if err := writeFileAtomic(key, keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeFileAtomic(crt, certPEM, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "CA written to %s and %s\n", crt, key)
	return nil
}

func certsIssue(args []string) error {
	fs := flag.NewFlagSet("certs issue", flag.ContinueOnError)
	caDir := fs.String("ca-dir", "", "the CA's directory (ca.crt, ca.key; required)")
	out := fs.String("out", "", "directory for tls.crt, tls.key and ca.crt (required)")
	node := fs.String("node", "", "issue a node certificate for this --name")
	srv := fs.String("server", "", "issue a server replica certificate (client auth) for this --node-name")
	hosts := fs.String("host", "", "node certificates: further DNS names or IP addresses (comma-separated; the host of its --rpc-url)")
	days := fs.Int("days", 365, "validity in days (at most the CA's)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *caDir == "" || *out == "" || (*node == "") == (*srv == "") || *days <= 0 || fs.NArg() > 0 {
		return usagef("%s", certsUsage)
	}
	req := cluster.CertRequest{Role: cluster.RoleNode, Name: *node, Hosts: splitList(*hosts), Validity: time.Duration(*days) * 24 * time.Hour}
	if *srv != "" {
		if *hosts != "" {
			return usagef("--host is for node certificates")
		}
		req.Role, req.Name, req.Hosts = cluster.RoleServer, *srv, nil
	}
	caCert, err := os.ReadFile(filepath.Join(*caDir, "ca.crt"))
	if err != nil {
		return err
	}
	caKey, err := os.ReadFile(filepath.Join(*caDir, "ca.key"))
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := cluster.IssueCert(caCert, caKey, req, time.Now())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{{cluster.TLSKeyFile, keyPEM, 0o600}, {cluster.TLSCertFile, certPEM, 0o644}, {cluster.TLSCAFile, caCert, 0o644}} {
		if err := writeFileAtomic(filepath.Join(*out, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "%s certificate for %s written to %s\n", req.Role, req.Name, *out)
	return nil
}

// writeFileAtomic writes a file whole or not at all (temp file, fsync,
// rename): a renewal never leaves a certificate without its key.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
