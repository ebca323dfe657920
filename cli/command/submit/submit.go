// Package submit is `gpujob submit`: spec → jobspec → plan → register →
// watch until the job ends.
package submit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/explain"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/cli/queues"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// Exit codes beyond 0 (the job succeeded) and 1 (it failed, or bad input).
const (
	// ExitNotPlaced: --no-queue and the cluster cannot place the job now.
	ExitNotPlaced = 2
)

// ExitError carries an exit code to main (cmdutil.ExitError).
type ExitError = cmdutil.ExitError

// Options is what the command's arguments and flags ask for.
type Options struct {
	// Path is the spec file (the argument).
	Path           string
	Vars           []string
	VarFiles       []string
	CheckpointRoot string
	// Queue is --queue: the queue the job goes into, over the spec's.
	Queue   string
	NoQueue bool
	Detach  bool
	Logs    bool
	// JSON prints the outcome as one JSON object (Result) on stdout, the
	// progress on stderr.
	JSON bool
}

// Result is `gpujob submit -json`'s outcome.
type Result struct {
	Job       string `json:"job"`
	Namespace string `json:"namespace"`
	// Queued: the job went into its queue (queue mode) instead of being
	// registered by submit.
	Queued bool   `json:"queued"`
	EvalID string `json:"eval_id,omitempty"`
	// Outcome: registered or queued (--detach, or Ctrl-C while watching),
	// complete, failed, refused (by the queue) or withdrawn (from it).
	Outcome string `json:"outcome"`
	// Queue is the job's queue fields as last seen (queue mode).
	Queue *queues.Info `json:"queue,omitempty"`
}

// NewCmd returns the submit command.
func NewCmd(f *factory.Factory) *cobra.Command { return NewCmdWith(f, nil) }

// NewCmdWith is NewCmd running runF instead of the command when runF is not
// nil: a test checks the Options the arguments parse into without running.
func NewCmdWith(f *factory.Factory, runF func(context.Context, *Options) error) *cobra.Command {
	o := &Options{}
	cmd := &cobra.Command{
		Use:   "submit SPEC",
		Short: "Submit a training spec to Nomad and watch it run",
		Long: `Submit renders SPEC into a Nomad jobspec, asks Nomad to plan it, and
registers it. A job goes into its spec's queue (queue = "NAME"), --queue's,
or the default queue: when a queue configuration exists (gpujob queue), submit
refuses a queue that does not exist and a job its queue could never hold,
before anything is registered.

Queue mode: when a queue configuration exists, submit registers nothing in
Nomad. It writes the rendered job into its queue (a record in Consul under
gpujob/queues/jobs/NAMESPACE/JOB) and the admission controller registers it
once every member can be placed at once. Submit prints the job's place as
the controller reports it ("queued in team-a (position 2): 1 job ahead; …,
estimated start …") and follows it until admitted, then follows the job as
below. --detach returns once the job is queued; Ctrl-C leaves it queued.
gpujob stop JOB withdraws it. A job of that name already queued, or live in
Nomad, is refused.

Without a queue configuration, if the cluster cannot place every worker now,
submit says why in plain words and registers the job anyway (Nomad places it
when GPUs free up), or, with --no-queue, registers nothing and exits 2.

Then it follows the job: placement, each rendezvous round, restarts, and the
end, with the training result. The exit code is the job's outcome: 0 when
every worker succeeded, 1 when it failed (or the queue refused it). --detach
returns once the job is registered; Ctrl-C stops watching and leaves the job
running. -json prints the outcome as one JSON object (job, namespace,
queued, outcome, and in queue mode the queue fields: state, position,
reason, estimated_start, …), with the progress on stderr.`,
		Example: `  gpujob submit jobspecs/examples/bert-finetune.hcl
  gpujob submit -var workers=4 -var workload=$PWD/jobspecs/workloads/bert_finetune.py jobspecs/examples/bert-finetune.hcl
  gpujob submit --queue team-a train.hcl
  gpujob submit --no-queue --detach train.hcl
  gpujob submit --logs train.hcl      # progress and every worker's output
  gpujob submit --detach -json train.hcl | jq .queue`,
		Args:         cobra.ExactArgs(1),
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Path = args[0]
			if o.Queue != "" {
				if err := queuefile.CheckName(o.Queue); err != nil {
					return fmt.Errorf("--queue: %w", err)
				}
			}
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error {
				res := &Result{Namespace: queues.Namespace(f.Namespace)}
				err := run(ctx, f, o, o.Path, res)
				if o.JSON && res.Outcome != "" {
					if jerr := gpujobs.PrintJSON(f.IO.Out, res); jerr != nil && err == nil {
						err = jerr
					}
				}
				return err
			})
		},
	}
	gpujobs.AddSpecFlags(cmd, &o.Vars, &o.VarFiles)
	gpujobs.AddRenderFlags(cmd, &o.CheckpointRoot)
	cmd.Flags().StringVar(&o.Queue, "queue", "", "the `queue` to submit into (default: the spec's queue, else the default queue)")
	cmd.Flags().BoolVar(&o.NoQueue, "no-queue", false, "fail (exit 2) instead of queueing when the job cannot be placed now")
	cmd.Flags().BoolVar(&o.Detach, "detach", false, "return once the job is registered")
	cmd.Flags().BoolVar(&o.Logs, "logs", false, "also stream every worker's stdout while watching")
	cmd.Flags().BoolVar(&o.JSON, "json", false, "print the outcome as JSON (with the queue fields in queue mode); progress goes to stderr")
	return cmd
}

