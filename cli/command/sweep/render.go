package sweep

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/search"
)

func newRenderCmd(f *factory.Factory) *cobra.Command {
	var vars, varFiles []string
	var root, binary string
	cmd := &cobra.Command{
		Use:   "render SPEC",
		Short: "Print the jobs a sweep becomes: its controller and its first trial",
		Long: `Render prints the Nomad jobspecs of a sweep: the controller job that
gpujob sweep submit registers, and the job of the sweep's first trial as the
controller would register it (every trial is the same job with its own
parameter values, job ID and checkpoint directory).`,
		Example: `  gpujob sweep render jobspecs/examples/sweep-toy.hcl`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ro, err := gpujobs.RenderOptions(root)
			if err != nil {
				return err
			}
			sw, files, diags := spec.LoadSweep(args[0], spec.Options{Vars: vars, VarFiles: varFiles})
			if diags.HasErrors() {
				fmt.Fprint(f.IO.ErrOut, spec.Format(diags, files))
				return fmt.Errorf("%s: the spec has errors", args[0])
			}
			bin, err := controllerBinary(binary)
			if err != nil {
				return err
			}
			ctl, trial, first, err := renderJobs(sw, ro, f.Namespace(), bin)
			if err != nil {
				return err
			}
			fmt.Fprintf(f.IO.Out, "%s\n# The first trial, %s (%s):\n%s", ctl, controller.TrialID(0), first, trial)
			return nil
		},
	}
	gpujobs.AddSpecFlags(cmd, &vars, &varFiles)
	gpujobs.AddRenderFlags(cmd, &root)
	cmd.Flags().StringVar(&binary, "controller-binary", "", "absolute `path` of the gpujob binary on the Nomad clients")
	return cmd
}

// renderJobs renders a sweep's controller job and its first trial's job.
func renderJobs(sw *spec.Sweep, ro render.Options, ns, binary string) (ctl, trial []byte, first search.Assignment, err error) {
	ctl, err = render.ControllerJobspec(render.Controller{JobID: controller.ControllerJobID(sw.Name), Sweep: sw.Name,
		Namespace: ns, Binary: binary, Datacenters: sw.Template.Datacenters, NodePool: sw.Template.NodePool})
	if err != nil {
		return nil, nil, nil, err
	}
	if first, err = firstAssignment(sw); err != nil {
		return nil, nil, nil, err
	}
	trial, err = sweepjob.TrialHCL(sw, ro, 0, first)
	return ctl, trial, first, err
}
