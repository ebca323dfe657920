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
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/servestore"
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
less loaded of two replicas picked at random (only replicas Nomad says are
the route's job's), retries only requests that never reached a replica,
holds requests while a service has no healthy replica, and exports Prometheus
metrics at /metrics on its admin listener. One gateway, elected through a
Consul lock, scales services with an autoscale block through Nomad's scale
API: only the job that claims the route.

Run it as a Nomad job: gpujob gateway render prints one.`,
		Example: `  gpujob gateway run --listen 127.0.0.1:8080
  gpujob gateway render --binary /usr/local/bin/gpujob | nomad job run -`,
	}
	cmd.AddCommand(newRunCmd(f), newRenderCmd(f))
	return cmd
}

type runOptions struct {
	listen         string
	adminListen    string
	adminTokenFile string
	id             string
	gatewayPrefix  string
	noAutoscale    bool
	memoryLimit    sizeFlag

	maxBody        sizeFlag
	maxBuffered    sizeFlag
	bodyMinRate    sizeFlag
	maxHeaderBytes sizeFlag
	maxInflight    int
	maxLimiters    int
	bodyGrace      time.Duration
	readHeader     time.Duration
	idle           time.Duration
	writeIdle      time.Duration
}

func newRunCmd(f *factory.Factory) *cobra.Command {
	o := &runOptions{
		maxBody: sizeFlag(gw.DefaultMaxBodyBytes), maxBuffered: sizeFlag(gw.DefaultMaxBufferedBytes),
		bodyMinRate: sizeFlag(gw.DefaultBodyMinRate), maxHeaderBytes: sizeFlag(gw.DefaultMaxHeaderBytes),
	}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run a gateway in the foreground until SIGTERM",
		Long: `Run serves the gateway on --listen, and its metrics (/metrics) and figures
per service (/-/stats) on --admin-listen: loopback unless an admin token
guards it (--admin-token-file, or the admin_token item of the gateway's
variable). Routes and tokens live under $GPUJOB_SERVICE_KEY_PREFIX (default
gpujob/services) in Consul KV; the gateways' own records (load reports, the
autoscaling lock) under --gateway-prefix. Consul is CONSUL_HTTP_ADDR and
friends; Nomad (replica admission and scaling) is NOMAD_ADDR, NOMAD_TOKEN and
friends.

