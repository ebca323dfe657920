// Package list is `gpujob list`: the cluster's training jobs.
package list

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/queues"
	"github.com/gpujob/gpujob/internal/contract"
)

// Job is one row of `gpujob list --json` (a JSON array of these).
type Job struct {
	Name      string `json:"name"` // the job ID
	Namespace string `json:"namespace"`
	// State: pending, running, complete, failed or stopped (as in
	// gpujob status, from Nomad's status and summary); NomadStatus is
	// Nomad's (pending, running, dead).
	State         string    `json:"state"`
	NomadStatus   string    `json:"nomad_status"`
	Workers       int       `json:"workers"`         // -1 when the job's meta does not say
	GPUsPerWorker int       `json:"gpus_per_worker"` // -1 when the job's meta does not say
	Submitted     time.Time `json:"submitted"`
	// Counts is Nomad's summary of the job's allocations, every version
	// (pending = queued + starting).
	Counts gpujobs.Counts `json:"counts"`
	// Queue is the job's place in its queue when it went through one
	// (a queue configuration exists): state, position, reason, estimated
	// start, preemptions. A job the queue has not admitted yet has no Nomad
	// job: its State is queued (or refused), NomadStatus empty.
	Queue *queues.Info `json:"queue,omitempty"`
}

// Options is what the command's arguments and flags ask for.
type Options struct {
	JSON bool
}

// NewCmd returns the list command.
func NewCmd(f *factory.Factory) *cobra.Command { return NewCmdWith(f, nil) }

