// Package stop is `gpujob stop JOB`: deregister a training job and wait
// until none of its allocations runs.
package stop

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/queues"
)

// Options is what the command's arguments and flags ask for.
type Options struct {
	// Job is the job ID (the argument).
	Job    string
	Purge  bool
	Detach bool
}

// NewCmd returns the stop command.
func NewCmd(f *factory.Factory) *cobra.Command { return NewCmdWith(f, nil) }

// NewCmdWith is NewCmd running runF instead of the command when runF is not
// nil: a test checks the Options the arguments parse into without running.
func NewCmdWith(f *factory.Factory, runF func(context.Context, *Options) error) *cobra.Command {
	o := &Options{}
	cmd := &cobra.Command{
		Use:   "stop JOB",
		Short: "Stop a training job",
		Long: `Stop deregisters a training job from Nomad, which stops every member (the
driver stops each member's processes: SIGTERM, then SIGKILL after the grace
period), then waits until none of the job's allocations is running, printing
each member as it stops. --purge also removes the job from Nomad's state, so
its name is free and it no longer shows in gpujob list; --detach returns once
the job is deregistered. Checkpoints are kept.

A job that went through a queue (queue mode, gpujob queue) has a record in
Consul: stop deletes it first, so the admission controller neither starts a
job still waiting in its queue (stop withdraws it, and there is nothing in
Nomad to stop) nor queues a stopped one again.`,
		Example: `  gpujob stop bert-finetune
  gpujob stop --purge bert-finetune
  gpujob stop --detach bert-finetune`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Job = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return run(ctx, f, o, o.Job) })
		},
	}
	cmd.Flags().BoolVar(&o.Purge, "purge", false, "also remove the job from Nomad's state")
	cmd.Flags().BoolVar(&o.Detach, "detach", false, "return once the job is deregistered, without waiting")
	return cmd
}

func run(ctx context.Context, f *factory.Factory, o *Options, jobID string) error {
	nomad, err := f.Nomad()
	if err != nil {
		return err
	}
	out := f.IO.Out
	_, loadErr := gpujobs.LoadJob(nomad, jobID)
	if loadErr != nil && !notFound(nomad, jobID) {
		return loadErr
	}
	// The job's queue record goes first: once it is gone the admission
	// controller neither admits the job nor requeues it after the stop.
	withdrawn, err := queues.Stop(ctx, f, jobID, out)
	switch {
	case err != nil && loadErr != nil:
		return fmt.Errorf("%w, and its queue record could not be read: %v", loadErr, err)
	case err != nil:
		fmt.Fprintf(f.IO.ErrOut, "warning: its queue record could not be read (%v); if it went through a queue, stop it again once Consul answers\n", err)
	}
	if loadErr != nil {
		if withdrawn {
			// The controller may have been registering it at that moment.
			return queues.StopAdmittedMeanwhile(nomad, jobID, out)
		}
		return loadErr
	}
	evalID, err := nomad.Deregister(jobID, o.Purge)
	if gpujobs.IsNotFound(err) {
		return fmt.Errorf("job %q not found", jobID)
	}
	if err != nil {
		return err
	}
	verb := "stopped"
	if o.Purge {
		verb = "stopped and purged"
	}
	fmt.Fprintf(out, "Job %s %s (evaluation %s).\n", jobID, verb, gpujobs.ShortID(evalID))
	if o.Detach {
		fmt.Fprintf(out, "Not waiting for its allocations (--detach): gpujob status %s\n", jobID)
		return nil
	}
	return Wait(ctx, nomad, out, jobID)
}

// Wait blocks (with blocking queries) until none of the job's allocations is
// pending or running, printing each one as it stops.
func Wait(ctx context.Context, nomad nomadapi.API, out io.Writer, jobID string) error {
	seen := map[string]string{} // alloc ID → client status printed
	index := uint64(0)
	first := true
	for {
		stubs, meta, err := query(ctx, nomad, jobID, index)
		if gpujobs.IsNotFound(err) {
			fmt.Fprintln(out, "The job and its allocations are gone.")
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				fmt.Fprintf(out, "Stopped waiting; Nomad goes on stopping %s: gpujob status %s\n", jobID, jobID)
				return nil
			}
			return err
		}
		if meta != nil && meta.LastIndex == index && !first {
			continue // the wait timed out without a change
		}
		if meta != nil {
			index = meta.LastIndex
		}
		sort.Slice(stubs, func(i, j int) bool { return stubs[i].Name < stubs[j].Name })
		running := 0
		for _, s := range stubs {
			if live(s.ClientStatus) {
				running++
			}
		}
		for _, s := range stubs {
			if prev, ok := seen[s.ID]; !first && ok && live(prev) && !live(s.ClientStatus) {
				fmt.Fprintf(out, "  %s (%s) on %s: %s (%d still running)\n",
					s.Name, gpujobs.ShortID(s.ID), s.NodeName, s.ClientStatus, running)
			}
			seen[s.ID] = s.ClientStatus
		}
		if running == 0 {
			if first {
				fmt.Fprintln(out, "No allocation is running.")
			} else {
				fmt.Fprintln(out, "All allocations stopped.")
			}
			return nil
		}
		if first {
			fmt.Fprintf(out, "Waiting for %d allocation(s) to stop…\n", running)
		}
		first = false
	}
}

// notFound: Nomad has no job of that ID.
func notFound(nomad nomadapi.API, jobID string) bool {
	_, err := nomad.Job(jobID)
	return gpujobs.IsNotFound(err)
}

// live: the allocation's task may still run. An allocation on a
// disconnected client ("unknown") is not waited for.
func live(clientStatus string) bool {
	return clientStatus == "pending" || clientStatus == "running"
}

// query is one blocking query on the job's allocations, abandoned (not
// cancelled: the API has no context) when ctx ends.
func query(ctx context.Context, nomad nomadapi.API, jobID string, index uint64) ([]*api.AllocationListStub, *api.QueryMeta, error) {
	type result struct {
		stubs []*api.AllocationListStub
		meta  *api.QueryMeta
		err   error
	}
	ch := make(chan result, 1)
	go func() {
		q := &api.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Minute}
		if index == 0 {
			q = nil
		}
		s, m, err := nomad.JobAllocations(jobID, q)
		ch <- result{s, m, err}
	}()
	select {
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case r := <-ch:
		return r.stubs, r.meta, r.err
	}
}
