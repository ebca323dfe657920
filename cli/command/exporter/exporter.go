// Package exporter is `gpujob exporter`: the Prometheus exporter of the
// cluster's GPUs (under DCGM exporter names), training jobs, queue and
// sweeps (cli/observe/metrics), and the Nomad system job that runs it.
package exporter

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/cli/observe/metrics"
	"github.com/gpujob/gpujob/cli/render"
)

// NewCmd returns the exporter command and its subcommands.
func NewCmd(f *factory.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "exporter",
		Short: "Export the cluster's GPUs, training jobs, queues and sweeps to Prometheus",
		Long: `The exporter serves Prometheus metrics at /metrics: every GPU under the names
and labels of NVIDIA's DCGM exporter (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED,
... with gpu, UUID, device, modelName, Hostname), so dashboards written for it
work unchanged, plus the Nomad job, namespace and allocation holding each GPU;
and gpujob's own series: training jobs' members by state, group restarts,
rendezvous rounds and their duration, the latest loss per rank; the jobs
waiting for GPUs and for how long; with a queue configuration, each queue's
quota, used and borrowed GPUs, waiting jobs and oldest wait, and the
admission controller's admissions, preemptions, refusals and admission
latency; sweeps' trials by state and best value; GPU health changes.

It learns the cluster from Nomad (and the sweeps and queues from Consul) with
blocking queries, and reads the GPU stats once per node per scrape, never once
per GPU.

Run it as a Nomad system job (gpujob exporter render): each exporter reports its
own node's GPUs; the one on the lowest node ID among the running exporters
also reports the cluster-wide series, so that they are not counted once per
node. jobspecs/monitoring/ has alert rules and a Grafana dashboard for them.`,
		Example: `  gpujob exporter run --listen 127.0.0.1:9400
  gpujob exporter render --binary /usr/local/bin/gpujob | nomad job run -
  curl -s 127.0.0.1:9400/metrics | grep DCGM_FI_DEV_GPU_UTIL`,
	}
	cmd.AddCommand(newRunCmd(f), newRenderCmd(f))
	return cmd
}

type runOptions struct {
	listen       string
	node         string
	cluster      string
	lossInterval time.Duration
}

func newRunCmd(f *factory.Factory) *cobra.Command {
	o := &runOptions{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Serve the metrics in the foreground until SIGTERM",
		Long: `Run serves /metrics and /-/healthz on --listen. Nomad is NOMAD_ADDR and friends;
Consul (for the sweeps and queues; optional) CONSUL_HTTP_ADDR and friends.

--node limits the GPU series to one node (a system job passes its own);
--cluster says who reports the cluster-wide series: always, never, or auto
(the default): inside a Nomad allocation, the exporter of this job on the
lowest node ID among its running allocations; outside one, always.`,
		Example: `  gpujob exporter run --listen 127.0.0.1:9400
  gpujob exporter run --listen :9400 --node "$(nomad node status -self -t '{{.ID}}')" --cluster never`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			return run(ctx, f, o)
		},
	}
	cmd.Flags().StringVar(&o.listen, "listen", "127.0.0.1:9400", "the `address` to serve on")
	cmd.Flags().StringVar(&o.node, "node", "", "report only this node's GPUs (its `ID`); default all")
	cmd.Flags().StringVar(&o.cluster, "cluster", "auto", "report the cluster-wide series: `auto`, always or never")
	cmd.Flags().DurationVar(&o.lossInterval, "loss-interval", 15*time.Second,
		"how often the running training members' logs are read for their loss (0: never)")
	return cmd
}

