package submit

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/queues"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/queue/admit"
)

// submitQueued is submit in queue mode (a queue configuration exists):
// the rendered job goes into its queue as a record, and the admission
// controller registers it once every member can be placed. Then, unless
// --detach, it follows the job's place in the queue until admitted, and
// the job as a direct submit does; a preempted job is followed back into
// the queue and on.
// stillQueued refuses a job whose queue record is not an ended admitted
// job's (queued, refused, preempted).
func stillQueued(ctx context.Context, f *factory.Factory, job *api.Job, name string) error {
	recs, ok := queues.RecordsOf(f)
	if !ok {
		return nil
	}
	e, err := recs.Get(ctx, jobNamespace(f, job), name)
	if err != nil {
		return err
	}
	if e != nil && e.State() != admit.StateAdmitted {
		return &queues.AlreadyQueuedError{Entry: e}
	}
	return nil
}

func jobNamespace(f *factory.Factory, job *api.Job) string {
	if job.Namespace != nil && *job.Namespace != "" {
		return *job.Namespace
	}
	return queues.Namespace(f.Namespace)
}

func submitQueued(ctx context.Context, f *factory.Factory, o *Options, t *spec.Train, job *api.Job, why string, out io.Writer, res *Result) error {
	c, err := f.Consul()
	if err != nil {
		return err
	}
	recs := queues.Records{Consul: c}
	ns := jobNamespace(f, job)
	e, err := recs.Enqueue(ctx, queues.EnqueueOptions{Job: job, Namespace: ns, Queue: t.Queue, Kind: admit.KindTrain,
		Priority: queues.SpecPriority(t.Priority), SubmittedBy: queues.SubmittedBy(ctx, c), Now: f.Now(), NoLiveJob: true})
	if err != nil {
		return &ExitError{Code: 1, Err: fmt.Errorf("%s: %w; nothing was submitted", o.Path, err)}
	}
	q := e.Info().Queue
	res.Namespace, res.Queue, res.Outcome = ns, e.Info(), "queued"
	fmt.Fprintf(out, "queued %s in %s: %d worker(s) × %d GPU(s); the admission controller starts it when all fit at once\n",
		t.Name, q, t.Workers, t.GPUsPerWorker)
	if why != "" {
		fmt.Fprintf(out, "not placeable now: %s\n", why)
	}
	if o.Detach {
		fmt.Fprintf(out, "follow it: gpujob status %s (gpujob stop %s withdraws it)\n", t.Name, t.Name)
		return nil
	}
	nomad, err := f.Nomad()
	if err != nil {
		return err
	}
	for {
		admitted, err := recs.AwaitAdmission(ctx, e, queues.AwaitOptions{Out: out, TTY: f.IO.IsTTY && !o.JSON, Now: f.Now})
		if admitted != nil {
			res.Queue = admitted.Info()
		}
		var refused *queues.RefusedError
		switch {
		case ctx.Err() != nil:
			fmt.Fprintf(out, "stopped watching; %s stays in queue %s: gpujob status %s (gpujob stop %s withdraws it)\n", t.Name, q, t.Name, t.Name)
			return nil
		case errors.As(err, &refused):
			res.Outcome = "refused"
			return &ExitError{Code: 1, Err: fmt.Errorf("%w; it stays queued as refused until the queues change: gpujob stop %s withdraws it", err, t.Name)}
		case errors.Is(err, queues.ErrWithdrawn):
			res.Outcome = "withdrawn"
			return &ExitError{Code: 1, Err: fmt.Errorf("job %s was withdrawn from queue %s (gpujob stop) before it finished", t.Name, q)}
		case err != nil:
			return err
		}
		cur, err := nomad.Job(t.Name)
		if err != nil {
			return fmt.Errorf("reading job %s, which the queue admitted: %w", t.Name, err)
		}
		var since uint64
		if cur.JobModifyIndex != nil {
			since = *cur.JobModifyIndex
		}
		w := &watcher{api: nomad, out: &lockedWriter{w: out}, job: t.Name, workers: t.Workers, now: f.Now, logs: o.Logs, since: since,
			requeued: func() bool {
				now, err := recs.Get(ctx, admitted.Record.Namespace, admitted.Record.ID)
				return err == nil && now != nil && now.RecordIndex == admitted.RecordIndex && now.State() != admit.StateAdmitted
			}}
		res.Outcome = "registered"
		outcome, err := w.run(ctx)
		if err != nil {
			if ctx.Err() != nil {
				fmt.Fprintf(out, "stopped watching; %s keeps running: gpujob status %s\n", t.Name, t.Name)
				return nil
			}
			return err
		}
		if outcome.requeued {
			if e, err = recs.Get(ctx, admitted.Record.Namespace, admitted.Record.ID); err != nil || e == nil {
				return &ExitError{Code: 1, Err: fmt.Errorf("job %s was preempted and its queue record is gone: %v", t.Name, err)}
			}
			fmt.Fprintln(out, e.Line(f.Now()))
			res.Queue, res.Outcome = e.Info(), "queued"
			continue
		}
		if !outcome.ok {
			res.Outcome = "failed"
			return &ExitError{Code: 1, Err: fmt.Errorf("job %s failed: %s", t.Name, outcome.reason)}
		}
		res.Outcome = "complete"
		return nil
	}
}
