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
)

// Coordinator is what the supervisor needs of the group's rendezvous; the
// Consul implementation is rendezvous.Rendezvous.
type Coordinator interface {
	Join(ctx context.Context) (*rendezvous.Round, error)
	Watch(ctx context.Context, r *rendezvous.Round) <-chan rendezvous.Failure
	Fail(ctx context.Context, r *rendezvous.Round, f rendezvous.Failure) error
	Done(ctx context.Context, r *rendezvous.Round) error
}

// ExitStopped is the supervisor's exit code when Nomad stopped the task.
const ExitStopped = 143

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

// Run is the member's life: join a round, run the workers, restart with the
// group until done. It returns the task's exit code.
func (s *Supervisor) Run(ctx context.Context) int {
	defer s.events.close()
	grace := time.Duration(s.spec.StopGrace)
	if grace <= 0 {
		grace = 3 * time.Second
	}
	for {
		round, err := s.coord.Join(ctx)
		if err != nil {
			if ctx.Err() != nil {
				s.events.emit(Event{Kind: EventStopped, Message: "stopped while waiting for the group"})
				return ExitStopped
			}
			s.events.emit(Event{Kind: EventFailed, Message: joinFailure(err)})
			return 1
		}
		p := placement(round)
		ranks := fmt.Sprintf("ranks %d-%d", p.RankOffset, p.RankOffset+s.spec.NProcPerNode-1)
		if s.spec.NProcPerNode == 1 {
			ranks = fmt.Sprintf("rank %d", p.RankOffset)
		}
		s.events.emit(Event{Kind: EventJoined, Round: round.Number, NodeRank: p.NodeRank, Restarts: p.Restarts,
			Message: fmt.Sprintf("joined round %d as node %d of %d (%s of %d, master %s)",
				round.Number, p.NodeRank, p.NNodes, ranks, p.WorldSize, p.MasterAddr)})

		w, err := startWorkers(s.spec, p, s.env, s.stdout, s.stderr)
		if err != nil {
			s.endRound(ctx, round, p, rendezvous.Failure{Member: s.spec.Self.Name, Reason: err.Error(), ExitCode: -1})
			continue
		}
		s.setCurrent(w)
		out := s.supervise(ctx, round, w)
		s.setCurrent(nil)
		switch out.kind {
		case "succeeded":
			if err := s.coord.Done(ctx, round); err != nil {
				fmt.Fprintf(s.stderr, "gpujob: recording success: %v\n", err)
			}
			msg := fmt.Sprintf("all %d local ranks exited 0", s.spec.NProcPerNode)
			if s.spec.NProcPerNode == 1 {
				msg = fmt.Sprintf("rank %d exited 0", p.RankOffset)
			}
			s.events.emit(Event{Kind: EventSucceeded, Round: round.Number, NodeRank: p.NodeRank, Restarts: p.Restarts, Message: msg})
			return 0
		case "stopped":
			w.stop(grace)
			s.events.emit(Event{Kind: EventStopped, Round: round.Number, NodeRank: p.NodeRank, Restarts: p.Restarts,
				Message: "stopped by Nomad; local ranks stopped"})
			return ExitStopped
		case "local":
			w.stop(grace)
			reason := fmt.Sprintf("rank %d exited %d", out.exit.Rank, out.exit.Code)
			if out.exit.Err != nil {
				reason = fmt.Sprintf("rank %d: %v", out.exit.Rank, out.exit.Err)
			}
			s.endRound(ctx, round, p, rendezvous.Failure{Member: s.spec.Self.Name, Reason: reason, ExitCode: out.exit.Code})
		case "remote":
			w.stop(grace)
			s.events.emit(Event{Kind: EventRestarting, Round: round.Number, NodeRank: p.NodeRank, Restarts: p.Restarts,
				Message: fmt.Sprintf("round %d ended by %s (%s): restarting with the group", round.Number, out.failure.Member, out.failure.Reason)})
		}
	}
}

func (s *Supervisor) setCurrent(w *workers) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current = w
}

// Signal passes a signal (from `nomad alloc signal`) to every local worker's
// process group; between rounds there is no one to receive it.
func (s *Supervisor) Signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current != nil {
		s.current.kill(sig)
	}
}

// endRound reports this member's failure to the group, which ends the round
// for everyone and spends one restart of the shared budget.
func (s *Supervisor) endRound(ctx context.Context, round *rendezvous.Round, p Placement, f rendezvous.Failure) {
	left := s.spec.MaxRestarts - p.Restarts - 1
	msg := fmt.Sprintf("%s: restarting group, %d of %d restarts left", f.Reason, max(left, 0), s.spec.MaxRestarts)
	if left < 0 {
		msg = fmt.Sprintf("%s: no restarts left (%d used)", f.Reason, s.spec.MaxRestarts)
	}
	s.events.emit(Event{Kind: EventRestarting, Round: round.Number, NodeRank: p.NodeRank, Restarts: p.Restarts, Message: msg})
	if err := s.coord.Fail(ctx, round, f); err != nil {
		fmt.Fprintf(s.stderr, "gpujob: reporting the failure to the group: %v\n", err)
	}
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
