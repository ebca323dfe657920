// Package queue is `gpujob queue`: the cluster's queues — apply a queue
// file, list the queues, and show what each uses.
package queue

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/cli/queues"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
)

// NewCmd returns the queue command and its subcommands.
func NewCmd(f *factory.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queue",
		Short: "Queues: apply a queue file, list the queues, show what each uses",
		Long: `Queues share the cluster between teams. A queue file declares them:

  queue "team-a" {
    gpus     = 8            # quota in GPUs; 0 or absent: no quota
    weight   = 2            # fair-share weight (default 1)
    borrow   = true         # may use idle quota of its cohort (default false)
    priority = 60           # of its jobs that set none (default 50)
    cohort   = "research"   # queues that lend each other idle quota
  }

gpujob queue apply FILE stores it in Consul (CONSUL_HTTP_ADDR,
CONSUL_HTTP_TOKEN, ...), under gpujob/queues/config. Until a file is applied
the cluster has one queue, "default", with no quota, which every job is in.

A job names its queue with queue = "NAME" in its train, sweep (train block)
or service spec, or --queue on gpujob submit and gpujob service deploy; a
job that names none is in the queue "default". Submit refuses a job whose
queue does not exist (listing the queues) and one its queue could never
hold: larger than the whole cluster, than its queue's quota with borrowing
off, or than its cohort's quota — before anything is registered.

Once a configuration exists the cluster is in queue mode: submit and
service deploy write the job into its queue (a record in Consul) instead of
registering it, and the admission controller registers it when every member
fits at once, within its queue's share. gpujob queue status shows each
queue's configuration beside the GPUs its jobs hold now, and the jobs
waiting in it with their positions.`,
		Example: `  gpujob queue apply --dry-run queues.hcl
  gpujob queue apply queues.hcl
  gpujob queue list
  gpujob queue status
  gpujob queue status team-a -json`,
		Args: cobra.NoArgs,
	}
	for _, sub := range []func(*factory.Factory) *cobra.Command{newApplyCmd, newListCmd, newStatusCmd, newControllerCmd} {
		cmd.AddCommand(sub(f))
	}
	return cmd
}

// ApplyOptions is what `queue apply`'s arguments and flags ask for.
type ApplyOptions struct {
	// Path is the queue file (the argument).
	Path   string
	DryRun bool
	JSON   bool
	// NoController leaves the admission controller's job alone.
	NoController     bool
	ControllerBinary string
	ControllerUser   string
	// Controllers is the controller job's count.
	Controllers int
}

func newApplyCmd(f *factory.Factory) *cobra.Command { return NewApplyCmd(f, nil) }

// NewApplyCmd is the apply command running runF instead when runF is not
// nil: a test checks the Options the arguments parse into without running.
func NewApplyCmd(f *factory.Factory, runF func(context.Context, *ApplyOptions) error) *cobra.Command {
	o := &ApplyOptions{}
	cmd := &cobra.Command{
		Use:   "apply FILE",
		Short: "Check a queue file and store it in Consul, printing what changes",
		Long: `Apply reads FILE, checks it (every error with its file:line), compares it
with the configuration in Consul and prints what changes: queues added (+),
changed (~, each setting from → to) and removed (-). Then it writes the new
configuration in one check-and-set transaction, with who applied it, when,
and the file's SHA-256: if someone else applied a file meanwhile, nothing is
written and apply says who did.

A lowered quota takes effect for new submissions; running jobs keep running.
A file that declares no queue brings back the default queue alone. With
--dry-run it compares and writes nothing.

Then, unless --no-controller, it registers the queue's admission controller,
the Nomad job gpujob-queue-controller (raw_exec: --controller-binary, default
$` + EnvControllerBinary + `, else this binary, which must be at that path on the clients),
when it does not run. On a cluster with ACLs, or where this CLI speaks TLS, the
controller reads its tokens and Consul's TLS material from the Nomad variable
nomad/jobs/gpujob-queue-controller (items nomad_token, consul_token,
consul_ca_pem, consul_cert_pem, consul_key_pem; policies: gpujob acl policy
nomad-queue-controller and consul-queue-controller) and runs as the user
gpujob-queue (--controller-user), which the clients must have.`,
		Example: `  gpujob queue apply --dry-run queues.hcl
  gpujob queue apply queues.hcl
  gpujob queue apply queues.hcl -json | jq '.changes'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Path = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runApply(ctx, f, o) })
		},
	}
	cmd.Flags().BoolVar(&o.DryRun, "dry-run", false, "compare with the configuration in Consul and write nothing")
	cmd.Flags().BoolVar(&o.JSON, "json", false, "print what changed as JSON")
	cmd.Flags().BoolVar(&o.NoController, "no-controller", false, "do not register the admission controller's Nomad job")
	cmd.Flags().StringVar(&o.ControllerBinary, "controller-binary", "", "absolute `path` of the gpujob binary on the Nomad clients, for the controller")
	cmd.Flags().StringVar(&o.ControllerUser, "controller-user", "", "the `user` the controller runs as (default nobody; gpujob-queue on a cluster with ACLs or TLS)")
	cmd.Flags().IntVar(&o.Controllers, "controllers", 0, "how many controllers the job runs (`N`, default 1: one leads, the others stand by)")
	return cmd
}

func runApply(ctx context.Context, f *factory.Factory, o *ApplyOptions) error {
	file, files, diags := queuefile.ParseFile(o.Path)
	if diags.HasErrors() {
		fmt.Fprint(f.IO.ErrOut, spec.Format(diags, files))
		return &cmdutil.ExitError{Code: 1, Err: fmt.Errorf("%s: the queue file has errors; nothing was applied", o.Path)}
	}
	store, err := queues.Open(f)
	if err != nil {
		return err
	}
	res, err := queues.Apply(ctx, store, queues.ApplyOptions{Path: o.Path, File: file, DryRun: o.DryRun,
		AppliedBy: queues.Who(), Now: f.Now()})
	if err != nil {
		return err
	}
	w := f.IO.Out
	if o.JSON {
		if err := gpujobs.PrintJSON(f.IO.Out, res); err != nil {
			return err
		}
		w = f.IO.ErrOut
	} else {
		res.Print(f.IO.Out)
	}
	if o.DryRun || o.NoController {
		return nil
	}
	if err := ensureController(f, controllerJob{binary: o.ControllerBinary, user: o.ControllerUser, count: o.Controllers}, w); err != nil {
		return fmt.Errorf("the queues were applied, but the admission controller's job could not be registered (apply again, or --no-controller): %w", err)
	}
	return nil
}

// ListOptions is what `queue list`'s flags ask for.
type ListOptions struct {
	JSON bool
}

func newListCmd(f *factory.Factory) *cobra.Command { return NewListCmd(f, nil) }

// NewListCmd is the list command running runF instead when runF is not nil.
func NewListCmd(f *factory.Factory, runF func(context.Context, *ListOptions) error) *cobra.Command {
	o := &ListOptions{}
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the queues in Consul with their quota, weight, borrowing, priority and cohort",
		Long: `List shows the queue configuration in Consul: who applied which file when,
and each queue's quota (GPUs; none: no quota), fair-share weight, borrowing,
default priority and cohort. Before any file is applied it shows the default
queue, which every job is in. It reads Consul only.`,
		Example: `  gpujob queue list
  gpujob queue list -json | jq -r '.queues[].name'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runList(ctx, f, o) })
		},
	}
	cmd.Flags().BoolVar(&o.JSON, "json", false, "print as JSON")
	return cmd
}

