package service

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/explain"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gatewayclient"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/queues"
	"github.com/gpujob/gpujob/cli/servicedeploy"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
	"github.com/gpujob/gpujob/internal/servekv"
)

// DeployOptions is what the command's arguments and flags ask for.
type DeployOptions struct {
	// Path is the spec file (the argument).
	Path           string
	Vars, VarFiles []string
	Detach         bool
	JSON           bool
	Gateway        string
	// Queue is --queue: the queue the service goes into, over the spec's.
	Queue string
}

func newDeployCmd(f *factory.Factory) *cobra.Command { return NewDeployCmd(f, nil) }

// NewDeployCmd is the command running runF instead when runF is not nil: a
// test checks the Options the arguments parse into without running.
func NewDeployCmd(f *factory.Factory, runF func(context.Context, *DeployOptions) error) *cobra.Command {
	o := &DeployOptions{}
	cmd := &cobra.Command{
		Use:   "deploy SPEC",
		Short: "Deploy a service spec, or roll out a new version of it",
		Long: `Deploy renders SPEC into a Nomad service job, registers it and writes its
gateway route to Consul. A service that runs already is updated in place:
its replica count is kept (a deploy does not undo the autoscaler or a
scale), and Nomad rolls the replicas over to the new version, through
canaries when the spec asks for them.

Deploy then follows the deployment until it succeeds (exit 0), or fails
(exit 1, saying why and whether Nomad reverted to the last good version).
--detach returns once the job is registered. If the cluster cannot place
the replicas now, deploy says why in plain words; Nomad places them when it
can.

The service goes into its spec's queue (queue = "NAME"), --queue's, or the
default queue: when a queue configuration exists (gpujob queue), deploy
refuses a queue that does not exist and a service whose initial replicas its
queue could never hold, before anything is registered.

Queue mode (a queue configuration exists): a new service is not registered
but written into its queue with its replicas as one gang, and its route is
written; the admission controller registers it when all replicas fit. Deploy
follows its place in the queue until then (--detach returns at once; -json
carries the queue fields). The queue admits the initial replicas; the
service then scales within replicas { min max } (the autoscaler, gpujob
service scale) through Nomad, and replicas Nomad cannot place are weighed by
the admission controller like a gang of the service's class, which may
preempt lower work of its queue for them. An update of a service the
queue admitted is registered directly, keeping its admission, and replaces
its queued record (so a requeue after a preemption starts the new version);
it may not ask for more GPUs than were admitted — stop the service and deploy
it again to queue it at its new size. A service deployed before queue mode is
updated as before.`,
		Example: `  gpujob service deploy jobspecs/examples/serve-bert.hcl
  gpujob service deploy -var version=v2 jobspecs/examples/serve-bert.hcl
  gpujob service deploy --detach -json serve.hcl
  gpujob service deploy --queue serving serve.hcl`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Path = args[0]
			if o.Queue != "" {
				if err := queuefile.CheckName(o.Queue); err != nil {
					return fmt.Errorf("--queue: %w", err)
				}
			}
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return deploy(ctx, f, o, o.Path) })
		},
	}
	gpujobs.AddSpecFlags(cmd, &o.Vars, &o.VarFiles)
	cmd.Flags().BoolVar(&o.Detach, "detach", false, "return once the job is registered")
	cmd.Flags().BoolVar(&o.JSON, "json", false, "print the outcome as JSON")
	cmd.Flags().StringVar(&o.Queue, "queue", "", "the `queue` to deploy into (default: the spec's queue, else the default queue)")
	addGatewayFlag(cmd, &o.Gateway)
	return cmd
}

// DeployResult is deploy's outcome, for -json.
type DeployResult = servicedeploy.Result

// RouteOf is the gateway's route to s in namespace ns.
func RouteOf(s *spec.Service, ns string) servekv.Route { return servicedeploy.RouteOf(s, ns) }

// MetaRoute is the job meta that carries the route it was deployed with.
const MetaRoute = servicedeploy.MetaRoute

