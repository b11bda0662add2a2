package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/cluster"
	"github.com/space-sandbox/space/internal/server"
)

// clusterSecret reads the cluster secret from file, else from
// $SPACE_CLUSTER_SECRET.
func clusterSecret(file string) ([]byte, error) {
	if file != "" {
		return cluster.ReadSecret(file)
	}
	v := os.Getenv("SPACE_CLUSTER_SECRET")
	if v == "" {
		return nil, usagef("the cluster secret is required: --cluster-secret-file FILE or $SPACE_CLUSTER_SECRET (at least %d bytes, the same on servers and nodes)", cluster.MinSecretBytes)
	}
	return cluster.CheckSecret([]byte(v))
}

// linkFlags are the node link's TLS flags, the same on servers and nodes.
type linkFlags struct {
	dir, cert, key, ca string
	plaintext          bool
}

func clusterLinkFlags(fs *flag.FlagSet) *linkFlags {
	l := &linkFlags{}
	fs.StringVar(&l.dir, "cluster-tls-dir", "", "node link TLS: a directory with tls.crt, tls.key and ca.crt (what space certs issue writes; a Kubernetes TLS Secret with ca.crt)")
	fs.StringVar(&l.cert, "cluster-cert", "", "node link TLS: this process's certificate (PEM; default <cluster-tls-dir>/tls.crt)")
	fs.StringVar(&l.key, "cluster-key", "", "node link TLS: its private key (PEM; default <cluster-tls-dir>/tls.key)")
	fs.StringVar(&l.ca, "cluster-ca", "", "node link TLS: the CA that signs the other end's certificates (PEM; default <cluster-tls-dir>/ca.crt)")
	fs.BoolVar(&l.plaintext, "cluster-plaintext", false, "allow the node link without TLS, on loopback addresses only (tests, one-machine trials)")
	return l
}

func (l *linkFlags) files() cluster.TLSFiles {
	return cluster.TLSFiles{Cert: l.cert, Key: l.key, CA: l.ca}.InDir(l.dir)
}

