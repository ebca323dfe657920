package sweep

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/sweepops"
)

// StopOptions is what `sweep stop`'s arguments and flags ask for.
type StopOptions struct {
	// Name is the sweep (the argument).
	Name string
	// Purge also removes the sweep's jobs and its records in Consul.
	Purge bool
}

func newStopCmd(f *factory.Factory) *cobra.Command { return NewStopCmd(f, nil) }

// NewStopCmd is the command running runF instead when runF is not nil: a
// test checks the Options the arguments parse into without running.
func NewStopCmd(f *factory.Factory, runF func(context.Context, *StopOptions) error) *cobra.Command {
	o := &StopOptions{}
	cmd := &cobra.Command{
		Use:   "stop SWEEP",
		Short: "Stop a sweep and its trials; --purge also removes its jobs and records",
		Long: `Stop asks the sweep's controller to stop every running trial (each trial's
task event says it was stopped by gpujob sweep stop) and waits until it has.
If no controller runs, stop stops the trials' jobs itself. The results stay
in Consul: gpujob sweep status and best still show them, and extend can
continue the sweep.

--purge then removes everything the sweep made: the controller's and the
trials' Nomad jobs, and the sweep's records in Consul.`,
		Example: `  gpujob sweep stop toy-lr
  gpujob sweep stop --purge toy-lr`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runStop(ctx, f, o) })
		},
	}
	cmd.Flags().BoolVar(&o.Purge, "purge", false, "also remove the sweep's jobs and its records in Consul")
	return cmd
}

func runStop(ctx context.Context, f *factory.Factory, o *StopOptions) error {
	e, err := newEnv(f, true)
	if err != nil {
		return err
	}
	out := f.IO.Out
	p, err := e.sweeps().Stop(ctx, o.Name, o.Purge, func(ev sweepops.StopEvent) { printStopEvent(out, o.Name, ev) })
	if err != nil || p == nil {
		return err
	}
	what := " and its records in Consul"
	if p.Revoked {
		what = ", its records in Consul and its controller's ACL tokens and policies"
	}
	fmt.Fprintf(out, "purged sweep %s: its controller, %d trial job(s)%s\n", o.Name, p.TrialJobs, what)
	return nil
}

// printStopEvent says a step of the stop of sweep name as it happens.
func printStopEvent(w io.Writer, name string, ev sweepops.StopEvent) {
	switch ev.Step {
	case sweepops.StopEnded:
		fmt.Fprintf(w, "sweep %s had already ended (%s)\n", name, ev.Status)
	case sweepops.StopAsked:
		fmt.Fprintf(w, "asked the controller of sweep %s to stop its trials; waiting (up to %s)\n", name, sweepops.StopWait)
	case sweepops.StopTimedOut:
		fmt.Fprintf(w, "the controller did not finish in %s; stopping the trials here\n", sweepops.StopWait)
	case sweepops.StopDone:
		fmt.Fprintf(w, "sweep %s stopped: %s\n", name, countsText(ev.Counts))
	}
}
