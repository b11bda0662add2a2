package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/space-sandbox/space/internal/logx"
	"github.com/space-sandbox/space/internal/operator"
	"github.com/space-sandbox/space/internal/version"
	"github.com/space-sandbox/space/pkg/client"
)

// runOperator serves the agent-sandbox API (Sandbox, SandboxTemplate,
// SandboxClaim, SandboxWarmPool) with SPACE sandboxes: it watches the
// Kubernetes API and drives a SPACE server's control API.
func runOperator(args []string) error {
	fs, c := newClientFlags("operator")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: the pod's service account in a cluster, else $KUBECONFIG, else ~/.kube/config)")
	keyFile := fs.String("api-key-file", "", "file holding the SPACE API key, e.g. a mounted Secret (default $SPACE_API_KEY)")
	var opts operator.Options
	fs.StringVar(&opts.Namespace, "namespace", "", "watch only this namespace (default: all)")
	fs.IntVar(&opts.Workers, "workers", 32, "Sandboxes and templates reconciled in parallel")
	fs.IntVar(&opts.ClaimWorkers, "claim-workers", 128, "claims and warm pools reconciled in parallel (each waits only on API writes)")
	fs.DurationVar(&opts.Resync, "resync", 30*time.Second, "reconcile every object this often (picks up changes on the SPACE side)")
	var le operator.LeaderOptions
	elect := fs.Bool("leader-elect", true, "reconcile only while holding the Lease --leader-election-namespace/space-operator, so replicas can stand by")
	fs.StringVar(&le.Namespace, "leader-election-namespace", "", "namespace of the leader Lease (default $POD_NAMESPACE, else the pod's own namespace, else default)")
	fs.DurationVar(&le.Duration, "leader-lease-duration", 15*time.Second, "how long a leader that stopped renewing keeps the lease before a standby takes over")
	fs.DurationVar(&le.Renew, "leader-renew-period", 2*time.Second, "how often the leader renews the lease (and a standby retries)")
	webhookAddr := fs.String("webhook-listen", "", "serve the validating webhook (TLS) on this address, e.g. :9443 (default: no webhook)")
	webhookCerts := fs.String("webhook-cert-dir", "/etc/space-operator/webhook", "directory with the webhook's tls.crt and tls.key (read again when they change)")
	lo := logFlags(fs)
	if err := fs.Parse(args); err != nil {
		return usageErr(err)
	}
	if fs.NArg() > 0 {
		return usageErr(errors.New("space operator takes no arguments"))
	}
	l, err := logx.New(os.Stderr, lo.format, lo.level)
	if err != nil {
		return usageErr(err)
	}
	opts.Logger = l
	c.resolve()
	if *keyFile != "" {
		b, err := os.ReadFile(*keyFile)
		if err != nil {
			return err
		}
		c.apiKey = strings.TrimSpace(string(b))
	}
	if c.apiKey == "" {
		return errors.New("no SPACE API key: set SPACE_API_KEY or --api-key-file (deploy/operator mounts it from a Secret)")
	}
	kube, err := operator.NewKube(*kubeconfig)
	if err != nil {
		return err
	}
	api := client.New(c.url, c.apiKey, client.WithUserAgent("space-operator/"+version.Version))
	ctx, stop := signalContext()
	defer stop()
	l.Info("operator: starting", "space", c.url, "namespace", opts.Namespace, "workers", opts.Workers, "claim_workers", opts.ClaimWorkers)
	if *webhookAddr != "" {
		// Every replica serves the webhook, leader or not: it only reads
		// the object under review.
		ws, err := operator.NewWebhookServer(*webhookAddr, *webhookCerts, l)
		if err != nil {
			return fmt.Errorf("webhook: %w", err)
		}
		go func() {
			if err := ws.ListenAndServeTLS("", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
				l.Error("operator: webhook server", "err", err)
			}
		}()
		go func() { <-ctx.Done(); ws.Close() }()
		l.Info("operator: serving the validating webhook", "listen", *webhookAddr)
	}
	op := operator.New(kube, api, opts)
	if !*elect {
		return op.Run(ctx)
	}
	le.Name, le.Logger = "space-operator", l
	if le.Namespace == "" {
		le.Namespace = podNamespace()
	}
	host, _ := os.Hostname()
	le.Identity = fmt.Sprintf("%s_%d", host, os.Getpid())
	return operator.RunLeader(ctx, kube, le, op.Run)
}

// podNamespace is $POD_NAMESPACE, else the service account's namespace
// in a pod, else "default".
func podNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && len(b) > 0 {
		return strings.TrimSpace(string(b))
	}
	return "default"
}
