package sweep

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/internal/sweep/controller"
)

func newExtendCmd(f *factory.Factory) *cobra.Command {
	var more, binary, user string
	var detach bool
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
			ctx, name := cmd.Context(), args[0]
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
			bin, err := controllerBinary(binary)
			if err != nil {
				return err
			}
			// The controller may still run with its credentials: keep
			// them, or issue them if they are gone, before the state
			// says the sweep runs again.
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
			st, err := e.update(ctx, name, func(st *controller.State) error {
				n, err := parseMore(more, st.MaxTrials)
				if err != nil {
					return err
				}
				if n > spec.MaxTrials {
					return fmt.Errorf("--max-trials %d: a sweep holds at most %d trials", n, spec.MaxTrials)
				}
				if n < len(st.Trials) {
					return fmt.Errorf("sweep %s already has %d trials; --max-trials must be at least that", name, len(st.Trials))
				}
				st.MaxTrials = n
				if st.Status.Terminal() {
					st.Status, st.Reason, st.Ended, st.StopRequested = controller.StatusRunning, "", time.Time{}, false
				}
				return nil
			})
			if err != nil {
				return err
			}
			if user == "" {
				user = rec.ControllerUser
			}
			ctl := controllerFromRecord(rec, e, bin, controllerUser(user, e))
			ctlHCL, err := render.ControllerJobspec(ctl)
			if err != nil {
				return err
			}
			job, err := e.nomad.ParseHCL(string(ctlHCL), "")
			if err != nil {
				return err
			}
			// Always: a controller that just wrote the sweep's end may be
			// exiting while its job still says running.
			if err := registerController(e, job); err != nil {
				return err
			}
			fmt.Fprintf(f.IO.Out, "sweep %s: max_trials %d (it has %d)\n", name, st.MaxTrials, len(st.Trials))
			if detach {
				return nil
			}
			return watch(ctx, e, name)
		},
	}
	cmd.Flags().StringVar(&more, "max-trials", "", "`+N` more trials, or N in all")
	cmd.Flags().StringVar(&binary, "controller-binary", "", "absolute `path` of the gpujob binary on the Nomad clients")
	cmd.Flags().StringVar(&user, "controller-user", "", "`user` the controller runs as (default: as submitted)")
	cmd.Flags().BoolVar(&detach, "detach", false, "return once the controller runs again")
	_ = cmd.MarkFlagRequired("max-trials")
	return cmd
}

func parseMore(s string, current int) (int, error) {
	plus := strings.HasPrefix(s, "+")
	n, err := strconv.Atoi(strings.TrimPrefix(s, "+"))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("--max-trials %q: want +N or N", s)
	}
	if plus {
		return current + n, nil
	}
	return n, nil
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