func run(ctx context.Context, f *factory.Factory, o *Options, path string, res *Result) error {
	out := f.IO.Out
	if o.JSON {
		out = f.IO.ErrOut
	}
	ro, err := gpujobs.RenderOptions(o.CheckpointRoot)
	if err != nil {
		return &ExitError{Code: 1, Err: err}
	}
	t, files, diags := spec.Load(path, spec.Options{Vars: o.Vars, VarFiles: o.VarFiles})
	if diags.HasErrors() {
		fmt.Fprint(f.IO.ErrOut, spec.Format(diags, files))
		return &ExitError{Code: 1, Err: fmt.Errorf("%s: the spec has errors; nothing was submitted", path)}
	}
	if o.Queue != "" {
		t.Queue = o.Queue
	}
	hcl, err := ro.Jobspec(t)
	if err != nil {
		return fmt.Errorf("rendering %s: %w", path, err)
	}
	nomad, err := f.Nomad()
	if err != nil {
		return err
	}
	nodes, err := observe.ClusterGPUs(nomad)
	if err != nil {
		return err
	}
	if d := spec.CheckFits(t, mostGPUs(nodes)); d.HasErrors() {
		fmt.Fprint(f.IO.ErrOut, spec.Format(d, files))
		return &ExitError{Code: 1, Err: fmt.Errorf("%s does not fit any node of the cluster at %s; nothing was submitted", path, nomad.Address())}
	}
	// A group the cluster could not hold even empty would be registered,
	// partly placed, and wait on a rendezvous that can never complete:
	// refuse it before anything is registered.
	ask := explain.Ask{Workers: t.Workers, GPUsPerWorker: t.GPUsPerWorker, NodePool: t.NodePool,
		Datacenters: t.Datacenters, CPU: t.WorkerCPU(), MemoryMiB: t.WorkerMemoryMiB()}
	if t.GPU != nil {
		ask.Model, ask.MinGPUMemoryMiB = t.GPU.Model, t.GPU.MinMemoryMiB
	}
	if c := explain.EmptyCapacity(ask, nodes); c.Workers < t.Workers {
		fmt.Fprint(f.IO.ErrOut, spec.Format(spec.CheckCapacity(t, c.Workers, c.String()), files))
		return &ExitError{Code: 1, Err: fmt.Errorf("%s: %d workers cannot fit the cluster at %s, which could hold at most %d; nothing was submitted",
			path, t.Workers, nomad.Address(), c.Workers)}
	}
	gang := policy.Job{ID: t.Name, Queue: t.Queue, Kind: policy.KindTrain, Priority: t.Priority, Members: t.Workers,
		PerMember: policy.Resources{GPUs: t.GPUsPerWorker, CPUMHz: t.WorkerCPU(), MemoryMB: t.WorkerMemoryMiB()}}
	queued, err := queues.CheckSubmitMode(ctx, func() (queuekv.Store, error) { return queues.Open(f) }, gang, nodes, f.IO.ErrOut)
	if err != nil {
		return &ExitError{Code: 1, Err: fmt.Errorf("%s: %w; nothing was submitted", path, err)}
	}
	job, err := nomad.ParseHCL(string(hcl), "")
	if err != nil {
		return err
	}
	if queued {
		// A job still in its queue (or preempted, to be queued again)
		// is refused before anything of it is touched.
		if err := stillQueued(ctx, f, job, t.Name); err != nil {
			return &ExitError{Code: 1, Err: fmt.Errorf("%s: %w; nothing was submitted", path, err)}
		}
	}
	if err := replaceFinished(nomad, out, t.Name); err != nil {
		return err
	}
	// Each submission is a new run: its own checkpoint directory (the driver
	// reads this stamp, and an image job's containers mount the directory
	// it names), so it does not resume its predecessor's end. It replaces
	// the rendered default.
	if job.Meta == nil {
		job.Meta = map[string]string{}
	}
	job.Meta[contract.MetaRun] = strconv.FormatInt(f.Now().Unix(), 10)
	plan, err := nomad.Plan(job)
	if err != nil {
		return err
	}
	why := explain.Placement(ask, plan.FailedTGAllocs[render.Group], nodes)
	if why != "" && o.NoQueue {
		fmt.Fprintf(out, "%s cannot be placed now: %s\n", t.Name, why)
		return &ExitError{Code: ExitNotPlaced, Err: errors.New("not placed (--no-queue): nothing was registered")}
	}
	res.Job = t.Name
	if queued {
		res.Queued = true
		return submitQueued(ctx, f, o, t, job, why, out, res)
	}
	reg, err := nomad.Register(job)
	if err != nil {
		return err
	}
	res.EvalID, res.Outcome = reg.EvalID, "registered"
	fmt.Fprintf(out, "submitted %s: %d worker(s) × %d GPU(s), evaluation %s\n", t.Name, t.Workers, t.GPUsPerWorker, short(reg.EvalID))
	if why != "" {
		fmt.Fprintf(out, "queued: %s\n", why)
	}
	if o.Detach {
		fmt.Fprintf(out, "follow it: gpujob status %s\n", t.Name)
		return nil
	}
	w := &watcher{api: nomad, out: &lockedWriter{w: out}, job: t.Name, workers: t.Workers, now: f.Now, logs: o.Logs,
		since: reg.JobModifyIndex}
	outcome, err := w.run(ctx)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(out, "stopped watching; %s keeps running: gpujob status %s\n", t.Name, t.Name)
			return nil
		}
		return err
	}
	if !outcome.ok {
		res.Outcome = "failed"
		return &ExitError{Code: 1, Err: fmt.Errorf("job %s failed: %s", t.Name, outcome.reason)}
	}
	res.Outcome = "complete"
	return nil
}

// replaceFinished purges a finished job of the same name (Nomad would not
// run an unchanged batch job again) and refuses to replace a live one.
func replaceFinished(nomad nomadapi.API, out io.Writer, name string) error {
	old, err := nomad.Job(name)
	if err != nil {
		if gpujobs.IsNotFound(err) {
			return nil
		}
		return err
	}
	if old.Status == nil || *old.Status != "dead" {
		return &ExitError{Code: 1, Err: fmt.Errorf("job %s is already %s: stop it first (gpujob stop %s) or rename the spec's train block",
			name, deref(old.Status), name)}
	}
	fmt.Fprintf(out, "replacing the finished job %s\n", name)
	_, err = nomad.Deregister(name, true)
	return err
}

func deref(s *string) string {
	if s == nil {
		return "registered"
	}
	return *s
}

func mostGPUs(nodes []explain.Node) int {
	m := 0
	for _, n := range nodes {
		m = max(m, n.GPUs)
	}
	return m
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// lockedWriter serialises whole writes from the watcher and the log
// streams, so lines never interleave.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
