// Command controller runs the cert-manager controllers that the rlog e2e test
// needs (self-signed and CA issuers, the Certificate life cycle), built from
// the published cert-manager module. cert-manager's own command lives in a
// module that is not published, so this is a small entry point of our own
// around its library; ACME, Vault and Venafi are left out on purpose.
// There is one replica, so there is no leader election.
package main

import (
	"context"
	"net"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/healthz"
	logf "github.com/cert-manager/cert-manager/pkg/logs"

	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

func main() {
	logf.InitLogs()
	defer logf.FlushLogs()
	log := logf.Log.WithName("controller")

	fs := pflag.NewFlagSet("controller", pflag.ExitOnError)
	// The Deployment passes the upstream chart's flags; only these matter here.
	fs.ParseErrorsAllowlist.UnknownFlags = true
	clusterNS := fs.String("cluster-resource-namespace", "kube-system", "namespace of the Secrets that ClusterIssuers refer to")
	healthzAddr := fs.String("healthz-listen-address", ":9403", "address of the /livez endpoint")
	workers := fs.Int("concurrent-workers", 5, "workers per controller")
	// Upstream's default too: a Certificate's Secret outlives it unless this is set.
	ownerRef := fs.Bool("enable-certificate-owner-ref", false, "make each Certificate the owner of its Secret")
	_ = fs.Parse(os.Args[1:])

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, log)

	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		KubernetesAPIQPS:   20,
		KubernetesAPIBurst: 50,
		IssuerOptions:      controller.IssuerOptions{ClusterResourceNamespace: *clusterNS},
		CertificateOptions: controller.CertificateOptions{EnableOwnerRef: *ownerRef},
	})
	if err != nil {
		log.Error(err, "building the controller context")
		os.Exit(1)
	}
	shared, err := factory.Build()
	if err != nil {
		log.Error(err, "building the shared context")
		os.Exit(1)
	}

	ln, err := net.Listen("tcp", *healthzAddr)
	if err != nil {
		log.Error(err, "healthz listen")
		os.Exit(1)
	}
	go func() { _ = healthz.NewServer(20*time.Second).Start(ctx, ln) }()

	known := controller.Known()
	names := make([]string, 0, len(known))
	for n := range known {
		names = append(names, n)
	}
	sort.Strings(names)
	done := make(chan error, len(names))
	for _, n := range names {
		c, err := known[n](factory)
		if err != nil {
			log.Error(err, "creating controller", "controller", n)
			os.Exit(1)
		}
		log.Info("starting controller", "controller", n)
		go func() { done <- c.Run(*workers, ctx) }()
	}
	shared.SharedInformerFactory.Start(ctx.Done())
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())

	select {
	case <-ctx.Done():
	case err := <-done:
		if err != nil {
			log.Error(err, "a controller stopped")
			os.Exit(1)
		}
	}
}
