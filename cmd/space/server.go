package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/space-sandbox/space/internal/auth"
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

// storeDefault is $SPACE_STORE (so a DSN with a password need not be on
// the command line), else sqlite.
func storeDefault() string {
	if v := os.Getenv("SPACE_STORE"); v != "" {
		return v
	}
	return "sqlite"
}

func runServer(args []string) error {
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "state directory (SQLite store, templates, sandboxes)")
	fs.StringVar(&cfg.Store, "store", storeDefault(), "store: sqlite (<data-dir>/space.db) or a postgres:// DSN shared by several servers (default $SPACE_STORE, else sqlite)")
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
	warm := fs.String("warm-templates", "", "templates to keep a warm pool for (comma-separated)")
	fs.IntVar(&cfg.WarmPool, "warm-pool", 0, "warm sandboxes kept per warm template")
	builtins := fs.String("builtins", strings.Join(cfg.Builtins, ","), "builtin templates to build at start if missing (minimal,base)")
	limitFlags(fs, &cfg)
	portFlags(fs, &cfg)
	fs.DurationVar(&cfg.DefaultTimeout, "default-timeout", cfg.DefaultTimeout, "sandbox timeout when a create request names none (0 = none)")
	fs.DurationVar(&cfg.SessionTTL, "session-ttl", cfg.SessionTTL, "lifetime of data-plane session tokens")
	eg := egressFlags(fs)
	fs.BoolVar(&cfg.RemoteNodes, "remote-nodes", false, "run no node here: place sandboxes on registered space node processes (needs --cluster-secret-file or $SPACE_CLUSTER_SECRET)")
	secretFile := fs.String("cluster-secret-file", "", "file holding the cluster secret that signs node requests (with --remote-nodes; default $SPACE_CLUSTER_SECRET)")
	link := clusterLinkFlags(fs)
	credKeys := fs.String("credential-keys", "", "with --remote-nodes: file of operator keys (64 hex digits each, the first seals) for the credential store the replicas share in the database (default $SPACE_CREDENTIAL_KEYS; none: no credentials)")
	fs.DurationVar(&cfg.NodeTimeout, "node-timeout", 15*time.Second, "with --remote-nodes: a node or server replica silent this long is marked lost")
	fs.DurationVar(&cfg.TemplateReadyTimeout, "template-ready-timeout", 2*time.Minute, "how long a template build's pre-warm waits for its READY check to pass")
	fs.BoolVar(&cfg.AllowPrivateRegistries, "allow-private-registries", false, "let template image pulls reach registries on loopback, private and link-local addresses (off: refused, an SSRF guard)")
	fs.IntVar(&cfg.ProjectQuota, "project-quota", 0, "with --remote-nodes: most live sandboxes per project (0 = no bound)")
	fs.StringVar(&cfg.Metrics.Listen, "metrics-listen", "", "serve Prometheus metrics at http://ADDR/metrics, without authentication (off by default; keep it private)")
	fs.StringVar(&cfg.AuditLog, "audit-log", "", "audit log of security decisions, JSON lines (default <data-dir>/audit.log; - for stderr)")
	fs.StringVar(&cfg.SnapshotStore, "snapshot-store", "", "also keep snapshots in this store: dir:/path or s3://bucket/prefix?endpoint=host:port (credentials: $AWS_ACCESS_KEY_ID, $AWS_SECRET_ACCESS_KEY); with --remote-nodes set it on the nodes instead")
	fs.DurationVar(&cfg.Retention, "retention", cfg.Retention, "prune ended sandboxes, finished operations and events older than this from the store (0 = keep them forever; snapshots are never pruned)")
	lg := logFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
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
	} else if !link.files().Empty() || link.plaintext || *credKeys != "" {
		return usagef("--cluster-tls-dir, --cluster-cert, --cluster-key, --cluster-ca, --cluster-plaintext and --credential-keys are for --remote-nodes")
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

func runKeys(args []string) error {
	if len(args) == 0 {
		return usagef("usage: space keys create|list|revoke [--data-dir DIR | --store DSN] [--json] [flags]")
	}
	fs := flag.NewFlagSet("keys "+args[0], flag.ContinueOnError)
	dataDir := fs.String("data-dir", server.DefaultConfig().DataDir, "server state directory")
	store := fs.String("store", storeDefault(), "store: sqlite (<data-dir>/space.db) or a postgres:// DSN (default $SPACE_STORE, else sqlite)")
	project := fs.String("project", "default", "project the key belongs to")
	admin := fs.Bool("admin", false, "an operator key: may also publish public templates, run template GC and list across projects")
	name := fs.String("name", "", "a label for the key")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return usageErr(helpOK(err))
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
		if fs.NArg() != 1 {
			return usagef("usage: space keys revoke [--data-dir DIR] KEY_ID")
		}
		if err := st.RevokeAPIKey(ctx, "", fs.Arg(0), time.Now().UTC()); err != nil {
			return err
		}
		if *asJSON {
			return printJSONTo(os.Stdout, map[string]any{"revoked": fs.Arg(0)})
		}
		fmt.Println("revoked", fs.Arg(0))
	default:
		return usagef("unknown keys verb %q", args[0])
	}
	return nil
}
