package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/driver/rendezvous"
	"github.com/gpujob/gpujob/internal/sweep/report"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
	"github.com/gpujob/gpujob/internal/taskevent"
)

// A sweep trial (Spec.Report) is an ordinary training group with two more
// duties. The member that hosts global rank 0 forwards rank 0's metric and
// result lines to the trial's metrics record: the supervisor already reads
// the ranks' output, so nothing outside the task parses logs. And every
// member obeys the trial's stop request: it emits a TrialStopped event with
// the request's reason, stops its ranks and exits 0, so Nomad neither
// restarts the task nor counts it failed, and the trial's job completes.

// Trial is what the supervisor needs of its trial's records; consulTrial
// is the implementation over Consul (package report).
type Trial interface {
	// SetReporting starts forwarding rank 0's lines to the metrics record
	// (on: this member hosts global rank 0) or stops it, giving the record
	// up for the member that hosts rank 0 now (off). Idempotent.
	SetReporting(ctx context.Context, on bool)
	// RankZeroOutput is a writer for one start of global rank 0's stdout,
	// which reads the metric and result lines in it. It never blocks on
	// Consul and never fails; Close reads a last line without a newline.
	RankZeroOutput() io.WriteCloser
	// WatchStop calls stop once the trial's stop is requested, then
	// returns; it returns when ctx ends.
	WatchStop(ctx context.Context, stop func(sweepkv.StopRequest))
	// StopRequested reads the trial's stop request now.
	StopRequested(ctx context.Context) (req sweepkv.StopRequest, found bool, err error)
}

// Bounds of the Consul requests a trial adds to the ranks' stop path.
const (
	// trialStopCheck bounds reading the stop request when ranks failed
	// or Nomad stopped the task: long enough for a Consul that answers,
	// short enough not to hold a failure report or a stop's kill_timeout.
	trialStopCheck = time.Second
	// trialDoneTimeout bounds marking the round done on a trial stop.
	trialDoneTimeout = 3 * time.Second
	// reportHandOver bounds giving the metrics record up mid-run.
	reportHandOver = 5 * time.Second
)

// SetTrial makes the supervisor's task a sweep trial's; call it before Run.
func (s *Supervisor) SetTrial(t Trial) { s.trial = t }

// TrialStopped reports whether Run ended on the sweep's stop request: the
// member left on purpose, and so does the group, whose run is over.
func (s *Supervisor) TrialStopped() bool { return s.trialStop != nil }

// stopRequested is the cause the trial's stop request gives the run's
// context: every wait of the run (the rendezvous, the ranks) ends as it
// does for Nomad's stop, and the way out tells the two apart.
type stopRequested struct{ req sweepkv.StopRequest }

func (e *stopRequested) Error() string { return "the sweep asked the trial to stop: " + e.req.Reason }

// watchStop returns the run's context, which also ends when the trial's
// stop is requested, and the function that ends the watch.
func (s *Supervisor) watchStop(parent context.Context) (context.Context, func()) {
	if s.trial == nil {
		return parent, func() {}
	}
	ctx, cancel := context.WithCancelCause(parent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.trial.WatchStop(ctx, func(req sweepkv.StopRequest) { cancel(&stopRequested{req}) })
	}()
	return ctx, func() { cancel(nil); <-done }
}

// likelyRankZero says whether this member will host global rank 0: the
// only member, or the first expected one (ranks follow the members'
// names). Such a member takes the metrics record before its first round,
// so the trial shows a live supervisor while the group gathers; the
// rounds' placements decide in the end (reportFor).
func (s *Supervisor) likelyRankZero() bool {
	return s.spec.Max == 1 || (len(s.spec.Expected) > 0 && s.spec.Self.Name == s.spec.Expected[0])
}

// reportFor starts or stops forwarding for the round p places this member
// in.
func (s *Supervisor) reportFor(ctx context.Context, p Placement) {
	if s.trial == nil {
		return
	}
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportHandOver)
	defer cancel()
	s.trial.SetReporting(hctx, p.RankOffset == 0)
}

// rankOutput is the tee for the ranks' stdout: global rank 0's goes to the
// trial too.
func (s *Supervisor) rankOutput(rank int) io.WriteCloser {
	if s.trial == nil || rank != 0 {
		return nil
	}
	return s.trial.RankZeroOutput()
}

