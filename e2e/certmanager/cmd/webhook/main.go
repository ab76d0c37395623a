// Command webhook runs cert-manager's admission webhook (validation and
// defaulting of its resources) from the published cert-manager module, with
// the same flags as the upstream image, so the upstream chart's Deployment
// runs it unchanged. A small entry point of our own: the upstream command
// lives in a module that is not published.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	cmwebhook "github.com/cert-manager/cert-manager/internal/webhook"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"
	"github.com/cert-manager/cert-manager/pkg/webhook/options"
)

func main() {
	logf.InitLogs()
	defer logf.FlushLogs()
	log := logf.Log.WithName("webhook")

	cfg, err := options.NewWebhookConfiguration()
	if err != nil {
		log.Error(err, "default configuration")
		os.Exit(1)
	}
	fs := pflag.NewFlagSet("webhook", pflag.ExitOnError)
	options.NewWebhookFlags().AddFlags(fs)
	options.AddConfigFlags(fs, cfg)
	_ = fs.Parse(os.Args[1:])
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(cfg.FeatureGates); err != nil {
		log.Error(err, "feature gates")
		os.Exit(1)
	}
	if err := logf.ValidateAndApply(&cfg.Logging); err != nil {
		log.Error(err, "logging flags")
		os.Exit(1)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := cmwebhook.NewCertManagerWebhookServer(log, *cfg)
	if err != nil {
		log.Error(err, "building the webhook server")
		os.Exit(1)
	}
	if err := srv.Run(ctx); err != nil {
		log.Error(err, "webhook server stopped")
		os.Exit(1)
	}
}
