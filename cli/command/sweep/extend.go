package sweep

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/internal/sweep/controller"
)

// ExtendOptions is what `sweep extend`'s arguments and flags ask for.
type ExtendOptions struct {
	// Name is the sweep (the argument).
	Name string
	// MaxTrials is --max-trials: +N more, or N in all.
	MaxTrials        sweepjob.MaxTrials
	ControllerBinary string
	// ControllerUser is who the controller runs as ("" as submitted).
	ControllerUser string
	Detach         bool
}

func newExtendCmd(f *factory.Factory) *cobra.Command { return NewExtendCmd(f, nil) }

// NewExtendCmd is the command running runF instead when runF is not nil: a
// test checks the Options the arguments parse into without running.
func NewExtendCmd(f *factory.Factory, runF func(context.Context, *ExtendOptions) error) *cobra.Command {
	o := &ExtendOptions{}
	var more string
	cmd := &cobra.Command{
		Use:   "extend SWEEP --max-trials +N",
		Short: "Continue a sweep with more trials, from its recorded history",
		Long: `Extend raises a sweep's max_trials (+N adds, N sets) and, if the sweep had
ended, starts its controller again. The new trials are proposed from the
whole recorded history: a TPE search goes on learning from every trial so
far, a random search continues its seeded sequence, a grid its next cells.`,
		Example: `  gpujob sweep extend toy-lr --max-trials +4`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := sweepjob.ParseMaxTrials(more)
			if err != nil {
				return err
			}
			o.Name, o.MaxTrials = args[0], m
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runExtend(ctx, f, o) })
		},
	}
	cmd.Flags().StringVar(&more, "max-trials", "", "`+N` more trials, or N in all")
	cmd.Flags().StringVar(&o.ControllerBinary, "controller-binary", "", "absolute `path` of the gpujob binary on the Nomad clients")
	cmd.Flags().StringVar(&o.ControllerUser, "controller-user", "", "`user` the controller runs as (default: as submitted)")
	cmd.Flags().BoolVar(&o.Detach, "detach", false, "return once the controller runs again")
	_ = cmd.MarkFlagRequired("max-trials")
	return cmd
}

func runExtend(ctx context.Context, f *factory.Factory, o *ExtendOptions) error {
	name := o.Name
	e, err := newEnv(f, true)
	if err != nil {
		return err
	}
	rec, _, _, err := e.load(ctx, name)
	if err != nil {
		return err
	}
	if err := e.detectACL(); err != nil {
		return err
	}
	bin, err := controllerBinary(o.ControllerBinary)
	if err != nil {
		return err
	}
	// The controller may still run with its credentials: keep them, or
	// issue them if they are gone, before the state says the sweep runs
	// again.
	creds, err := e.issuer(name)
	if err != nil {
		return err
	}
	if _, creds.RecordDigest, err = sweepjob.ReadRecord(ctx, e.consul, e.prefix, e.ns, name); err != nil {
		return err
	}
	if err := creds.Ensure(); err != nil {
		return err
	}
	st, err := e.sweeps().Update(ctx, name, func(st *controller.State) error { return sweepjob.Extend(st, name, o.MaxTrials) })
	if err != nil {
		return err
	}
	user := o.ControllerUser
	if user == "" {
		user = rec.ControllerUser
	}
	ctl := controllerFromRecord(rec, e, bin, controllerUser(user, e))
	ctlHCL, err := render.ControllerJobspec(ctl)
	if err != nil {
		return fmt.Errorf("rendering the controller of sweep %s: %w", name, err)
	}
	job, err := e.nomad.ParseHCL(string(ctlHCL), "")
	if err != nil {
		return fmt.Errorf("parsing the controller job of sweep %s: %w", name, err)
	}
	// Always: a controller that just wrote the sweep's end may be exiting
	// while its job still says running.
	if err := registerController(e, job); err != nil {
		return err
	}
	fmt.Fprintf(f.IO.Out, "sweep %s: max_trials %d (it has %d)\n", name, st.MaxTrials, len(st.Trials))
	if o.Detach {
		return nil
	}
	return watch(ctx, e, name)
}

// controllerFromRecord is the controller job of a recorded sweep.
func controllerFromRecord(rec *sweepjob.Record, e *env, binary, user string) render.Controller {
	c := controllerEnv(e, rec.Sweep)
	c.JobID, c.Sweep, c.Namespace, c.Binary, c.User = controller.ControllerJobID(rec.Sweep), rec.Sweep, e.ns, binary, user
	if t := rec.Template; t != nil {
		c.Datacenters = t.Datacenters
		if t.NodePool != nil {
			c.NodePool = *t.NodePool
		}
	}
	return c
}
