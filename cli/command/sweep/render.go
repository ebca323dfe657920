package sweep

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/search"
)

// RenderOptions is what `sweep render`'s arguments and flags ask for.
type RenderOptions struct {
	// Path is the spec file (the argument).
	Path             string
	Vars, VarFiles   []string
	CheckpointRoot   string
	ControllerBinary string
}

func newRenderCmd(f *factory.Factory) *cobra.Command { return NewRenderCmd(f, nil) }

// NewRenderCmd is the command running runF instead when runF is not nil: a
// test checks the Options the arguments parse into without running.
func NewRenderCmd(f *factory.Factory, runF func(context.Context, *RenderOptions) error) *cobra.Command {
	o := &RenderOptions{}
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
			o.Path = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(context.Context) error { return runRender(f, o) })
		},
	}
	gpujobs.AddSpecFlags(cmd, &o.Vars, &o.VarFiles)
	gpujobs.AddRenderFlags(cmd, &o.CheckpointRoot)
	cmd.Flags().StringVar(&o.ControllerBinary, "controller-binary", "", "absolute `path` of the gpujob binary on the Nomad clients")
	return cmd
}

func runRender(f *factory.Factory, o *RenderOptions) error {
	ro, err := gpujobs.RenderOptions(o.CheckpointRoot)
	if err != nil {
		return err
	}
	sw, files, diags := spec.LoadSweep(o.Path, spec.Options{Vars: o.Vars, VarFiles: o.VarFiles})
	if diags.HasErrors() {
		fmt.Fprint(f.IO.ErrOut, spec.Format(diags, files))
		return fmt.Errorf("%s: the spec has errors", o.Path)
	}
	bin, err := controllerBinary(o.ControllerBinary)
	if err != nil {
		return err
	}
	ctl, trial, first, err := renderJobs(sw, ro, f.Namespace(), bin)
	if err != nil {
		return fmt.Errorf("%s: %w", o.Path, err)
	}
	fmt.Fprintf(f.IO.Out, "%s\n# The first trial, %s (%s):\n%s", ctl, controller.TrialID(0), first, trial)
	return nil
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
