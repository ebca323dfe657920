package service

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/servicedeploy"
)

func newScaleCmd(f *factory.Factory) *cobra.Command {
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
			nomad, err := f.Nomad()
			if err != nil {
				return err
			}
			job, err := loadService(nomad, args[0])
			if err != nil {
				return err
			}
			g := servicedeploy.Group(job)
			if g == nil {
				return fmt.Errorf("service %s has no %q group; was it deployed by gpujob?", args[0], render.ServiceGroup)
			}
			if p := g.Scaling; p != nil && p.Min != nil && p.Max != nil && (int64(n) < *p.Min || int64(n) > *p.Max) {
				return fmt.Errorf("service %s runs %d to %d replicas (its replicas { min max }); %d is outside; change the spec and deploy to widen it",
					args[0], *p.Min, *p.Max, n)
			}
			was := deref(g.Count)
			if was == n {
				// A scale to the same count is still a new job version
				// and deployment in Nomad: skip it.
				fmt.Fprintf(f.IO.Out, "%s runs %d replica(s) already\n", args[0], n)
				return nil
			}
			reg, err := nomad.ScaleGroup(args[0], render.ServiceGroup, n, "gpujob service scale")
			if err != nil {
				return err
			}
			fmt.Fprintf(f.IO.Out, "scaled %s from %d to %d replica(s), evaluation %s\n", args[0], was, n, gpujobs.ShortID(reg.EvalID))
			return nil
		},
	}
	return cmd
}
