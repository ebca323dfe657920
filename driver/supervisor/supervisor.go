package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/gpujob/gpujob/driver/rendezvous"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
	"github.com/gpujob/gpujob/internal/taskevent"
)

// Coordinator is what the supervisor needs of the group's rendezvous; the
// Consul implementation is rendezvous.Rendezvous. Join retries transient
// Consul errors itself and returns only terminal ones; Fail and Done retry
// until their context ends.
type Coordinator interface {
	Join(ctx context.Context) (*rendezvous.Round, error)
	Watch(ctx context.Context, r *rendezvous.Round) <-chan rendezvous.Failure
	Fail(ctx context.Context, r *rendezvous.Round, f rendezvous.Failure) error
	Done(ctx context.Context, r *rendezvous.Round) error
}

// ExitStopped is the supervisor's exit code when Nomad stopped the task.
const ExitStopped = 143

const (
	defaultStopGrace   = 3 * time.Second
	defaultJoinTimeout = 5 * time.Minute
)

// Supervisor runs one member of a training group until the group succeeds,
// fails for good, or Nomad stops the task.
type Supervisor struct {
	mu      sync.Mutex
	current *workers // the running round's workers, for Signal

	spec   *Spec
	coord  Coordinator
	env    []string
	stdout io.Writer
	stderr io.Writer
	events *eventLog
	// leaveBy is the deadline for leaving the group once Run returned.
	leaveBy time.Time
	// stopSignal is when Main's stop signal came (nil in tests that
	// cancel Run's context themselves): a container member's stop
	// deadline counts from it.
	stopSignal *stopClock
	// trial is the sweep trial's records (SetTrial); nil for a task that
	// is no trial. trialStop is the request Run ended on, if it did.
	trial     Trial
	trialStop *sweepkv.StopRequest
}

// New returns a supervisor for spec that rendezvouses through coord and
// gives its workers env (the task's environment) plus the torchrun variables.
func New(spec *Spec, coord Coordinator, env []string, stdout, stderr io.Writer) (*Supervisor, error) {
	events, err := openEventLog(spec.EventsFile, stderr)
	if err != nil {
		return nil, err
	}
	return &Supervisor{spec: spec, coord: coord, env: env, stdout: stdout, stderr: stderr, events: events}, nil
}

// outcome is how a round ended for this member.
type outcome struct {
	kind    string // succeeded, local, remote, stopped
	exit    exit
	failure rendezvous.Failure
}

// LeaveDeadline is when leaving the group must be done by, once Run has
// returned: within the stop's kill_timeout after a stop, else a fixed bound.
func (s *Supervisor) LeaveDeadline() time.Time {
	if s.leaveBy.IsZero() {
		return time.Now().Add(defaultLeaveTimeout)
	}
	return s.leaveBy
}

func (s *Supervisor) stopGrace() time.Duration {
	if g := time.Duration(s.spec.StopGrace); g > 0 {
		return g
	}
	return defaultStopGrace
}

func (s *Supervisor) joinTimeout() time.Duration {
	if t := time.Duration(s.spec.JoinTimeout); t > 0 {
		return t
	}
	return defaultJoinTimeout
}

// planStop is how this stop spends the time Nomad gives it.
func (s *Supervisor) planStop() stopPlan {
	deadline, ok := stopDeadline(s.spec.StopDeadlineFile, time.Duration(s.spec.KillTimeout), s.stopSignal)
	p := planStop(time.Now(), deadline, ok, s.stopGrace())
	s.leaveBy = p.leaveBy
	return p
}