A gateway sends a route's requests only to the Consul instances that Nomad
says are running allocations of the route's job, a job that claims the route
in its meta (gpujob service deploy writes both). It degrades instead of
falling over: past --max-inflight requests, or --max-buffered bytes of
request bodies, a request gets 503 with Retry-After; a client slower than
--read-header-timeout for its headers, or than --body-min-rate (after
--body-grace) for its body, is cut off; so is one that reads nothing of an
answer for --write-idle-timeout.`,
		Example: `  gpujob gateway run --listen 127.0.0.1:8080
  gpujob gateway run --listen :8080 --admin-listen 10.0.0.5:8081 --admin-token-file /etc/gpujob/admin.token`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			return run(ctx, f, o)
		},
	}
	host, _ := os.Hostname()
	fl := cmd.Flags()
	fl.StringVar(&o.listen, "listen", "127.0.0.1:8080", "the `address` to serve on")
	fl.StringVar(&o.adminListen, "admin-listen", "", "the `address` of /metrics and /-/stats (default: loopback, on the port after --listen's)")
	fl.StringVar(&o.adminTokenFile, "admin-token-file", "", "a `file` holding the bearer token the admin listener asks for (needed beyond loopback)")
	fl.StringVar(&o.id, "id", firstOf(os.Getenv("NOMAD_ALLOC_ID"), host+"-"+fmt.Sprint(os.Getpid())), "this gateway's `ID` in its load reports")
	fl.StringVar(&o.gatewayPrefix, "gateway-prefix", servekv.DefaultGatewayPrefix, "the gateways' own Consul KV `prefix`")
	fl.BoolVar(&o.noAutoscale, "no-autoscale", false, "never campaign to autoscale (route only)")
	fl.Var(&o.maxBody, "max-body", "the largest request body of a route that sets no route.max_body (`size`, e.g. 10MiB)")
	fl.IntVar(&o.maxInflight, "max-inflight", gw.DefaultMaxInflight, "routed requests served at once, held ones included; past it, 503")
	fl.Var(&o.maxBuffered, "max-buffered", "request bodies held in memory at once (`size`); past it, 503; no body may be over 7/8 of it")
	fl.Var(&o.bodyMinRate, "body-min-rate", "the slowest a request body may arrive, after --body-grace (`size` a second)")
	fl.DurationVar(&o.bodyGrace, "body-grace", gw.DefaultBodyGrace, "the longest pause in a request body, and its start before --body-min-rate applies")
	fl.IntVar(&o.maxLimiters, "max-limiters", gw.DefaultMaxLimiters, "rate limiters kept (per token, or per client address); past it, new clients share one per route")
	fl.DurationVar(&o.readHeader, "read-header-timeout", gw.DefaultReadHeaderTimeout, "the longest a client may take to send a request's headers")
	fl.DurationVar(&o.idle, "idle-timeout", gw.DefaultIdleTimeout, "the longest a keep-alive connection may idle")
	fl.Var(&o.maxHeaderBytes, "max-header-bytes", "the largest request headers (`size`); larger ones get 431")
	fl.DurationVar(&o.writeIdle, "write-idle-timeout", gw.DefaultWriteIdleTimeout, "the longest a client may leave an answer unread before it is cut off")
	fl.Var(&o.memoryLimit, "memory-limit", "the Go runtime's soft memory limit (`size`; 0: $GOMEMLIMIT, else none)")
	return cmd
}

// adminAddress is --admin-listen, else loopback on the port after
// --listen's (a port 0 stays 0).
func adminAddress(listen, admin string) (string, error) {
	if admin != "" {
		return admin, nil
	}
	_, portS, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("--listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portS)
	if err != nil {
		return "", fmt.Errorf("--listen %q: the port is not a number; set --admin-listen", listen)
	}
	if port != 0 {
		port++
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// checkAdminExposure refuses an admin listener beyond loopback without a
// token: its metrics and stats name every tenant's services and traffic.
func checkAdminExposure(addr, token string) error {
	if token != "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--admin-listen %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("--admin-listen %s is not a loopback address, and no admin token guards it: its metrics and stats "+
		"name every tenant's services and traffic; listen on 127.0.0.1, or set a token (--admin-token-file, or the %s item "+
		"of the variable %s)", addr, itemAdminToken, render.GatewayVariable)
}

func run(ctx context.Context, f *factory.Factory, o *runOptions) error {
	logger := log.New(f.IO.ErrOut, "gateway: ", log.LstdFlags|log.Lmsgprefix)
	creds, err := loadCredentials(f.Consul)
	if err != nil {
		return err
	}
	adminToken := creds.adminToken
	if o.adminTokenFile != "" {
		b, err := os.ReadFile(o.adminTokenFile)
		if err != nil {
			return fmt.Errorf("--admin-token-file: %w", err)
		}
		if adminToken = strings.TrimSpace(string(b)); adminToken == "" {
			return fmt.Errorf("--admin-token-file %s is empty", o.adminTokenFile)
		}
	}
	adminAddr, err := adminAddress(o.listen, o.adminListen)
	if err != nil {
		return err
	}
	if err := checkAdminExposure(adminAddr, adminToken); err != nil {
		return err
	}
	if o.memoryLimit > 0 {
		debug.SetMemoryLimit(int64(o.memoryLimit))
	}
	c := creds.consul
	nomad := newNomadClients(creds.nomad)
	prefix := servestore.KeyPrefix()
	var reporter *autoscale.Reporter
	g, err := gw.New(gw.Config{
		Consul: c, Nomad: nomad, Prefix: prefix, ID: o.id, Logf: logger.Printf,
		OnQueued: func(string, string) {
			if reporter != nil {
				reporter.Kick()
			}
		},
		MaxBodyBytes: int64(o.maxBody), MaxInflight: o.maxInflight, MaxBufferedBytes: int64(o.maxBuffered),
		BodyMinRate: int64(o.bodyMinRate), BodyGrace: o.bodyGrace, MaxLimiters: o.maxLimiters,
		ReadHeaderTimeout: o.readHeader, IdleTimeout: o.idle, MaxHeaderBytes: int(o.maxHeaderBytes), WriteIdleTimeout: o.writeIdle,
	})
	if err != nil {
		return flagError(err)
	}
	reporter = autoscale.NewReporter(c, o.gatewayPrefix, o.id, g.Load, autoscale.DefaultReportInterval)
	reporter.Logf = logger.Printf

	l, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listening on %s (--listen): %w", o.listen, err)
	}
	al, err := net.Listen("tcp", adminAddr)
	if err != nil {
		l.Close()
		return fmt.Errorf("listening on %s (--admin-listen): %w", adminAddr, err)
	}
	srv, adminSrv := g.Server(), g.AdminServer(adminToken)
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
			Scaler: nomad, Logf: logger.Printf}); err != nil {
			l.Close()
			al.Close()
			return err
		}
	}
	start("routes", g.Run)
	start("load reports", reporter.Run)
	if scaler != nil {
		start("autoscaler", scaler.Run)
	}
	serveErr := make(chan error, 2)
	go func() { serveErr <- srv.Serve(l) }()
	go func() { serveErr <- adminSrv.Serve(al) }()
	guard := "loopback only"
	if adminToken != "" {
		guard = "behind its admin token"
	}
	logger.Printf("serving on %s, admin on %s (%s) (gateway %s, routes under %s, credentials from %s)",
		l.Addr(), al.Addr(), guard, o.id, prefix, creds.from)
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
	_ = adminSrv.Shutdown(shutdownCtx)
	cancel()
	wg.Wait()
	if failed != nil && !errors.Is(failed, http.ErrServerClosed) {
		return failed
	}
	logger.Printf("stopped")
	return nil
}

// flagError names the flag of a gateway.Config field New refused.
func flagError(err error) error {
	for field, flag := range map[string]string{
		"MaxBodyBytes": "--max-body", "MaxInflight": "--max-inflight", "MaxBufferedBytes": "--max-buffered",
		"BodyMinRate": "--body-min-rate", "BodyGrace": "--body-grace", "MaxLimiters": "--max-limiters",
		"ReadHeaderTimeout": "--read-header-timeout", "IdleTimeout": "--idle-timeout",
		"MaxHeaderBytes": "--max-header-bytes", "WriteIdleTimeout": "--write-idle-timeout",
	} {
		if strings.Contains(err.Error(), field+" ") {
			return fmt.Errorf("%s: %w", flag, err)
		}
	}
	return err
}

// sizeFlag is a byte count flag: "10MiB", "512KiB", "65536".
type sizeFlag int64

func (s *sizeFlag) String() string { return servekv.FormatSize(int64(*s)) }
func (s *sizeFlag) Type() string   { return "size" }
func (s *sizeFlag) Set(v string) error {
	n, err := servekv.ParseSize(v)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if strings.TrimSpace(v) != "" {
			return v
		}
	}
	return ""
}