// trialStopRequest says whether the trial's stop was requested: the run's
// context says so when the watch saw the request; otherwise, for a trial,
// Consul is asked. A stop of the task by Nomad may come just before the
// watch sees the request (the sweep's controller writes it, then stops
// the trial's job), and a rank may fail because another member's ranks
// were stopped for it before this member's watch fired.
func (s *Supervisor) trialStopRequest(ctx context.Context) (sweepkv.StopRequest, bool) {
	var sr *stopRequested
	if errors.As(context.Cause(ctx), &sr) {
		return sr.req, true
	}
	if s.trial == nil {
		return sweepkv.StopRequest{}, false
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), trialStopCheck)
	defer cancel()
	req, found, err := s.trial.StopRequested(rctx)
	if err != nil {
		fmt.Fprintf(s.stderr, "gpujob: sweep: %v\n", err)
	}
	return req, found
}

// stopped ends the run on a stop: the sweep's request (trialStopped) or
// Nomad's (ExitStopped). The ranks, if any still run, are stopped within
// what Nomad's kill_timeout leaves (the fixed grace without one).
func (s *Supervisor) stopped(ctx context.Context, p Placement, w *workers, round *rendezvous.Round) int {
	plan := s.planStop()
	if w != nil {
		w.stop(plan.grace)
	}
	if req, ok := s.trialStopRequest(ctx); ok {
		return s.trialStopped(ctx, p, round, req)
	}
	s.events.emit(s.event(taskevent.Stopped, p))
	return ExitStopped
}

// trialStopped ends the run on the sweep's request once the ranks are
// stopped: the event says why, and the exit is a success.
func (s *Supervisor) trialStopped(ctx context.Context, p Placement, round *rendezvous.Round, req sweepkv.StopRequest) int {
	e := s.event(taskevent.TrialStopped, p)
	e.Stop = taskevent.Stop{Reason: req.Reason, At: req.At}
	if round != nil {
		// Marked done, this member's leaving is not taken by the others
		// for a failure that would spend a group restart on a round
		// nobody wants any more.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), trialDoneTimeout)
		if err := s.coord.Done(dctx, round); err != nil {
			e.Warning = fmt.Sprintf("telling the group in Consul failed: %v", err)
		}
		cancel()
	}
	s.trialStop = &req
	s.events.emit(e)
	return 0
}

// consulTrial is Trial over Consul: a report.Reporter while this member
// hosts rank 0, and the stop request's key.
type consulTrial struct {
	client *consul.Client
	spec   ReportSpec
	name   string // the reporter's session name
	logf   func(format string, args ...any)

	mu  sync.Mutex
	rep *report.Reporter
}

func newConsulTrial(client *consul.Client, spec *Spec, stderr io.Writer) *consulTrial {
	var mu sync.Mutex
	return &consulTrial{
		client: client,
		spec:   *spec.Report,
		name:   "gpujob sweep trial " + spec.RunID + " " + spec.Self.Name,
		logf: func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(stderr, "gpujob: sweep: "+format+"\n", args...)
		},
	}
}

func (t *consulTrial) SetReporting(ctx context.Context, on bool) {
	t.mu.Lock()
	rep := t.rep
	switch {
	case on && rep == nil:
		r, err := report.Start(report.Config{Client: t.client, Key: t.spec.MetricsKey, SessionName: t.name, Logf: t.logf})
		if err != nil {
			t.logf("not reporting metrics: %v", err)
		}
		t.rep = r
		t.mu.Unlock()
		return
	case !on && rep != nil:
		t.rep = nil
	default:
		rep = nil
	}
	t.mu.Unlock()
	if rep != nil {
		if err := rep.Close(ctx); err != nil {
			t.logf("%v", err)
		}
	}
}

func (t *consulTrial) RankZeroOutput() io.WriteCloser {
	reporter := func() *report.Reporter {
		t.mu.Lock()
		defer t.mu.Unlock()
		return t.rep
	}
	w := report.NewLineWriter(func(line string) {
		if rep := reporter(); rep != nil {
			rep.Line(line)
		}
	})
	// Lines over the writer's limit are skipped unread; the record
	// counts them (dropped_lines).
	w.OnSkip = func() {
		if rep := reporter(); rep != nil {
			rep.Skipped()
		}
	}
	return w
}

func (t *consulTrial) WatchStop(ctx context.Context, stop func(sweepkv.StopRequest)) {
	report.WatchStop(ctx, t.client, t.spec.StopKey, t.logf, stop)
}

func (t *consulTrial) StopRequested(ctx context.Context) (sweepkv.StopRequest, bool, error) {
	return report.ReadStop(ctx, t.client, t.spec.StopKey)
}

// Close gives the metrics record up (a last write, the session destroyed)
// within ctx; on every way out of the supervisor.
func (t *consulTrial) Close(ctx context.Context) { t.SetReporting(ctx, false) }
