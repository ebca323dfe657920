package service

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/servicedeploy"
	"github.com/gpujob/gpujob/internal/contract"
)

// RollbackOptions is what `service rollback`'s arguments and flags ask for.
type RollbackOptions struct {
	// Name is the service (the argument).
	Name string
	// ToVersion is the Nomad job version to go back to; -1 (the default)
	// lets rollback pick the newest stable one serving another version.
	ToVersion int64
	Detach    bool
}

func newRollbackCmd(f *factory.Factory) *cobra.Command { return NewRollbackCmd(f, nil) }

// NewRollbackCmd is the command running runF instead when runF is not nil:
// a test checks the Options the arguments parse into without running.
func NewRollbackCmd(f *factory.Factory, runF func(context.Context, *RollbackOptions) error) *cobra.Command {
	o := &RollbackOptions{}
	cmd := &cobra.Command{
		Use:   "rollback NAME",
		Short: "Roll a service back to its previous good version",
		Long: `Rollback makes an earlier job version of the service current again and
follows the rolling update to it. Without --to-version it picks the newest
stable version (one whose deployment succeeded) that serves another version
than the current one.`,
		Example: `  gpujob service rollback bert-clf
  gpujob service rollback bert-clf --to-version 3`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runRollback(ctx, f, o) })
		},
	}
	cmd.Flags().Int64Var(&o.ToVersion, "to-version", -1, "the Nomad job `version` to go back to")
	cmd.Flags().BoolVar(&o.Detach, "detach", false, "return once the rollback is registered")
	return cmd
}

func runRollback(ctx context.Context, f *factory.Factory, o *RollbackOptions) error {
	nomad, store, err := clients(f)
	if err != nil {
		return err
	}
	rb, err := servicedeploy.Rollback(ctx, nomad, store, o.Name, o.ToVersion)
	if err != nil {
		return err
	}
	if rb.RouteErr != nil {
		fmt.Fprintf(f.IO.ErrOut, "gpujob: the gateway route stays as it was: %v\n", rb.RouteErr)
	}
	label := rb.Target.Meta[contract.MetaVersion]
	fmt.Fprintf(f.IO.Out, "rolling %s back to %s (job version %d), evaluation %s\n",
		o.Name, label, deref(rb.Target.Version), shortOr(rb.EvalID))
	if o.Detach {
		return nil
	}
	if err := servicedeploy.AwaitRollback(ctx, nomad, o.Name, progressTo(f.IO.Out, false)); err != nil {
		return &cmdutil.ExitError{Code: 1, Err: err}
	}
	fmt.Fprintf(f.IO.Out, "%s serves %s again\n", o.Name, label)
	return nil
}