// deploy loads the spec, registers it (servicedeploy.Register) and
// follows the deployment, printing each step.
func deploy(ctx context.Context, f *factory.Factory, o *DeployOptions, path string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	s, files, diags := spec.LoadService(path, spec.Options{Vars: o.Vars, VarFiles: o.VarFiles})
	if diags.HasErrors() {
		fmt.Fprint(f.IO.ErrOut, spec.Format(diags, files))
		return &cmdutil.ExitError{Code: 1, Err: fmt.Errorf("%s: the spec has errors; nothing was deployed", path)}
	}
	if o.Queue != "" {
		s.Queue = o.Queue
	}
	nomad, store, err := clients(f)
	if err != nil {
		return err
	}
	admit := func(ctx context.Context, gang policy.Job, nodes []explain.Node) (bool, error) {
		return queues.CheckSubmitMode(ctx, func() (queuekv.Store, error) { return queues.Open(f) }, gang, nodes, f.IO.ErrOut)
	}
	req := servicedeploy.Request{Service: s, Namespace: f.Namespace(), Gateway: gatewayclient.Addr(o.Gateway), Admit: admit, Now: f.Now()}
	if recs, ok := queues.RecordsOf(f); ok {
		req.Records, req.SubmittedBy = recs, queues.SubmittedBy(ctx, recs.Consul)
	}
	reg, err := servicedeploy.Register(ctx, nomad, store, req)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	res := reg.Result
	out := f.IO.Out
	if reg.Queued != nil {
		var done bool
		if res, done, err = awaitQueued(ctx, f, o, reg); done || err != nil {
			return err
		}
	} else if !o.JSON {
		verb := "deployed"
		if reg.Update {
			verb = "updating"
		}
		fmt.Fprintf(out, "%s %s %s (job version %d): %d replica(s) × %d GPU(s), evaluation %s\n",
			verb, s.Name, s.Version, res.JobVersion, reg.Replicas, s.GPUsPerReplica, gpujobs.ShortID(res.EvalID))
		if res.Queued != "" {
			fmt.Fprintf(out, "queued: %s\n", res.Queued)
		}
	}
	if o.Detach {
		return finish(out, o.JSON, res, nil)
	}
	d, err := servicedeploy.Watch(ctx, nomad, s.Name, res.JobVersion, progressTo(out, o.JSON))
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(f.IO.ErrOut, "stopped watching; the deployment goes on: gpujob service status %s\n", s.Name)
			return nil
		}
		return err
	}
	revertedTo, restoreErr, failed := servicedeploy.Conclude(ctx, nomad, store, &res, d)
	if failed != nil {
		failed = &cmdutil.ExitError{Code: 1, Err: failed}
		if restoreErr != nil {
			fmt.Fprintf(f.IO.ErrOut, "gpujob: restoring the route of the version Nomad reverted to: %v\n", restoreErr)
		} else if revertedTo != "" && !o.JSON {
			fmt.Fprintf(out, "%s is back on %s, with its route\n", s.Name, revertedTo)
		}
	}
	return finish(out, o.JSON, res, failed)
}

// awaitQueued follows a queued service until the admission controller
// registers it; done says deploy has nothing more to do (--detach, Ctrl-C,
// a refusal), else res is the admitted job's, to follow its deployment.
func awaitQueued(ctx context.Context, f *factory.Factory, o *DeployOptions, reg *servicedeploy.Registered) (DeployResult, bool, error) {
	res, out, name := reg.Result, f.IO.Out, reg.Result.Service
	progress := out
	if o.JSON {
		progress = io.Discard
	}
	fmt.Fprintf(progress, "queued %s %s in %s: %d replica(s); the admission controller starts them when all fit at once\n",
		name, res.Version, res.Queue.Queue, reg.Replicas)
	if res.Queued != "" {
		fmt.Fprintf(progress, "not placeable now: %s\n", res.Queued)
	}
	if o.Detach {
		return res, true, finish(out, o.JSON, res, nil)
	}
	recs, _ := queues.RecordsOf(f)
	e, err := recs.AwaitAdmission(ctx, reg.Queued, queues.AwaitOptions{Out: progress, TTY: f.IO.IsTTY && !o.JSON, Now: f.Now})
	if e != nil {
		res.Queue = e.Info()
	}
	var refused *queues.RefusedError
	switch {
	case ctx.Err() != nil:
		fmt.Fprintf(f.IO.ErrOut, "stopped watching; %s stays queued: gpujob service status %s (gpujob service stop %s withdraws it)\n", name, name, name)
		return res, true, finish(out, o.JSON, res, nil)
	case errors.As(err, &refused):
		return res, true, finish(out, o.JSON, res, &cmdutil.ExitError{Code: 1, Err: fmt.Errorf("%w; gpujob service stop %s withdraws it", err, name)})
	case err != nil:
		return res, true, err
	}
	nomad, err := f.Nomad()
	if err != nil {
		return res, true, err
	}
	job, err := nomad.Job(name)
	if err != nil {
		return res, true, fmt.Errorf("reading service %s, which the queue admitted: %w", name, err)
	}
	if job.Version != nil {
		res.JobVersion = *job.Version
	}
	res.Status = "registered"
	return res, false, nil
}

func finish(out io.Writer, asJSON bool, res DeployResult, failed error) error {
	if asJSON {
		if err := gpujobs.PrintJSON(out, res); err != nil {
			return err
		}
		return failed
	}
	if failed == nil {
		switch res.Status {
		case "registered":
			fmt.Fprintf(out, "follow it: gpujob service status %s\n", res.Service)
		default:
			fmt.Fprintf(out, "%s %s is live at %s\n", res.Service, res.Version, res.Endpoint)
		}
	}
	return failed
}
