package main

import (
	"errors"
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
	fs.IntVar(&opts.Workers, "workers", 32, "objects reconciled in parallel")
	fs.DurationVar(&opts.Resync, "resync", 30*time.Second, "reconcile every object this often (picks up changes on the SPACE side)")
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
	l.Info("operator: starting", "space", c.url, "namespace", opts.Namespace, "workers", opts.Workers)
	return operator.New(kube, api, opts).Run(ctx)
}
