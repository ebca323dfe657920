// Package gateway is `gpujob gateway`: the HTTP front door of gpujob
// services (internal/gateway), with the autoscaler one elected instance
// runs (internal/autoscale), and the Nomad job that runs it.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/command/service"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/autoscale"
	gw "github.com/gpujob/gpujob/internal/gateway"
	"github.com/gpujob/gpujob/internal/servekv"
)

// NewCmd returns the gateway command and its subcommands.
func NewCmd(f *factory.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run the gateway in front of gpujob services, or print its Nomad job",
		Long: `The gateway routes HTTP requests to the healthy replicas of gpujob services by
path prefix (and Host), learning both from Consul with blocking queries: the
routes and tokens from KV, the replicas from health. It asks for a bearer token
where the route says so, limits each token's rate, sends each request to the
less loaded of two replicas picked at random, retries only requests that never
reached a replica, holds requests while a service has no healthy replica, and
exports Prometheus metrics at /metrics. One gateway, elected through a Consul
lock, scales services with an autoscale block through Nomad's scale API.

Run it as a Nomad job: gpujob gateway render prints one.`,
		Example: `  gpujob gateway run --listen 127.0.0.1:8080
  gpujob gateway render --binary /usr/local/bin/gpujob | nomad job run -`,
	}
	cmd.AddCommand(newRunCmd(f), newRenderCmd(f))
	return cmd
}

type runOptions struct {
	listen        string
	id            string
	gatewayPrefix string
	noAutoscale   bool
}

func newRunCmd(f *factory.Factory) *cobra.Command {
	o := &runOptions{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run a gateway in the foreground until SIGTERM",
		Long: `Run serves the gateway on --listen. Routes and tokens live under
$GPUJOB_SERVICE_KEY_PREFIX (default gpujob/services) in Consul KV; the
gateways' own records (load reports, the autoscaling lock) under
--gateway-prefix. Consul is CONSUL_HTTP_ADDR and friends; Nomad (for scaling)
is NOMAD_ADDR, NOMAD_TOKEN and friends.`,
		Example: `  gpujob gateway run --listen 127.0.0.1:8080`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			return run(ctx, f, o)
		},
	}
	host, _ := os.Hostname()
	cmd.Flags().StringVar(&o.listen, "listen", "127.0.0.1:8080", "the `address` to serve on")
	cmd.Flags().StringVar(&o.id, "id", firstOf(os.Getenv("NOMAD_ALLOC_ID"), host+"-"+fmt.Sprint(os.Getpid())), "this gateway's `ID` in its load reports")
	cmd.Flags().StringVar(&o.gatewayPrefix, "gateway-prefix", servekv.DefaultGatewayPrefix, "the gateways' own Consul KV `prefix`")
	cmd.Flags().BoolVar(&o.noAutoscale, "no-autoscale", false, "never campaign to autoscale (route only)")
	return cmd
}

func run(ctx context.Context, f *factory.Factory, o *runOptions) error {
	logger := log.New(f.IO.ErrOut, "gateway: ", log.LstdFlags|log.Lmsgprefix)
	creds, err := loadCredentials(f.Consul)
	if err != nil {
		return err
	}
	c := creds.consul
	prefix := service.KeyPrefix()
	var reporter *autoscale.Reporter
	g, err := gw.New(gw.Config{
		Consul: c, Prefix: prefix, ID: o.id, Logf: logger.Printf,
		OnQueued: func(string, string) {
			if reporter != nil {
				reporter.Kick()
			}
		},
	})
	if err != nil {
		return err
	}
	reporter = autoscale.NewReporter(c, o.gatewayPrefix, o.id, g.Load, autoscale.DefaultReportInterval)
	reporter.Logf = logger.Printf

	l, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.listen, err)
	}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	start := func(name string, fn func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	var scaler *autoscale.Autoscaler
	if !o.noAutoscale {
		if scaler, err = autoscale.New(autoscale.Config{Consul: c, Prefix: prefix, GatewayPrefix: o.gatewayPrefix, ID: o.id,
			Scaler: &nomadScaler{clients: map[string]nomadapi.API{}, newClient: creds.nomad}, Logf: logger.Printf}); err != nil {
			l.Close()
			return err
		}
	}
	start("routes", g.Run)
	start("load reports", reporter.Run)
	if scaler != nil {
		start("autoscaler", scaler.Run)
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(l) }()
	logger.Printf("serving on %s (gateway %s, routes under %s, credentials from %s)", l.Addr(), o.id, prefix, creds.from)
	var failed error
	select {
	case <-ctx.Done():
	case failed = <-errs:
	case failed = <-serveErr:
	}
	// A stop: Nomad deregistered the gateway's service already (its
	// shutdown_delay); finish what is in flight, then leave Consul.
	shutdownCtx, done := context.WithTimeout(context.Background(), 20*time.Second)
	defer done()
	_ = srv.Shutdown(shutdownCtx)
	cancel()
	wg.Wait()
	if failed != nil && !errors.Is(failed, http.ErrServerClosed) {
		return failed
	}
	logger.Printf("stopped")
	return nil
}

// nomadScaler scales services through Nomad, with a client per namespace.
type nomadScaler struct {
	mu        sync.Mutex
	clients   map[string]nomadapi.API
	newClient func(ns string) (nomadapi.API, error)
}

func (s *nomadScaler) client(ns string) (nomadapi.API, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clients[ns]; ok {
		return c, nil
	}
	c, err := s.newClient(ns)
	if err != nil {
		return nil, err
	}
	s.clients[ns] = c
	return c, nil
}

func (s *nomadScaler) Count(_ context.Context, ns, jobID, group string) (int, error) {
	c, err := s.client(ns)
	if err != nil {
		return 0, err
	}
	job, err := c.Job(jobID)
	if err != nil {
		return 0, err
	}
	for _, g := range job.TaskGroups {
		if g.Name != nil && *g.Name == group && g.Count != nil {
			return *g.Count, nil
		}
	}
	return 0, fmt.Errorf("job %s/%s has no group %q", ns, jobID, group)
}

func (s *nomadScaler) Scale(_ context.Context, ns, jobID, group string, count int, reason string) error {
	c, err := s.client(ns)
	if err != nil {
		return err
	}
	_, err = c.ScaleGroup(jobID, group, count, "gpujob gateway: "+reason)
	if err != nil && strings.Contains(err.Error(), "blocked due to active deployment") {
		// Nomad's words (job_endpoint.go): it has no error code of its own.
		return fmt.Errorf("%w: %v", autoscale.ErrBusy, err)
	}
	return err
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if strings.TrimSpace(v) != "" {
			return v
		}
	}
	return ""
}
