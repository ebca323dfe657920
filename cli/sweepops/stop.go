package sweepops

import (
	"context"
	"errors"
	"fmt"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/sweepcreds"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// StopWait bounds how long Stop waits for the controller, then for the
// trials' allocations, before doing the rest itself.
const StopWait = 60 * time.Second

// StopStep is a step of Stop its caller is told of as it happens.
type StopStep int

const (
	// StopEnded: the sweep had already ended (StopEvent.Status), so
	// there was nothing to stop.
	StopEnded StopStep = iota + 1
	// StopAsked: the sweep's controller runs and was asked to stop the
	// trials; Stop waits for it to end the sweep, up to StopWait.
	StopAsked
	// StopTimedOut: the controller did not end the sweep within
	// StopWait; Stop stops the trials itself.
	StopTimedOut
	// StopDone: the sweep is stopped; StopEvent.Counts has its trials by
	// state.
	StopDone
)

// StopEvent is what Stop tells of a step.
type StopEvent struct {
	Step StopStep
	// Status is the sweep's, with StopEnded.
	Status controller.Status
	// Counts is the trials by state (TrialCounts), with StopDone.
	Counts map[string]int
}

// Purged is what Stop's purge removed.
type Purged struct {
	// TrialJobs is how many trial jobs were purged.
	TrialJobs int
	// Revoked: the clusters enforce ACLs, and the controller's tokens and
	// policies were revoked too.
	Revoked bool
}

// Stop stops sweep name: it asks the sweep's controller to stop every
// running trial and waits until it has; if no controller runs, or it does
// not end in StopWait, Stop stops the trials' jobs and records it itself.
// The results stay in Consul. With purge it then removes everything the
// sweep made (its jobs, its records in Consul, with ACLs its controller's
// credentials) and says what in Purged; a sweep with neither record nor
// state may still be purged. progress (nil: none) is told of each step as
// it happens.
func (s *Sweeps) Stop(ctx context.Context, name string, purge bool, progress func(StopEvent)) (*Purged, error) {
	if progress == nil {
		progress = func(StopEvent) {}
	}
	var creds *sweepcreds.Issuer
	if purge {
		// With ACLs, purge ends by revoking the controller's credentials:
		// a token that cannot is refused before anything is removed.
		var err error
		if creds, err = s.Credentials(name); err != nil {
			return nil, err
		}
		if err := creds.Check(); err != nil {
			return nil, err
		}
	}
	_, _, index, err := s.Load(ctx, name)
	if err != nil && !(purge && index == 0) {
		return nil, err
	}
	exists := err == nil
	if exists {
		st, err := s.Update(ctx, name, func(st *controller.State) error {
			if !st.Status.Terminal() {
				st.StopRequested = true
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if !st.Ended.IsZero() {
			progress(StopEvent{Step: StopEnded, Status: st.Status})
		} else if err := s.awaitStopped(ctx, name, progress); err != nil {
			return nil, err
		}
	}
	if !purge {
		return nil, nil
	}
	return s.purge(ctx, name, creds)
}

// awaitStopped waits for the controller to stop the trials and end; if no
// controller runs, or it does not end in time, it does the controller's
// work.
func (s *Sweeps) awaitStopped(ctx context.Context, name string, progress func(StopEvent)) error {
	ctlJob := controller.ControllerJobID(name)
	running := false
	if j, err := s.Nomad.Job(ctlJob); err == nil && j.Status != nil && *j.Status != "dead" && (j.Stop == nil || !*j.Stop) {
		running = s.ControllerTrouble(name) == ""
	}
	if running {
		progress(StopEvent{Step: StopAsked})
		wctx, cancel := context.WithTimeout(ctx, StopWait)
		defer cancel()
		var index uint64
		for {
			st, meta, err := s.NextState(wctx, name, index, time.Minute)
			if err != nil {
				break // timed out: do it here
			}
			index = meta.LastIndex
			if st != nil && !st.Ended.IsZero() {
				progress(StopEvent{Step: StopDone, Counts: TrialCounts(st)})
				return nil
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		progress(StopEvent{Step: StopTimedOut})
	}
	// No controller: stop the active trials' jobs and record it.
	if _, err := s.Nomad.Deregister(ctlJob, false); err != nil && !gpujobs.IsNotFound(err) {
		return err
	}
	// Its last round may still launch a trial: wait until it is gone.
	if err := s.awaitAllocsGone(ctx, []string{ctlJob}); err != nil {
		return err
	}
	// In queue mode its trials may wait in the queue: withdrawn first, so
	// the queue admits none of them after their jobs were stopped.
	if err := s.withdrawQueued(ctx, name); err != nil {
		return err
	}
	st, err := s.Update(ctx, name, func(st *controller.State) error {
		now := s.now()
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
			if _, err := s.Nomad.Deregister(t.JobID, false); err != nil && !gpujobs.IsNotFound(err) {
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
	progress(StopEvent{Step: StopDone, Counts: TrialCounts(st)})
	return nil
}

// purge removes the sweep's jobs: the controller first, waited on, so it
// launches nothing more; then every trial job the state names (and any
// other of the sweep's), waited on until no allocation runs, so no
// supervisor writes a record again; then its KV tree; last, with ACLs, the
// controller's credentials.
func (s *Sweeps) purge(ctx context.Context, name string, creds *sweepcreds.Issuer) (*Purged, error) {
	ctlJob := controller.ControllerJobID(name)
	if j, err := s.Nomad.Job(ctlJob); err == nil && j.Meta[contract.MetaSweep] == name {
		if _, err := s.Nomad.Deregister(ctlJob, true); err != nil && !gpujobs.IsNotFound(err) {
			return nil, err
		}
	} else if err != nil && !gpujobs.IsNotFound(err) {
		return nil, err
	}
	if err := s.awaitAllocsGone(ctx, []string{ctlJob}); err != nil {
		return nil, err
	}
	if err := s.withdrawQueued(ctx, name); err != nil {
		return nil, err
	}
	jobs := map[string]bool{}
	if st, _, err := controller.LoadState(ctx, s.Consul, s.Prefix, s.Namespace, name); err != nil {
		return nil, err
	} else {
		for _, t := range st.Trials {
			// Only what can be the sweep's trial job: the state is in
			// Consul, and a purge must never reach another job.
			if sweepjob.IsTrialJob(name, t.JobID) {
				jobs[t.JobID] = true
			}
		}
	}
	stubs, _, err := s.Nomad.Jobs(&api.QueryOptions{Prefix: name + "-", Params: map[string]string{"meta": "true"}})
	if err != nil {
		return nil, err
	}
	for _, j := range stubs {
		if j.Meta[contract.MetaSweep] == name && j.ID != ctlJob {
			jobs[j.ID] = true
		}
	}
	ids := make([]string, 0, len(jobs))
	for id := range jobs {
		ids = append(ids, id)
		if _, err := s.Nomad.Deregister(id, true); err != nil && !gpujobs.IsNotFound(err) {
			return nil, err
		}
	}
	// Allocations of purged jobs are still listed by job ID.
	if err := s.awaitAllocsGone(ctx, ids); err != nil {
		return nil, err
	}
	prefix := sweepkv.SweepKey(s.Prefix, s.Namespace, name) + "/"
	if _, err := s.Consul.KV().DeleteTree(prefix, (&consul.WriteOptions{}).WithContext(ctx)); err != nil {
		return nil, fmt.Errorf("removing %s: %w", prefix, err)
	}
	// Last: the controller is gone, so nothing acts with its tokens.
	out := &Purged{TrialJobs: len(ids)}
	if creds.Mode.Any() {
		if err := creds.Revoke(); err != nil {
			return nil, fmt.Errorf("%w; the jobs and records of sweep %s are gone: run stop --purge again to remove the rest", err, name)
		}
		out.Revoked = true
	}
	return out, nil
}

// withdrawQueued removes the queue records of the sweep's trials (queue
// mode: its controller queued them rather than registering them).
func (s *Sweeps) withdrawQueued(ctx context.Context, name string) error {
	if _, err := controller.DeleteTrialRecords(ctx, s.Consul, s.QueuePrefix, s.Namespace, name); err != nil {
		return fmt.Errorf("sweep %s: withdrawing its queued trials (a token of gpujob acl policy consul-queue-submit --namespace %s may): %w",
			name, s.Namespace, err)
	}
	return nil
}

// awaitAllocsGone waits until no allocation of the jobs runs.
func (s *Sweeps) awaitAllocsGone(ctx context.Context, jobs []string) error {
	deadline := time.Now().Add(StopWait)
	for _, id := range jobs {
		for {
			allocs, _, err := s.Nomad.JobAllocations(id, nil)
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
				return errors.New("the sweep's allocations did not stop within " + StopWait.String() + "; its records were kept: run stop --purge again")
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