// Run is the member's life: join a round, run the workers, restart with the
// group until done. It returns the task's exit code. For a trial (SetTrial)
// it also ends on the trial's stop request, with 0.
func (s *Supervisor) Run(ctx context.Context) int {
	defer s.events.close()
	ctx, endWatch := s.watchStop(ctx)
	defer endWatch()
	if s.trial != nil && s.likelyRankZero() {
		s.trial.SetReporting(ctx, true)
	}
	spawn := newSpawner()
	defer spawn.close() // every path below has reaped the ranks
	var pool *zygotes
	if len(s.spec.Preload) > 0 {
		// Started now, so that the imports overlap the rendezvous.
		var err error
		if pool, err = newZygotes(s.spec, s.env, s.stderr, spawn.start); err != nil {
			fmt.Fprintf(s.stderr, "gpujob: preload: %v; starting the ranks cold\n", err)
		} else {
			defer pool.close() // before the spawner's thread goes
		}
	}
	var pace pacer
	roundStart := time.Time{}
	for {
		if !roundStart.IsZero() {
			if wait := pace.ended(roundStart, time.Now()); wait > 0 {
				fmt.Fprintf(s.stderr, "gpujob: %d rounds in a row ended within %s; waiting %s before joining the next\n", pace.quick, quickRound, wait)
				if !sleepCtx(ctx, wait) {
					return s.stopped(ctx, Placement{}, nil, nil)
				}
			}
		}
		roundStart = time.Now()
		round, err := s.coord.Join(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return s.stopped(ctx, Placement{}, nil, nil)
			}
			e := s.event(taskevent.Failed, Placement{})
			e.Failure = taskevent.Failure{Member: s.spec.Self.Name, Reason: joinFailure(err)}
			s.events.emit(e)
			return 1
		}
		p := placement(round)
		s.reportFor(ctx, p)
		joined := s.event(taskevent.Joined, p)
		if pool != nil {
			joined.Warning = pool.prepare(ctx)
		}
		s.events.emit(joined)

		w, err := startWorkersWith(s.spec, p, s.env, s.stdout, s.stderr, spawn.start, pool, s.rankOutput)
		if err != nil {
			if code, ok := s.endRound(ctx, round, p, rendezvous.Failure{Member: s.spec.Self.Name, Reason: err.Error(), ExitCode: -1}); !ok {
				return code
			}
			continue
		}
		s.recordGroups(w, pool)
		s.setCurrent(w)
		out := s.supervise(ctx, round, w)
		s.setCurrent(nil)
		switch out.kind {
		case "succeeded":
			// Reap what the ranks left in their groups.
			w.stop(0)
			e := s.event(taskevent.Succeeded, p)
			doneCtx, cancel := context.WithTimeout(ctx, s.joinTimeout())
			err := s.coord.Done(doneCtx, round)
			cancel()
			if err != nil {
				// The ranks succeeded: that is the task's outcome. The
				// group's other members finish on their own ranks' exits.
				e.Warning = fmt.Sprintf("recording the success in Consul failed: %v", err)
			}
			s.events.emit(e)
			return 0
		case "stopped":
			return s.stopped(ctx, p, w, round)
		case "local":
			w.stop(s.stopGrace())
			if req, ok := s.trialStopRequest(ctx); ok {
				return s.trialStopped(ctx, p, round, req)
			}
			reason := fmt.Sprintf("rank %d exited %d", out.exit.Rank, out.exit.Code)
			if out.exit.Err != nil {
				reason = fmt.Sprintf("rank %d: %v", out.exit.Rank, out.exit.Err)
			}
			if code, ok := s.endRound(ctx, round, p, rendezvous.Failure{Member: s.spec.Self.Name, Reason: reason, ExitCode: out.exit.Code}); !ok {
				return code
			}
		case "remote":
			w.stop(s.stopGrace())
			if req, ok := s.trialStopRequest(ctx); ok {
				return s.trialStopped(ctx, p, round, req)
			}
			e := s.event(taskevent.Restarting, p)
			e.Remote = true
			e.Failure = taskevent.Failure{Member: out.failure.Member, Reason: out.failure.Reason, ExitCode: out.failure.ExitCode}
			s.events.emit(e)
		}
	}
}