func runList(ctx context.Context, f *factory.Factory, o *ListOptions) error {
	store, err := queues.Open(f)
	if err != nil {
		return err
	}
	l, err := queues.ReadList(ctx, store)
	if err != nil {
		return err
	}
	if o.JSON {
		return gpujobs.PrintJSON(f.IO.Out, l)
	}
	return l.Print(f.IO.Out)
}

// StatusOptions is what `queue status`' arguments and flags ask for.
type StatusOptions struct {
	// Name is the queue (the optional argument); "" all.
	Name string
	JSON bool
}

func newStatusCmd(f *factory.Factory) *cobra.Command { return NewStatusCmd(f, nil) }

// NewStatusCmd is the status command running runF instead when runF is not
// nil.
func NewStatusCmd(f *factory.Factory, runF func(context.Context, *StatusOptions) error) *cobra.Command {
	o := &StatusOptions{}
	cmd := &cobra.Command{
		Use:   "status [NAME]",
		Short: "Show each queue's configuration beside the GPUs its jobs hold, and its queued jobs with their positions",
		Long: `Status shows every queue (or the one named): its quota and settings, the
GPUs its jobs hold now, how many jobs hold them, and how many of its jobs
have allocations Nomad has not placed yet. The GPUs are the inventory
gpujob gpus shows: a GPU is held while its allocation's client has not
reported it complete, failed or lost. A job is in the queue its meta names
(gpujob_queue), or in "default" when it names none; GPUs held by jobs gpujob
did not submit are in no queue and counted apart. A queue that jobs name but
the configuration no longer declares is shown as not declared.

Then, for each queue, the jobs waiting in it (next first): position, job,
namespace, kind, GPUs, state (waiting: the admission controller has not
answered yet; queued; preempted; refused), who submitted it, and its reason
and estimated start in words. Only the namespaces the Consul token may read
are listed (a user's consul-queue-submit token: its own).

With NAME it also lists the queue's jobs holding GPUs. It reads Consul (the
configuration, the queued jobs) and Nomad (nodes, allocations, jobs).`,
		Example: `  gpujob queue status
  gpujob queue status team-a
  gpujob queue status -json | jq '.queues[] | {name, gpus, used_gpus}'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				o.Name = args[0]
			}
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runStatus(ctx, f, o) })
		},
	}
	cmd.Flags().BoolVar(&o.JSON, "json", false, "print as JSON")
	return cmd
}

func runStatus(ctx context.Context, f *factory.Factory, o *StatusOptions) error {
	store, err := queues.Open(f)
	if err != nil {
		return err
	}
	nomad, err := f.Nomad()
	if err != nil {
		return err
	}
	st, err := queues.ReadStatus(ctx, store, observe.Config{Nomad: nomad, Now: f.Now}, o.Name)
	if err != nil {
		return err
	}
	// The queued jobs of every namespace the Consul token may read (a
	// user's consul-queue-submit token: its own namespace's).
	entries, err := queues.Records{Consul: store.Client, Prefix: store.Prefix}.List(ctx, "")
	if err != nil {
		st.Warnings = append(st.Warnings, err.Error())
	}
	st.AddQueued(entries, o.Name, f.Now())
	if o.JSON {
		return gpujobs.PrintJSON(f.IO.Out, st)
	}
	return st.Print(f.IO.Out, o.Name != "")
}
