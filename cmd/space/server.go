package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	fs2 "io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/space-sandbox/space/internal/auth"
	"github.com/space-sandbox/space/internal/cgroups"
	"github.com/space-sandbox/space/internal/core"
	"github.com/space-sandbox/space/internal/server"
)

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// storeOrDefault is the --store flag's value, else $SPACE_STORE (so a DSN
// with a password need not be on the command line), else sqlite. The flag's
// own default stays empty so that -h never prints the DSN.
func storeOrDefault(flagValue string) string {
	return cmp.Or(flagValue, os.Getenv("SPACE_STORE"), "sqlite")
}

func runServer(args []string) error {
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "state directory (SQLite store, templates, sandboxes)")
	fs.StringVar(&cfg.Store, "store", "", "store: sqlite (<data-dir>/space.db) or a postgres:// DSN shared by several servers (default $SPACE_STORE, else sqlite)")
	fs.StringVar(&cfg.NodeName, "node-name", "", "this server's node name, unique per replica (default: local with sqlite, <hostname>-<data-dir hash> with postgres)")
	fs.StringVar(&cfg.TemplateDir, "template-dir", "", "built templates (default <data-dir>/templates)")
	fs.StringVar(&cfg.AddrFile, "addr-file", "", "write the listen addresses here as JSON once serving")
	fs.StringVar(&cfg.RunDir, "run-dir", cfg.RunDir, "runtime directory for agent sockets (keep the path short)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "control API address")
	fs.StringVar(&cfg.DataListen, "data-listen", cfg.DataListen, "data plane address")
	fs.StringVar(&cfg.DataURL, "data-url", "", "public data-plane URL given to clients (default http://<data-listen>)")
	fs.StringVar(&cfg.Driver, "driver", cfg.Driver, "isolation driver: auto|firecracker|qemu|gvisor|namespace")
	fs.StringVar(&cfg.QEMUAccel, "qemu-accel", "", "qemu driver accelerator: kvm|tcg (default: KVM when it can run guests, else TCG)")
	fs.StringVar(&cfg.Runsc, "runsc", "", "runsc binary for the gvisor driver (default: scripts/runsc.sh's pinned build, then PATH)")
	fs.BoolVar(&cfg.NamespaceCRIU, "namespace-criu", true, "namespace driver: keep processes in snapshots, hibernation and forks with CRIU where scripts/criu.sh's patched build is found (--namespace-criu=false: files only)")
	fs.BoolVar(&cfg.NamespaceLazyRestore, "namespace-lazy-restore", true, "namespace driver: restore a checkpoint holding 128 MiB of memory or more on demand over userfaultfd (the sandbox runs before its pages are in; needs /dev/userfaultfd); --namespace-lazy-restore=false: every restore eager")
	fs.StringVar(&cfg.CgroupParent, "cgroup-parent", "", "namespace driver: put sandboxes' cgroups below this cgroup path (e.g. /space-sandboxes, in the host's tree: mounted from the host in a Kubernetes pod) instead of below the process's own, so that they outlive it")
	fs.BoolVar(&cfg.CgroupFavorDynMods, "cgroup-favordynmods", true, "turn on cgroup v2's favordynmods for the host's hierarchy at start (host-wide; from Linux 6.18 on it stays on until reboot): sandboxes' processes then join their cgroups without waiting for an RCU grace period (about 8 ms per create on an idle host); false: leave the host's cgroups as they are")
	warm := fs.String("warm-templates", "", "templates to keep a warm pool for (comma-separated)")
	fs.IntVar(&cfg.WarmPool, "warm-pool", 0, "warm sandboxes kept per warm template")
	builtins := fs.String("builtins", strings.Join(cfg.Builtins, ","), "builtin templates to build at start if missing (minimal,base)")
	limitFlags(fs, &cfg)
	portFlags(fs, &cfg)
	uidFlags(fs, &cfg)
	fs.DurationVar(&cfg.DefaultTimeout, "default-timeout", cfg.DefaultTimeout, "sandbox timeout when a create request names none (0 = none)")
	fs.DurationVar(&cfg.SessionTTL, "session-ttl", cfg.SessionTTL, "lifetime of data-plane session tokens")
	eg := egressFlags(fs)
	fs.StringVar(&cfg.E2BNetwork, "e2b-network", "blocked", "network of an E2B sandbox whose create asks for none: blocked (SPACE's default) or open (E2B's default: the internet through the egress gateway; needs --egress)")
	fs.StringVar(&cfg.DataTLSCert, "data-tls-cert", "", "PEM certificate (chain) of the data listener, e.g. a wildcard for *.<sandbox domain>: it then serves HTTPS (with --data-tls-key; re-read when the files change)")
	fs.StringVar(&cfg.DataTLSKey, "data-tls-key", "", "PEM private key of --data-tls-cert")
	fs.BoolVar(&cfg.RemoteNodes, "remote-nodes", false, "run no node here: place sandboxes on registered space node processes (needs --cluster-secret-file or $SPACE_CLUSTER_SECRET)")
	secretFile := fs.String("cluster-secret-file", "", "file holding the cluster secret that signs node requests (with --remote-nodes; default $SPACE_CLUSTER_SECRET)")
	link := clusterLinkFlags(fs)
	credKeys := fs.String("credential-keys", "", "with --remote-nodes: file of operator keys (64 hex digits each, the first seals) for the credential store the replicas share in the database (default $SPACE_CREDENTIAL_KEYS; none: no credentials)")
	fs.DurationVar(&cfg.NodeTimeout, "node-timeout", 15*time.Second, "with --remote-nodes: a node or server replica silent this long is marked lost")
	fs.DurationVar(&cfg.TemplateReadyTimeout, "template-ready-timeout", 2*time.Minute, "how long a template build's pre-warm, or a create that runs a start command, waits for its READY check to pass")
	fs.BoolVar(&cfg.AllowPrivateRegistries, "allow-private-registries", false, "let template image pulls reach registries on loopback, private and link-local addresses (off: refused, an SSRF guard)")
	fs.IntVar(&cfg.ProjectQuota, "project-quota", 0, "with --remote-nodes: most live sandboxes per project (0 = no bound)")
	fs.Func("checkpoint-default", "with --remote-nodes: [PROJECT=]INTERVAL, checkpoint the sandboxes of PROJECT (of every project without one) that name no checkpoint_seconds every INTERVAL (repeatable; 0 = none)", func(v string) error {
		return checkpointDefault(&cfg, v)
	})
	fs.StringVar(&cfg.Metrics.Listen, "metrics-listen", "", "serve Prometheus metrics at http://ADDR/metrics, without authentication (off by default; keep it private)")
	fs.StringVar(&cfg.AuditLog, "audit-log", "", "audit log of security decisions, JSON lines (default <data-dir>/audit.log; - for stderr)")
	fs.StringVar(&cfg.SnapshotStore, "snapshot-store", "", "also keep snapshots in this store: dir:/path or s3://bucket/prefix?endpoint=host:port (credentials: $AWS_ACCESS_KEY_ID, $AWS_SECRET_ACCESS_KEY); with --remote-nodes set it on the nodes instead")
	fs.DurationVar(&cfg.Retention, "retention", cfg.Retention, "prune ended sandboxes, finished operations and events older than this from the store (0 = keep them forever; snapshots are never pruned)")
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
	if cfg.Retention < 0 {
		return usagef("--retention %v: want 0 (keep forever) or a positive duration", cfg.Retention)
	}
	if err := lg.apply(&cfg); err != nil {
		return err
	}
	if cfg.RemoteNodes {
		secret, err := clusterSecret(*secretFile)
		if err != nil {
			return err
		}
		cfg.ClusterSecret = secret
		cfg.ClusterTLS, cfg.ClusterPlaintext = link.files(), link.plaintext
		if cfg.CredentialKeys, err = credentialKeys(*credKeys, false); err != nil {
			return err
		}
	} else if !link.files().Empty() || link.plaintext || *credKeys != "" || len(cfg.CheckpointDefaults) > 0 {
		return usagef("--cluster-tls-dir, --cluster-cert, --cluster-key, --cluster-ca, --cluster-plaintext, --credential-keys and --checkpoint-default are for --remote-nodes")
	}
	if err := eg.apply(&cfg); err != nil {
		return err
	}
	cfg.WarmTemplates = splitList(*warm)
	cfg.Builtins = splitList(*builtins)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := server.Start(ctx, cfg)
	if err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

const keysUsage = `usage: space keys <verb> [flags]

API keys live in the server's store; run these on the server machine with
the server's --data-dir (or --store DSN), as the user the server runs as.

verbs:
  create [--project default] [--name N] [--admin]   print a new key (shown once)
  list                                              every key: id, project, name, admin, revoked
  revoke KEY_ID

flags of every verb:
  --data-dir DIR   the server's state directory (default /var/lib/space)
  --store DSN      sqlite (<data-dir>/space.db) or postgres://… (default $SPACE_STORE, else sqlite)
  --init           create the store if there is none yet (otherwise a missing store is an error)
  --json           print JSON`

func runKeys(args []string) error {
	if len(args) == 0 {
		return usagef("%s", keysUsage)
	}
	switch args[0] {
	case "create", "list", "revoke":
	case "help", "-h", "--help":
		fmt.Println(keysUsage)
		return nil
	default:
		return usagef("unknown keys verb %q\n%s", args[0], keysUsage)
	}
	fs := flag.NewFlagSet("keys "+args[0], flag.ContinueOnError)
	dataDir := fs.String("data-dir", server.DefaultConfig().DataDir, "the server's state directory")
	store := fs.String("store", "", "store: sqlite (<data-dir>/space.db) or a postgres:// DSN (default $SPACE_STORE, else sqlite)")
	project := fs.String("project", "default", "project the key belongs to")
	admin := fs.Bool("admin", false, "an operator key: may also publish public templates, run template GC and list across projects")
	name := fs.String("name", "", "a label for the key")
	initStore := fs.Bool("init", false, "create the store if there is none yet (a server started later on this --data-dir uses it)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseClientArgs(fs, args[1:])
	if err != nil {
		return err
	}
	if want := map[string]int{"create": 0, "list": 0, "revoke": 1}[args[0]]; len(pos) != want {
		return usagef("%s", keysUsage)
	}
	*store = storeOrDefault(*store)
	if !server.IsPostgres(*store) && !*initStore {
		// A key made in the wrong directory is silently useless: the
		// server answers 401. Refuse a store that does not exist yet.
		db := filepath.Join(*dataDir, "space.db")
		if _, err := os.Stat(db); errors.Is(err, fs2.ErrNotExist) {
			return fmt.Errorf("no SPACE store at %s: --data-dir must be the server's own (the server's --data-dir; default /var/lib/space). "+
				"Start the server once to create it, or pass --init to create a new store here", db)
		} else if err != nil {
			return fmt.Errorf("%s: %w (run as the user the server runs as)", db, err)
		}
	}
	ctx := context.Background()
	if !server.IsPostgres(*store) {
		if err := os.MkdirAll(*dataDir, 0o711); err != nil {
			return err
		}
	}
	st, err := server.OpenStore(ctx, *store, *dataDir, "", nil)
	if err != nil {
		return err
	}
	defer st.Close()
	keys := auth.NewKeys(st, time.Now)
	switch args[0] {
	case "create":
		k, plain, err := keys.CreateKey(ctx, *project, *name, *admin)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSONTo(os.Stdout, map[string]any{"key": k, "secret": plain})
		}
		fmt.Println(plain)
		fmt.Fprintln(os.Stderr, "(shown once; only its hash is stored)")
	case "list":
		list, err := st.ListAPIKeys(ctx, "")
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSONTo(os.Stdout, map[string]any{"keys": list})
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tPROJECT\tNAME\tADMIN\tCREATED\tREVOKED")
		for _, k := range list {
			rev := "-"
			if k.RevokedAt != nil {
				rev = k.RevokedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%s\n", k.ID, k.ProjectID, k.Name, k.Admin, k.CreatedAt.Format(time.RFC3339), rev)
		}
		tw.Flush()
	case "revoke":
		if err := st.RevokeAPIKey(ctx, "", pos[0], time.Now().UTC()); err != nil {
			return err
		}
		if *asJSON {
			return printJSONTo(os.Stdout, map[string]any{"revoked": pos[0]})
		}
		fmt.Println("revoked", pos[0])
	}
	return nil
}

// checkpointDefault parses one --checkpoint-default: [PROJECT=]INTERVAL,
// a whole number of seconds within the bounds a create request has.
func checkpointDefault(cfg *server.Config, v string) error {
	project, interval := "*", v
	if p, d, ok := strings.Cut(v, "="); ok {
		project, interval = p, d
	}
	d, err := time.ParseDuration(interval)
	if err != nil || project == "" || len(project) > 128 {
		return fmt.Errorf("want [PROJECT=]INTERVAL (e.g. demo=30s), got %.80q", v)
	}
	sec := int64(d / time.Second)
	if d%time.Second != 0 || sec != 0 && (sec < core.MinCheckpointSeconds || sec > core.MaxCheckpointSeconds) {
		return fmt.Errorf("%s: the interval must be 0 (none) or whole seconds between %ds and %ds", v, core.MinCheckpointSeconds, core.MaxCheckpointSeconds)
	}
	if cfg.CheckpointDefaults == nil {
		cfg.CheckpointDefaults = map[string]int64{}
	}
	cfg.CheckpointDefaults[project] = sec
	return nil
}