// event is a milestone of kind in the round p describes (the zero
// Placement before any round).
func (s *Supervisor) event(kind taskevent.Kind, p Placement) taskevent.Event {
	return taskevent.Event{
		Kind:        kind,
		Round:       p.Round,
		NodeRank:    p.NodeRank,
		NNodes:      p.NNodes,
		FirstRank:   p.RankOffset,
		LastRank:    p.RankOffset + s.spec.NProcPerNode - 1,
		WorldSize:   p.WorldSize,
		Master:      p.MasterAddr,
		Restarts:    p.Restarts,
		MaxRestarts: s.spec.MaxRestarts,
	}
}

// recordGroups tells the driver which process groups to kill should the
// supervisor die; failing to is worth a line, not the round.
func (s *Supervisor) recordGroups(w *workers, pool *zygotes) {
	if s.spec.GroupsFile == "" {
		return
	}
	groups := w.groups
	if pool != nil {
		groups = append(append([]ProcessGroup(nil), groups...), pool.groups()...)
	}
	if err := writeGroups(s.spec.GroupsFile, groups); err != nil {
		fmt.Fprintf(s.stderr, "gpujob: %v\n", err)
	}
}

func (s *Supervisor) setCurrent(w *workers) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current = w
}

// Signal passes a signal (from `nomad alloc signal`) to every local rank
// process; between rounds there is no one to receive it.
func (s *Supervisor) Signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current != nil {
		s.current.signal(sig)
	}
}

// endRound reports this member's failure to the group, which ends the round
// for everyone and spends one restart of the shared budget. ok is false when
// the member cannot go on; code is then its exit code. Reporting is bounded
// by the join timeout: a member that cannot tell the group would otherwise
// wait forever for a round that never comes.
func (s *Supervisor) endRound(ctx context.Context, round *rendezvous.Round, p Placement, f rendezvous.Failure) (code int, ok bool) {
	e := s.event(taskevent.Restarting, p)
	e.Failure = taskevent.Failure{Member: f.Member, Reason: f.Reason, ExitCode: f.ExitCode}
	s.events.emit(e)
	failCtx, cancel := context.WithTimeout(ctx, s.joinTimeout())
	defer cancel()
	if err := s.coord.Fail(failCtx, round, f); err != nil {
		if ctx.Err() != nil {
			return s.stopped(ctx, p, nil, nil), false
		}
		failed := s.event(taskevent.Failed, p)
		failed.Failure = taskevent.Failure{Member: f.Member, ExitCode: f.ExitCode,
			Reason: fmt.Sprintf("%s; reporting it to the group failed: %v", f.Reason, err)}
		s.events.emit(failed)
		return 1, false
	}
	return 0, true
}

// supervise waits for the round to end: every local rank done, one failing,
// the group ending it, or Nomad stopping the task.
func (s *Supervisor) supervise(ctx context.Context, round *rendezvous.Round, w *workers) outcome {
	watchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch := s.coord.Watch(watchCtx, round)
	succeeded := 0
	for {
		select {
		case e := <-w.exits:
			if e.Code != 0 || e.Err != nil {
				return outcome{kind: "local", exit: e}
			}
			if succeeded++; succeeded == s.spec.NProcPerNode {
				return outcome{kind: "succeeded"}
			}
		case f, ok := <-watch:
			if !ok {
				watch = nil // the watch ended without a failure: keep waiting for the ranks
				continue
			}
			return outcome{kind: "remote", failure: f}
		case <-ctx.Done():
			return outcome{kind: "stopped"}
		}
	}
}

// placement converts a round into this member's placement.
func placement(r *rendezvous.Round) Placement {
	return Placement{
		Round:      r.Number,
		Restarts:   r.Restarts,
		NodeRank:   r.NodeRank,
		NNodes:     len(r.Members),
		RankOffset: r.RankOffset,
		WorldSize:  r.WorldSize,
		MasterAddr: r.Master.Addr,
	}
}

// joinFailure words a failed join for the task event.
func joinFailure(err error) string {
	var timeout *rendezvous.JoinTimeoutError
	var exhausted *rendezvous.RestartsExhaustedError
	switch {
	case errors.As(err, &timeout), errors.As(err, &exhausted):
		return err.Error()
	}
	return "rendezvous failed: " + err.Error()
}