func run(ctx context.Context, f *factory.Factory, o *runOptions) error {
	switch o.cluster {
	case "auto", "always", "never":
	default:
		return fmt.Errorf("--cluster: must be auto, always or never, got %q", o.cluster)
	}
	creds, err := loadCredentials(f)
	if err != nil {
		return err
	}
	logger := log.New(f.IO.ErrOut, "gpujob exporter: ", log.LstdFlags)
	reg := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpujob_exporter_requests_total",
		Help: "Requests the exporter made to Nomad and Consul, by endpoint.",
	}, []string{"endpoint"})
	cfg := observe.Config{Nomad: creds.nomad, NodeID: o.node, LossInterval: o.lossInterval,
		Requests: func(e string) { requests.WithLabelValues(e).Inc() }, Logf: logger.Printf}
	if creds.consulErr == nil {
		cfg.Consul = creds.consul
	} else {
		logger.Printf("no sweeps and no queues: %v", creds.consulErr)
	}
	w := observe.NewWatcher(cfg)
	elect := clusterRole(o.cluster, w)
	reg.MustRegister(requests, metrics.New(metrics.Options{Source: w, Cluster: elect}),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	l, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.listen, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: logger, Timeout: 20 * time.Second}))
	mux.HandleFunc("/-/healthz", func(rw http.ResponseWriter, r *http.Request) {
		select {
		case <-w.Ready():
			fmt.Fprintln(rw, "ok")
		default:
			http.Error(rw, "waiting for the first answers from Nomad", http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(rw, r)
			return
		}
		fmt.Fprintln(rw, "gpujob exporter: metrics at /metrics")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = w.Run(ctx) }()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(l) }()
	logger.Printf("serving on %s (node %s, cluster series: %s, credentials from %s)", l.Addr(), firstOf(o.node, "all"), o.cluster, creds.from)
	var failed error
	select {
	case <-ctx.Done():
	case failed = <-serveErr:
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = srv.Shutdown(sctx)
	cancel()
	wg.Wait()
	if failed != nil && !errors.Is(failed, http.ErrServerClosed) {
		return failed
	}
	return nil
}

// clusterRole answers whether this exporter reports the cluster-wide
// series now.
func clusterRole(mode string, w *observe.Watcher) func() bool {
	alloc, job, ns := os.Getenv("NOMAD_ALLOC_ID"), os.Getenv("NOMAD_JOB_ID"), os.Getenv("NOMAD_NAMESPACE")
	switch {
	case mode == "always", mode == "auto" && alloc == "":
		return func() bool { return true }
	case mode == "never":
		return func() bool { return false }
	}
	return func() bool { return w.Elected(ns, job, alloc) }
}

func firstOf(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// forwarded is the environment the exporter job passes on (addresses and
// TLS files; never a token, which a job's env shows to all who read it).
var forwarded = []string{"CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL", "CONSUL_CACERT", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY",
	"NOMAD_ADDR", "NOMAD_CACERT", "NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY", "GPUJOB_SWEEP_KEY_PREFIX"}

// fromVariable reports whether, with --secrets, the exporters get what the
// environment variable k gives some other way: Consul's TLS material from
// the variable, Nomad through their Task API socket.
func fromVariable(k string) bool {
	switch k {
	case "CONSUL_CACERT", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY",
		"NOMAD_ADDR", "NOMAD_CACERT", "NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY":
		return true
	}
	return false
}

func newRenderCmd(f *factory.Factory) *cobra.Command {
	e := render.Exporter{}
	cmd := &cobra.Command{
		Use:   "render",
		Short: "Print the Nomad system job that runs an exporter on every node",
		Long: `Render prints a Nomad system job running gpujob exporter on every node (raw_exec,
as nobody, on the static --port: 9400, the DCGM exporter's), registered in
Consul as gpujob-exporter with a check on /-/healthz, for Prometheus to find
with consul_sd_configs (jobspecs/monitoring/prometheus.yml). It passes on the
Nomad and Consul addresses and TLS files of this environment, never a token.

On a cluster with ACLs or TLS, --secrets has the exporters read their Nomad and
Consul tokens and Consul's TLS material from the Nomad variable
nomad/jobs/gpujob-exporter (items nomad_token, consul_token, consul_ca_pem,
consul_cert_pem, consul_key_pem, each optional) with their workload identity,
hold them in memory, read Nomad through their Task API socket, and run as the
user gpujob-exporter (no workload may run as the user that holds the tokens).
The tokens need the read-only policies gpujob acl policy nomad-exporter and
consul-exporter print.`,
		Example: `  gpujob exporter render --binary /usr/local/bin/gpujob | nomad job run -
  nomad var put nomad/jobs/gpujob-exporter nomad_token=... consul_token=...
  gpujob exporter render --secrets | nomad job run -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if e.Binary == "" {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("--binary: %w", err)
				}
				e.Binary, _ = filepath.Abs(exe)
			}
			e.Env = map[string]string{}
			for _, k := range forwarded {
				if v := os.Getenv(k); v != "" && !(e.Secrets && fromVariable(k)) {
					e.Env[k] = v
				}
			}
			if e.Namespace == "" {
				e.Namespace = strings.TrimSpace(os.Getenv("NOMAD_NAMESPACE"))
			}
			out, err := render.ExporterJobspec(e)
			if err != nil {
				return err
			}
			_, err = f.IO.Out.Write(out)
			return err
		},
	}
	cmd.Flags().StringVar(&e.Binary, "binary", "", "the gpujob `path` on the clients (default: this executable)")
	cmd.Flags().IntVar(&e.Port, "port", render.DefaultExporterPort, "the static `port` they listen on (0: one Nomad picks per node)")
	cmd.Flags().StringVar(&e.User, "user", "", "the `user` they run as (default nobody; "+render.DefaultExporterUser(true)+" with --secrets)")
	cmd.Flags().BoolVar(&e.Secrets, "secrets", false,
		"read the exporters' tokens and TLS files from the Nomad variable "+render.ExporterVariable+" (a cluster with ACLs or TLS)")
	cmd.Flags().StringSliceVar(&e.Datacenters, "datacenters", nil, "datacenters to run in (default all)")
	cmd.Flags().StringVar(&e.NodePool, "node-pool", "", "node pool to run in")
	return cmd
}