func runNode(args []string) error {
	if ok, err := nodeVerb(args); ok {
		return err
	}
	cfg := server.DefaultConfig()
	cfg.Listen, cfg.DataListen = "127.0.0.1:7072", "127.0.0.1:7071"
	var nc server.NodeConfig
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	fs.StringVar(&cfg.NodeName, "name", "", "this node's name, unique in the cluster (required)")
	fs.StringVar(&cfg.Store, "store", "", "the store the servers share: a postgres:// DSN (default $SPACE_STORE)")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "state directory (templates, sandboxes, logs, snapshots)")
	fs.StringVar(&cfg.TemplateDir, "template-dir", "", "built templates (default <data-dir>/templates)")
	fs.StringVar(&cfg.RunDir, "run-dir", cfg.RunDir, "runtime directory for agent sockets (keep the path short)")
	fs.StringVar(&cfg.AddrFile, "addr-file", "", "write the listen addresses here as JSON once serving")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "node RPC address (servers call it; requests must be signed with the cluster secret)")
	fs.StringVar(&nc.RPCURL, "rpc-url", "", "RPC URL servers are told (default https://<listen>; http:// with --cluster-plaintext)")
	fs.StringVar(&cfg.DataListen, "data-listen", cfg.DataListen, "data plane address of this node's sandboxes")
	fs.StringVar(&cfg.DataURL, "data-url", "", "public data-plane URL given to clients (default http://<data-listen>)")
	fs.StringVar(&cfg.Driver, "driver", cfg.Driver, "isolation driver: auto|firecracker|qemu|gvisor|namespace")
	fs.StringVar(&cfg.QEMUAccel, "qemu-accel", "", "qemu driver accelerator: kvm|tcg")
	fs.StringVar(&cfg.Runsc, "runsc", "", "runsc binary for the gvisor driver")
	fs.BoolVar(&cfg.NamespaceCRIU, "namespace-criu", true, "namespace driver: keep processes in snapshots, hibernation and forks with CRIU where scripts/criu.sh's patched build is found (--namespace-criu=false: files only)")
	fs.BoolVar(&cfg.NamespaceLazyRestore, "namespace-lazy-restore", true, "namespace driver: restore a checkpoint holding 128 MiB of memory or more on demand over userfaultfd (the sandbox runs before its pages are in; needs /dev/userfaultfd); --namespace-lazy-restore=false: every restore eager")
	fs.StringVar(&cfg.CgroupParent, "cgroup-parent", "", "namespace driver: put sandboxes' cgroups below this cgroup path (e.g. /space-sandboxes, in the host's tree: mounted from the host in a Kubernetes pod) instead of below the process's own, so that they outlive it")
	fs.BoolVar(&cfg.CgroupFavorDynMods, "cgroup-favordynmods", true, "turn on cgroup v2's favordynmods for the host's hierarchy at start (host-wide; from Linux 6.18 on it stays on until reboot): sandboxes' processes then join their cgroups without waiting for an RCU grace period (about 8 ms per create on an idle host); false: leave the host's cgroups as they are")
	warm := fs.String("warm-templates", "", "templates to keep a warm pool for (comma-separated)")
	fs.IntVar(&cfg.WarmPool, "warm-pool", 0, "warm sandboxes kept per warm template")
	builtins := fs.String("builtins", "minimal,base", "builtin templates to build at start if missing")
	limitFlags(fs, &cfg)
	portFlags(fs, &cfg)
	uidFlags(fs, &cfg)
	uid := fs.Uint("uid-base", uint(cfg.UIDBase), "host uid of root in this node's templates (65536 ids), and in its sandboxes with --uid-pool off")
	secretFile := fs.String("cluster-secret-file", "", "file holding the cluster secret (at least 32 bytes; default $SPACE_CLUSTER_SECRET)")
	fs.DurationVar(&nc.Heartbeat, "heartbeat", time.Second, "interval of this node's heartbeats")
	cpus := fs.Float64("cpus", 0, "CPUs offered to the scheduler (default: the host's)")
	fs.Int64Var(&nc.MemoryBytes, "memory-bytes", 0, "memory offered to the scheduler (default: the host's MemTotal)")
	fs.IntVar(&nc.MaxSandboxes, "max-sandboxes", 0, "most sandboxes this node runs at once (0 = no bound)")
	fs.StringVar(&cfg.SnapshotStore, "snapshot-store", "", "snapshot store shared with the other nodes: dir:/path or s3://bucket/prefix?endpoint=host:port (credentials: $AWS_ACCESS_KEY_ID, $AWS_SECRET_ACCESS_KEY); default: snapshots stay in <data-dir>/snapshots")
	fs.StringVar(&cfg.Metrics.Listen, "metrics-listen", "", "serve Prometheus metrics at http://ADDR/metrics, without authentication (off by default; keep it private)")
	link := clusterLinkFlags(fs)
	eg := egressFlags(fs)
	lg := logFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if cfg.CgroupParent != "" {
		// Sandboxes' cgroups outside this process's cgroup namespace (a
		// pod's on a cgroup v2 host) need the host's namespace.
		if err := cgroups.ExecInHostNamespace(); err != nil {
			return err
		}
	}
	cfg.Store = storeOrDefault(cfg.Store)
	if err := lg.apply(&cfg); err != nil {
		return err
	}
	if eg.credKeyFile != "" {
		return usagef("--egress-credential-key: credentials are stored by the servers; a node gets the secrets it injects in each signed call")
	}
	if err := eg.apply(&cfg); err != nil {
		return usageErr(err)
	}
	secret, err := clusterSecret(*secretFile)
	if err != nil {
		return err
	}
	nc.Secret = secret
	nc.TLS, nc.Plaintext = link.files(), link.plaintext
	nc.CPUMillis = int64(*cpus * 1000)
	cfg.UIDBase = uint32(*uid)
	cfg.WarmTemplates = splitList(*warm)
	cfg.Builtins = splitList(*builtins)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	n, err := server.StartNode(ctx, cfg, nc)
	if err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return n.Shutdown(sctx)
}
