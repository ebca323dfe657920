package service

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/queues"
	"github.com/gpujob/gpujob/cli/servicedeploy"
)

// StopOptions is what `service stop`'s arguments and flags ask for.
type StopOptions struct {
	// Name is the service (the argument).
	Name string
	// Purge also removes its tokens and the job's history.
	Purge bool
}

func newStopCmd(f *factory.Factory) *cobra.Command { return NewStopCmd(f, nil) }

// NewStopCmd is the command running runF instead when runF is not nil: a
// test checks the Options the arguments parse into without running.
func NewStopCmd(f *factory.Factory, runF func(context.Context, *StopOptions) error) *cobra.Command {
	o := &StopOptions{}
	cmd := &cobra.Command{
		Use:   "stop NAME",
		Short: "Stop a service: its route first, then its replicas",
		Long: `Stop removes the service's gateway route (the gateways answer 404 for it
from then on) and stops its Nomad job; each replica leaves Consul before it
is signalled. Its tokens are kept for a later deploy; --purge also removes
them and the job's history. A service that went through a queue (queue
mode) has its queue record deleted first: one still waiting is withdrawn,
and the admission controller does not queue a stopped one again.`,
		Example: `  gpujob service stop bert-clf
  gpujob service stop --purge bert-clf`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runStop(ctx, f, o) })
		},
	}
	cmd.Flags().BoolVar(&o.Purge, "purge", false, "also remove the service's tokens and the job's history")
	return cmd
}

func runStop(ctx context.Context, f *factory.Factory, o *StopOptions) error {
	nomad, store, err := clients(f)
	if err != nil {
		return err
	}
	// Its queue record first (queue mode): the admission controller then
	// neither starts a queued service nor requeues a stopped one.
	withdrawn, err := queues.Stop(ctx, f, o.Name, f.IO.Out)
	if err != nil {
		fmt.Fprintf(f.IO.ErrOut, "warning: its queue record could not be read (%v); if it went through a queue, stop it again once Consul answers\n", err)
	}
	st, err := servicedeploy.Stop(ctx, nomad, store, f.Namespace(), o.Name, o.Purge)
	if withdrawn && st.Orphan {
		if err := queues.StopAdmittedMeanwhile(nomad, o.Name, f.IO.Out); err != nil {
			return err
		}
	}
	if st.Orphan {
		// Said even when purging its tokens failed: the route is gone.
		fmt.Fprintf(f.IO.Out, "%s has no job in Nomad; removed its route\n", o.Name)
	}
	if err != nil || st.Orphan {
		return err
	}
	what := "stopped"
	if o.Purge {
		what = "stopped and purged (tokens too)"
	}
	fmt.Fprintf(f.IO.Out, "%s %s, evaluation %s\n", what, o.Name, firstOf(shortOr(st.EvalID), "-"))
	return nil
}

func shortOr(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