// NewCmdWith is NewCmd running runF instead of the command when runF is not
// nil: a test checks the Options the arguments parse into without running.
func NewCmdWith(f *factory.Factory, runF func(context.Context, *Options) error) *cobra.Command {
	o := &Options{}
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the training jobs",
		Long: `List shows the training jobs gpujob submitted (Nomad jobs whose meta has
gpujob = "train"), newest first: name, state, workers, GPUs per worker, when it
was submitted, and its allocations by state. Other Nomad jobs are left out.

Jobs still in their queue (queue mode: a queue configuration exists, and
the admission controller has not started them) have no Nomad job yet: they
are listed as queued (or refused), each followed by its place, its reason
in words and its estimated start; -json gives every job that went through a
queue its queue fields ("queue": state, position, reason, estimated_start,
preempted_by, …).`,
		Example: `  gpujob list
  gpujob list --json | jq -r '.[] | select(.state == "running") | .name'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return run(ctx, f, o) })
		},
	}
	cmd.Flags().BoolVar(&o.JSON, "json", false, "print JSON")
	return cmd
}

func run(ctx context.Context, f *factory.Factory, o *Options) error {
	nomad, err := f.Nomad()
	if err != nil {
		return err
	}
	jobs, err := Collect(nomad)
	if err != nil {
		return err
	}
	now := time.Now
	if f.Now != nil {
		now = f.Now
	}
	var lines map[string]string
	if r, ok := queues.RecordsOf(f); ok {
		ns := queues.Namespace(f.Namespace)
		if ns == "*" {
			ns = ""
		}
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		entries, err := r.List(qctx, ns)
		cancel()
		if err != nil {
			// A cluster without queues may have no Consul reachable.
			fmt.Fprintf(f.IO.ErrOut, "warning: queued jobs left out: %v\n", err)
		}
		jobs, lines = WithQueue(jobs, entries, now())
	}
	if o.JSON {
		return gpujobs.PrintJSON(f.IO.Out, jobs)
	}
	if len(jobs) == 0 {
		fmt.Fprintln(f.IO.Out, "No training jobs.")
		return nil
	}
	t := gpujobs.NewTable(f.IO.Out, "NAME", "STATE", "WORKERS", "GPUS/WORKER", "SUBMITTED",
		"PENDING", "RUNNING", "COMPLETE", "FAILED", "LOST")
	for _, j := range jobs {
		t.Row(j.Name, j.State, num(j.Workers), num(j.GPUsPerWorker), gpujobs.Ago(now(), j.Submitted),
			strconv.Itoa(j.Counts.Pending), strconv.Itoa(j.Counts.Running), strconv.Itoa(j.Counts.Complete),
			strconv.Itoa(j.Counts.Failed), strconv.Itoa(j.Counts.Lost))
	}
	if err := t.Flush(); err != nil {
		return err
	}
	for _, j := range jobs {
		if l := lines[j.Namespace+"/"+j.Name]; l != "" {
			fmt.Fprintf(f.IO.Out, "%s: %s\n", j.Name, l)
		}
	}
	return nil
}

// WithQueue adds the queued training jobs to jobs: a job's queue fields
// where Nomad has it, a row of its own (state queued or refused) where
// the queue has not admitted it yet; newest first again. lines are the
// queued jobs' sentences by namespace/name, for people.
func WithQueue(jobs []Job, entries []*queues.Entry, now time.Time) ([]Job, map[string]string) {
	lines := map[string]string{}
	at := map[string]int{}
	for i, j := range jobs {
		at[j.Namespace+"/"+j.Name] = i
	}
	for _, e := range entries {
		if e.Record.Kind != "" && e.Record.Kind != "train" {
			continue // services and trials have lists of their own
		}
		name := e.Record.Namespace + "/" + e.Record.ID
		in := e.Info()
		if i, ok := at[name]; ok {
			jobs[i].Queue = in
			if in.State != "admitted" {
				lines[name] = e.Line(now)
			}
			continue
		}
		if in.State == "admitted" || in.State == "preempted" {
			continue // ended in Nomad; the controller forgets it
		}
		state := "queued"
		if in.State == "refused" {
			state = "refused"
		}
		jobs = append(jobs, Job{Name: e.Record.ID, Namespace: e.Record.Namespace, State: state, Workers: e.Record.Members,
			GPUsPerWorker: e.Record.PerMember.GPUs, Submitted: e.Record.SubmittedAt, Queue: in})
		lines[name] = e.Line(now)
	}
	sortJobs(jobs)
	return jobs, lines
}

func sortJobs(out []Job) {
	sort.SliceStable(out, func(a, b int) bool {
		if !out[a].Submitted.Equal(out[b].Submitted) {
			return out[a].Submitted.After(out[b].Submitted)
		}
		return out[a].Name < out[b].Name
	})
}

// Collect lists the training jobs, newest first. The job list is asked with
// meta (Nomad 1.6+ returns it then), so no job is read one by one.
func Collect(nomad nomadapi.API) ([]Job, error) {
	stubs, _, err := nomad.Jobs(&api.QueryOptions{Params: map[string]string{"meta": "true"}})
	if err != nil {
		return nil, err
	}
	out := []Job{}
	for _, s := range stubs {
		if s == nil || !gpujobs.IsTrainJob(s.Meta) {
			continue
		}
		j := Job{
			Name:          s.ID,
			Namespace:     s.Namespace,
			NomadStatus:   s.Status,
			Workers:       gpujobs.MetaInt(s.Meta, contract.MetaWorkers),
			GPUsPerWorker: gpujobs.MetaInt(s.Meta, contract.MetaGPUsPerWorker),
		}
		if s.SubmitTime > 0 {
			j.Submitted = time.Unix(0, s.SubmitTime).UTC()
		}
		if s.JobSummary != nil {
			for _, g := range s.JobSummary.Summary {
				j.Counts.Pending += g.Queued + g.Starting
				j.Counts.Running += g.Running
				j.Counts.Complete += g.Complete
				j.Counts.Failed += g.Failed
				j.Counts.Lost += g.Lost + g.Unknown
			}
		}
		j.State = state(s, j.Counts, j.Workers)
		out = append(out, j)
	}
	sortJobs(out)
	return out, nil
}

// state reads Nomad's job status with the summary, which counts every
// allocation the job ever had (replaced ones too): a dead job is complete
// when as many allocations completed as it has workers.
func state(s *api.JobListStub, c gpujobs.Counts, workers int) string {
	switch {
	case s.Stop:
		return "stopped"
	case s.Status == "dead" && c.Complete > 0 && (workers <= 0 || c.Complete >= workers):
		return "complete"
	case s.Status == "dead":
		return "failed"
	case s.Status == "running" && c.Running > 0:
		return "running"
	case s.Status == "running":
		return "pending"
	}
	return s.Status
}

func num(n int) string {
	if n < 0 {
		return "-"
	}
	return strconv.Itoa(n)
}
