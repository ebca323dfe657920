package sweep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/sweepcreds"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// stopWait bounds how long stop waits for the controller, then for the
// trials' allocations, before doing the rest itself.
const stopWait = 60 * time.Second

// StopOptions is what `sweep stop`'s arguments and flags ask for.
type StopOptions struct {
	// Name is the sweep (the argument).
	Name string
	// Purge also removes the sweep's jobs and its records in Consul.
	Purge bool
}

func newStopCmd(f *factory.Factory) *cobra.Command { return NewStopCmd(f, nil) }

// NewStopCmd is the command running runF instead when runF is not nil: a
// test checks the Options the arguments parse into without running.
func NewStopCmd(f *factory.Factory, runF func(context.Context, *StopOptions) error) *cobra.Command {
	o := &StopOptions{}
	cmd := &cobra.Command{
		Use:   "stop SWEEP",
		Short: "Stop a sweep and its trials; --purge also removes its jobs and records",
		Long: `Stop asks the sweep's controller to stop every running trial (each trial's
task event says it was stopped by gpujob sweep stop) and waits until it has.
If no controller runs, stop stops the trials' jobs itself. The results stay
in Consul: gpujob sweep status and best still show them, and extend can
continue the sweep.

--purge then removes everything the sweep made: the controller's and the
trials' Nomad jobs, and the sweep's records in Consul.`,
		Example: `  gpujob sweep stop toy-lr
  gpujob sweep stop --purge toy-lr`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			if runF != nil {
				return runF(cmd.Context(), o)
			}
			e, err := newEnv(f, true)
			if err != nil {
				return err
			}
			return e.stop(cmd.Context(), o.Name, o.Purge)
		},
	}
	cmd.Flags().BoolVar(&o.Purge, "purge", false, "also remove the sweep's jobs and its records in Consul")
	return cmd
}

func (e *env) stop(ctx context.Context, name string, purge bool) error {
	out := e.f.IO.Out
	var creds *sweepcreds.Issuer
	if purge {
		// With ACLs, purge ends by revoking the controller's credentials:
		// a token that cannot is refused before anything is removed.
		var err error
		if creds, err = e.credentials(name); err != nil {
			return err
		}
		if err := creds.Check(); err != nil {
			return err
		}
	}
	_, _, index, err := e.load(ctx, name)
	if err != nil && !(purge && index == 0) {
		return err
	}
	exists := err == nil
	if exists {
		st, err := e.update(ctx, name, func(st *controller.State) error {
			if !st.Status.Terminal() {
				st.StopRequested = true
			}
			return nil
		})
		if err != nil {
			return err
		}
		if !st.Ended.IsZero() {
			fmt.Fprintf(out, "sweep %s had already ended (%s)\n", name, st.Status)
		} else if err := e.awaitStopped(ctx, name); err != nil {
			return err
		}
	}
	if !purge {
		return nil
	}
	return e.purge(ctx, name, creds)
}

