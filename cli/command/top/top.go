// Package top is `gpujob top`: a live terminal view of the cluster — every
// GPU's utilisation, memory, temperature and power, the training jobs with
// their members, ranks, restarts and loss trend, the queue, the queues of
// the admission controller, the sweeps and the services' traffic — kept current by the observe.Watcher's blocking
// queries, with the GPU stats (samples Nomad cannot block on) read again on
// a timer.
package top

import (
	"context"
	"errors"
	"fmt"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gatewayclient"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/internal/servekv"
)

// Options is what the command's flags ask for.
type Options struct {
	Interval time.Duration
	Once     bool
	JSON     bool
	Gateway  string
	// GatewayAdmin is the gateway's admin listener (its /-/stats).
	GatewayAdmin string
	// Open starts reading the cluster; nil watches Nomad (and Consul, for
	// the sweeps) through the factory's clients. A test hands in a source
	// of its own here rather than through package state.
	Open Opener
}

// Opener starts reading the cluster for top: the source of its snapshots,
// the cluster's name for the header, and a channel closed once the first
// answers are in.
type Opener func(ctx context.Context, f *factory.Factory, o *Options) (src observe.Source, cluster string, ready <-chan struct{}, err error)

// NewCmd returns the top command.
func NewCmd(f *factory.Factory) *cobra.Command { return NewCmdWith(f, nil) }

// NewCmdWith is NewCmd running runF instead of the command when runF is not
// nil: a test checks the Options the arguments parse into without running.
func NewCmdWith(f *factory.Factory, runF func(context.Context, *Options) error) *cobra.Command {
	o := &Options{Interval: 2 * time.Second}
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Watch the cluster live: GPUs, training jobs, the queues, sweeps and services",
		Long: `Top is a live view of the cluster, refreshed as it changes (Nomad's blocking
queries) and every --interval for the GPU stats:

  GPUS      per node, one row per GPU: utilisation, memory used/total,
            temperature, power/limit, the allocation holding it; an
            unhealthy GPU is marked "!" and UNHEALTHY
  JOBS      training jobs: members running/total, ranks, rendezvous round,
            restarts used/budget, the mean of the ranks' latest losses and
            its trend; "LOW UTIL" flags GPUs under 80 % utilisation
  QUEUE     jobs with allocations Nomad has not placed, and for how long
  QUEUES    with a queue configuration (gpujob queue apply): each queue's
            quota, GPUs used (and borrowed beyond the quota), the jobs and
            GPUs waiting for admission, and the oldest wait
  SWEEPS    trials by state and the best objective so far
  SERVICES  the gateway's requests per second, p99 latency and errors

q, esc or ctrl-c quits. Without a terminal (or with --once) it prints one
frame as plain text; -json prints the snapshot as JSON.`,
		Example: `  gpujob top
  gpujob top --interval 5s
  gpujob top --once
  gpujob top -json | jq '.nodes[].gpus[] | select(.util_pct < 80)'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return run(ctx, f, o) })
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&o.Interval, "interval", o.Interval, "how often the GPU stats (and the gateway's figures) are read again")
	fl.BoolVar(&o.Once, "once", false, "print one frame as plain text and exit")
	fl.BoolVar(&o.JSON, "json", false, "print one snapshot as JSON and exit")
	fl.StringVar(&o.Gateway, "gateway", "", "the gpujob gateway's `URL` (default $"+gatewayclient.EnvGateway+", else "+gatewayclient.DefaultGateway+")")
	fl.StringVar(&o.GatewayAdmin, "gateway-admin", "", "the gateway's admin listener `URL`, for its figures (default $"+gatewayclient.EnvGatewayAdmin+
		", else the --gateway host on the port after its own; $"+gatewayclient.EnvGatewayAdminToken+" when it asks for a token)")
	return cmd
}

// watchCluster is the Opener top uses by default: an observe.Watcher on
// the factory's Nomad, and its Consul when there is one.
func watchCluster(ctx context.Context, f *factory.Factory, o *Options) (src observe.Source, cluster string, ready <-chan struct{}, err error) {
	nomad, err := f.Nomad()
	if err != nil {
		return nil, "", nil, err
	}
	cfg := observe.Config{Nomad: nomad, LossInterval: max(o.Interval, 5*time.Second)}
	if f.Consul != nil {
		// Sweeps and queues are optional: without Consul the view has
		// none (and a token that cannot read them is a warning).
		if c, err := f.Consul(); err == nil {
			cfg.Consul = c
		}
	}
	w := observe.NewWatcher(cfg)
	go func() { _ = w.Run(ctx) }()
	return w, nomad.Address(), w.Ready(), nil
}

func run(ctx context.Context, f *factory.Factory, o *Options) error {
	if o.Interval <= 0 {
		return fmt.Errorf("--interval must be positive, not %s", o.Interval)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	open := o.Open
	if open == nil {
		open = watchCluster
	}
	src, cluster, ready, err := open(ctx, f, o)
	if err != nil {
		return err
	}
	stats := GatewayStats(gatewayclient.AdminAddr(o.GatewayAdmin, gatewayclient.Addr(o.Gateway)))
	m := NewModel(src, stats, o.Interval)
	m.Cluster = cluster

	if o.JSON || o.Once || !f.IO.IsTTY {
		waitReady(ctx, ready, 10*time.Second)
		snap, err := src.Snapshot(ctx)
		if err != nil {
			return err
		}
		if o.JSON {
			return gpujobs.PrintJSON(f.IO.Out, snap)
		}
		m.plain = true
		m.apply(snap, nil)
		sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
		m.svc, m.svcErr = stats(sctx)
		scancel()
		_, err = fmt.Fprintln(f.IO.Out, m.frame(0, 0))
		return err
	}

	opts := []tea.ProgramOption{tea.WithContext(ctx), tea.WithAltScreen(), tea.WithOutput(f.IO.Out)}
	if f.IO.In != nil {
		opts = append(opts, tea.WithInput(f.IO.In))
	}
	_, err = tea.NewProgram(m, opts...).Run()
	if err != nil && errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		return nil // interrupted (SIGINT/SIGTERM): the terminal is restored
	}
	return err
}

// waitReady waits for the first answers, at most d.
func waitReady(ctx context.Context, ready <-chan struct{}, d time.Duration) {
	if ready == nil {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ready:
	case <-t.C:
	case <-ctx.Done():
	}
}

// GatewayStats reads the /-/stats of the gateway whose admin listener is at
// admin, like `gpujob service status`: its figures per service, by
// "<namespace>/<service>".
func GatewayStats(admin string) ServiceStats {
	return func(ctx context.Context) (map[string]servekv.Stats, error) {
		all, err := gatewayclient.StatsAt(ctx, admin)
		if err != nil {
			return nil, err
		}
		return all.Services, nil
	}
}
