package service

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gatewayclient"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/queues"
	"github.com/gpujob/gpujob/cli/servicedeploy"
)

// StatusOptions is what `service status`' arguments and flags ask for.
type StatusOptions struct {
	// Name is the service (the argument).
	Name    string
	JSON    bool
	Gateway string
	// GatewayAdmin is the gateway's admin listener, for the traffic
	// figures.
	GatewayAdmin string
}

func newStatusCmd(f *factory.Factory) *cobra.Command { return NewStatusCmd(f, nil) }

// NewStatusCmd is the command running runF instead when runF is not nil: a
// test checks the Options the arguments parse into without running.
func NewStatusCmd(f *factory.Factory, runF func(context.Context, *StatusOptions) error) *cobra.Command {
	o := &StatusOptions{}
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: "Show a service's replicas by version and health, its deployment and its traffic",
		Long: `Status shows the service's replicas (version, node, Nomad status and Consul
health), the deployment in progress or the last one (canaries, promotion),
the endpoint URL at the gateway, and the gateway's figures for the service:
requests per second, p50 and p99 latency, requests in flight and held.`,
		Example: `  gpujob service status bert-clf
  gpujob service status bert-clf -json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runStatus(ctx, f, o) })
		},
	}
	cmd.Flags().BoolVar(&o.JSON, "json", false, "print as JSON")
	addGatewayFlag(cmd, &o.Gateway)
	cmd.Flags().StringVar(&o.GatewayAdmin, "gateway-admin", "",
		"the gateway's admin `URL`, for the traffic figures (default $"+gatewayclient.EnvGatewayAdmin+", else the --gateway host on the port after its own)")
	return cmd
}

// Status is `service status`' view, also its -json.
type Status = servicedeploy.Status

func runStatus(ctx context.Context, f *factory.Factory, o *StatusOptions) error {
	nomad, store, err := clients(f)
	if err != nil {
		return err
	}
	gw := gatewayclient.Addr(o.Gateway)
	st, err := servicedeploy.ReadStatus(ctx, nomad, store, servicedeploy.StatusRequest{Name: o.Name,
		Namespace: f.Namespace(), Gateway: gw, Admin: gatewayclient.AdminAddr(o.GatewayAdmin, gw)})
	entry, _ := queues.Lookup(ctx, f, o.Name)
	switch {
	case err != nil && (entry == nil || entry.State() == "admitted" || entry.State() == "preempted"):
		return err
	case err != nil:
		// Still in its queue: no Nomad job yet.
		state := "queued"
		if entry.State() == "refused" {
			state = "refused"
		}
		st = &Status{Service: o.Name, Namespace: entry.Record.Namespace, JobStatus: state, Desired: entry.Record.Members}
	}
	if entry != nil {
		st.Queue, st.QueueLine = entry.Info(), entry.Line(f.Now())
	}
	if o.JSON {
		return gpujobs.PrintJSON(f.IO.Out, st)
	}
	return printStatus(f.IO.Out, st)
}

func printStatus(w io.Writer, st *Status) error {
	fmt.Fprintf(w, "service    %s (namespace %s)\n", st.Service, st.Namespace)
	if st.QueueLine != "" {
		fmt.Fprintf(w, "queue      %s\n", st.QueueLine)
	}
	if st.JobStatus == "queued" || st.JobStatus == "refused" {
		fmt.Fprintf(w, "replicas   %d, started together when all fit (gpujob service stop %s withdraws it)\n", st.Desired, st.Service)
		return nil
	}
	fmt.Fprintf(w, "version    %s (job version %d), job %s\n", st.Version, st.JobVersion, st.JobStatus)
	fmt.Fprintf(w, "replicas   %d healthy of %d desired (bounds %d-%d)\n", st.Healthy, st.Desired, st.Min, st.Max)
	for _, v := range st.Versions {
		fmt.Fprintf(w, "           %s: %d running, %d healthy\n", firstOf(v.Version, "?"), v.Running, v.Healthy)
	}
	if d := st.Deployment; d != nil {
		fmt.Fprintf(w, "deployment %s\n", strings.TrimPrefix(d.Line, "deployment "))
	}
	fmt.Fprintf(w, "endpoint   %s\n", st.Endpoint)
	if t := st.Traffic; t != nil {
		fmt.Fprintf(w, "traffic    %.1f req/s, p50 %.1f ms, p99 %.1f ms, %d in flight, %d held (last %s)\n",
			t.RPS, t.P50Ms, t.P99Ms, t.Inflight, t.Queued, firstOf(t.Window, "minute"))
	} else if st.TrafficError != "" {
		fmt.Fprintf(w, "traffic    unknown: %s\n", st.TrafficError)
	}
	if len(st.Replicas) == 0 {
		fmt.Fprintln(w, "\nno replica runs")
		return nil
	}
	fmt.Fprintln(w)
	t := gpujobs.NewTable(w, "ALLOC", "NAME", "VERSION", "STATUS", "HEALTH", "CANARY", "NODE", "ADDRESS")
	for _, r := range st.Replicas {
		canary := ""
		if r.Canary {
			canary = "yes"
		}
		t.Row(gpujobs.ShortID(r.Alloc), r.Name, r.Version, r.Status, r.Health, canary, r.Node, r.Address)
	}
	return t.Flush()
}