// awaitStopped waits for the controller to stop the trials and end; if no
// controller runs, or it does not end in time, stop does its work.
func (e *env) awaitStopped(ctx context.Context, name string) error {
	out := e.f.IO.Out
	ctlJob := controller.ControllerJobID(name)
	running := false
	if j, err := e.nomad.Job(ctlJob); err == nil && j.Status != nil && *j.Status != "dead" && (j.Stop == nil || !*j.Stop) {
		running = e.controllerTrouble(name) == ""
	}
	if running {
		fmt.Fprintf(out, "asked the controller of sweep %s to stop its trials; waiting (up to %s)\n", name, stopWait)
		wctx, cancel := context.WithTimeout(ctx, stopWait)
		defer cancel()
		key := sweepkv.StateKey(e.prefix, e.ns, name)
		var index uint64
		for {
			st, meta, err := getState(wctx, e.consul, key, index, time.Minute)
			if err != nil {
				break // timed out: do it here
			}
			index = meta.LastIndex
			if st != nil && !st.Ended.IsZero() {
				fmt.Fprintf(out, "sweep %s stopped: %s\n", name, countsText(stringCounts(st)))
				return nil
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fmt.Fprintf(out, "the controller did not finish in %s; stopping the trials here\n", stopWait)
	}
	// No controller: stop the active trials' jobs and record it.
	if _, err := e.nomad.Deregister(ctlJob, false); err != nil && !gpujobs.IsNotFound(err) {
		return err
	}
	// Its last round may still launch a trial: wait until it is gone.
	if err := e.awaitAllocsGone(ctx, []string{ctlJob}); err != nil {
		return err
	}
	st, err := e.update(ctx, name, func(st *controller.State) error {
		now := e.f.Now()
		for i := range st.Trials {
			t := &st.Trials[i]
			if t.State.Terminal() {
				continue
			}
			// The state is in Consul: stop no job it names but the
			// sweep's own trial of that index.
			if err := t.Check(name, i); err != nil {
				return fmt.Errorf("sweep %s: not stopping what its state names: %w", name, err)
			}
			if _, err := e.nomad.Deregister(t.JobID, false); err != nil && !gpujobs.IsNotFound(err) {
				return err
			}
			t.State, t.StoppedBy, t.Reason, t.Ended = controller.TrialStopped, controller.StoppedByUser, "the sweep was stopped", now
		}
		if !st.Status.Terminal() {
			st.Status, st.Reason = controller.StatusStopped, "stopped by gpujob sweep stop"
		}
		if st.Ended.IsZero() {
			st.Ended = now
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "sweep %s stopped: %s\n", name, countsText(stringCounts(st)))
	return nil
}

// getState reads the state at key with a blocking query from index (up to
// wait); nil when there is none.
func getState(ctx context.Context, c *consul.Client, key string, index uint64, wait time.Duration) (*controller.State, *consul.QueryMeta, error) {
	pair, meta, err := c.KV().Get(key, (&consul.QueryOptions{WaitIndex: index, WaitTime: wait}).WithContext(ctx))
	if err != nil {
		return nil, nil, err
	}
	if pair == nil {
		return nil, meta, nil
	}
	var st controller.State
	if err := json.Unmarshal(pair.Value, &st); err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", key, err)
	}
	return &st, meta, nil
}

func stringCounts(st *controller.State) map[string]int {
	c := map[string]int{}
	for s, n := range st.Counts() {
		c[string(s)] = n
	}
	return c
}

// purge removes the sweep's jobs: the controller first, waited on, so it
// launches nothing more; then every trial job the state names (and any
// other of the sweep's), waited on until no allocation runs, so no
// supervisor writes a record again; then its KV tree.
func (e *env) purge(ctx context.Context, name string, creds *sweepcreds.Issuer) error {
	out := e.f.IO.Out
	ctlJob := controller.ControllerJobID(name)
	if j, err := e.nomad.Job(ctlJob); err == nil && j.Meta[contract.MetaSweep] == name {
		if _, err := e.nomad.Deregister(ctlJob, true); err != nil && !gpujobs.IsNotFound(err) {
			return err
		}
	} else if err != nil && !gpujobs.IsNotFound(err) {
		return err
	}
	if err := e.awaitAllocsGone(ctx, []string{ctlJob}); err != nil {
		return err
	}
	jobs := map[string]bool{}
	if st, _, err := controller.LoadState(ctx, e.consul, e.prefix, e.ns, name); err != nil {
		return err
	} else {
		for _, t := range st.Trials {
			// Only what can be the sweep's trial job: the state is in
			// Consul, and a purge must never reach another job.
			if sweepjob.IsTrialJob(name, t.JobID) {
				jobs[t.JobID] = true
			}
		}
	}
	stubs, _, err := e.nomad.Jobs(&api.QueryOptions{Prefix: name + "-", Params: map[string]string{"meta": "true"}})
	if err != nil {
		return err
	}
	for _, j := range stubs {
		if j.Meta[contract.MetaSweep] == name && j.ID != ctlJob {
			jobs[j.ID] = true
		}
	}
	ids := make([]string, 0, len(jobs))
	for id := range jobs {
		ids = append(ids, id)
		if _, err := e.nomad.Deregister(id, true); err != nil && !gpujobs.IsNotFound(err) {
			return err
		}
	}
	// Allocations of purged jobs are still listed by job ID.
	if err := e.awaitAllocsGone(ctx, ids); err != nil {
		return err
	}
	prefix := sweepkv.SweepKey(e.prefix, e.ns, name) + "/"
	if _, err := e.consul.KV().DeleteTree(prefix, (&consul.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("removing %s: %w", prefix, err)
	}
	// Last: the controller is gone, so nothing acts with its tokens.
	what := " and its records in Consul"
	if creds.Mode.Any() {
		if err := creds.Revoke(); err != nil {
			return fmt.Errorf("%w; the jobs and records of sweep %s are gone: run stop --purge again to remove the rest", err, name)
		}
		what = ", its records in Consul and its controller's ACL tokens and policies"
	}
	fmt.Fprintf(out, "purged sweep %s: its controller, %d trial job(s)%s\n", name, len(ids), what)
	return nil
}

// awaitAllocsGone waits until no allocation of the purged jobs runs.
func (e *env) awaitAllocsGone(ctx context.Context, jobs []string) error {
	deadline := time.Now().Add(stopWait)
	for _, id := range jobs {
		for {
			allocs, _, err := e.nomad.JobAllocations(id, nil)
			if err != nil && !gpujobs.IsNotFound(err) {
				return err
			}
			live := 0
			for _, a := range allocs {
				if !gpujobs.Terminal(a.ClientStatus) {
					live++
				}
			}
			if live == 0 {
				break
			}
			if time.Now().After(deadline) {
				return errors.New("the sweep's allocations did not stop within " + stopWait.String() + "; its records were kept: run stop --purge again")
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return nil
}
