package service

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/servicedeploy"
)

// ScaleOptions is what `service scale`'s arguments ask for.
type ScaleOptions struct {
	// Name is the service (the first argument).
	Name string
	// Count is the replica count (the second argument), 0 or more.
	Count int
}

func newScaleCmd(f *factory.Factory) *cobra.Command { return NewScaleCmd(f, nil) }

// NewScaleCmd is the command running runF instead when runF is not nil: a
// test checks the Options the arguments parse into without running.
func NewScaleCmd(f *factory.Factory, runF func(context.Context, *ScaleOptions) error) *cobra.Command {
	o := &ScaleOptions{}
	cmd := &cobra.Command{
		Use:   "scale NAME COUNT",
		Short: "Set a service's replica count (within its replicas { min max })",
		Long: `Scale sets the number of replicas through Nomad's scale API. The count must
lie within the spec's replicas { min max }. A service that autoscales moves
away from it again as the load says.`,
		Example: `  gpujob service scale bert-clf 3
  gpujob service scale bert-clf 0     # with replicas { min = 0 }`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 0 {
				return fmt.Errorf("COUNT must be a whole number of replicas, 0 or more, not %q", args[1])
			}
			o.Name, o.Count = args[0], n
			return cmdutil.Run(cmd.Context(), o, runF, func(context.Context) error { return runScale(f, o) })
		},
	}
	return cmd
}

func runScale(f *factory.Factory, o *ScaleOptions) error {
	nomad, err := f.Nomad()
	if err != nil {
		return err
	}
	sc, err := servicedeploy.Scale(nomad, o.Name, o.Count)
	if err != nil {
		return err
	}
	if sc.EvalID == "" {
		fmt.Fprintf(f.IO.Out, "%s runs %d replica(s) already\n", o.Name, o.Count)
		return nil
	}
	fmt.Fprintf(f.IO.Out, "scaled %s from %d to %d replica(s), evaluation %s\n", o.Name, sc.Was, sc.Count, gpujobs.ShortID(sc.EvalID))
	return nil
}
