package controller

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/gpujob/gpujob/internal/sweep/search"
	"github.com/gpujob/gpujob/internal/sweep/stopping"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// StopGrace is how long a trial asked to stop has to do so by itself (its
// supervisor emits the reason as a task event and exits) before its job is
// stopped: well inside the 2 s in which a stopped trial's GPUs must be free.
const StopGrace = 1500 * time.Millisecond

// JobPhase is what Nomad says of a trial's job.
type JobPhase string

const (
	JobMissing  JobPhase = "missing"  // no such job: never registered, purged or garbage-collected
	JobQueued   JobPhase = "queued"   // registered, nothing running yet
	JobRunning  JobPhase = "running"  // an allocation runs
	JobComplete JobPhase = "complete" // dead; its allocations succeeded
	JobFailed   JobPhase = "failed"   // dead; an allocation failed for good
	JobStopped  JobPhase = "stopped"  // stopped (deregistered)
)

// JobObservation is a trial job's phase, with a plain-words reason for
// JobQueued (why it waits) and JobFailed.
type JobObservation struct {
	Phase  JobPhase
	Reason string
}

// TrialObservation is what one round saw of a trial.
type TrialObservation struct {
	Job JobObservation
	// Metrics is the trial's record (nil before its first report); Live
	// says a supervisor holds it (its Consul session is alive).
	Metrics *sweepkv.Metrics
	Live    bool
	// LaunchErr is a launch the cluster refused for good (the job is
	// invalid, or not allowed): the trial fails with it.
	LaunchErr error
	// StopRequested says the trial's stop request (sweepkv.StopKey) is in
	// KV. A stopping trial without one (its controller died before writing
	// it, or the write failed) has it written again.
	StopRequested bool
}

// Observations is one round's view of every trial, by trial ID.
type Observations struct {
	Now    time.Time
	Trials map[string]TrialObservation
}

// ActionKind is what the controller must do after saving the state.
type ActionKind int

const (
	// Launch registers the trial's job unless a job of that ID exists.
	Launch ActionKind = iota
	// RequestStop writes the trial's stop request (Reason).
	RequestStop
	// StopJob stops the trial's job.
	StopJob
)

// Action is one thing to do for a trial.
type Action struct {
	Kind   ActionKind
	Trial  Trial
	Reason string
}

// Result is a round's outcome beyond the state.
type Result struct {
	Actions []Action
	// Wake, when not zero, is when the next round is due even if nothing
	// changes (a stopping trial's grace ends).
	Wake time.Time
	// Done: the sweep has ended and no trial is active; the controller
	// can exit.
	Done bool
}

// Reconcile advances st by one round: it folds in what obs saw, applies the
// stopping rule and the sweep's limits, proposes new trials, and returns
// what to do. The state must be saved (check-and-set) before any action is
// carried out: the saved record of a pending trial is what keeps a
// restarted controller from proposing a different one in its place.
//
// A state whose Status is running again after the sweep had ended (gpujob
// sweep extend raised MaxTrials, or a stop was withdrawn) simply continues:
// its old Reason and Ended are dropped, and the goal and max_failed_trials
// end it again only on a trial that ends after that.
func Reconcile(p *Plan, st *State, obs Observations) (Result, error) {
	var res Result
	now := obs.Now
	st.Seq++
	if err := st.Check(p); err != nil {
		// Nothing in it can be trusted, its job IDs least: the sweep
		// fails, and no job is stopped or registered on its word.
		if !st.Status.Terminal() {
			st.Status = StatusFailed
			st.Reason = "the controller refused the sweep's state: " + err.Error() + "; nothing was launched or stopped " +
				"(was it written by something else than gpujob? purge the sweep: gpujob sweep stop --purge " + p.Sweep + ")"
		}
		st.Updated = now
		if st.Ended.IsZero() {
			st.Ended = now
		}
		res.Done = true
		return res, nil
	}
	if st.Status == "" {
		st.Status = StatusRunning
	}
	if p.Refused != "" && st.Status == StatusRunning {
		// The record failed the controller's checks: fail the sweep,
		// whose end (endSweep) stops the trials that run.
		st.Status, st.Reason = StatusFailed, p.Refused
	}
	if st.Status == StatusRunning {
		st.Reason, st.Ended = "", time.Time{}
	}
	if st.MaxTrials == 0 {
		st.MaxTrials = p.MaxTrials
	}
	if st.Created.IsZero() {
		st.Created = now
	}
	st.Updated = now

	seen := make(map[string]int, len(st.Trials)) // each trial's Seen before this round
	launch := map[string]bool{}                  // pending trials whose job is to be launched
	for i := range st.Trials {
		t := &st.Trials[i]
		seen[t.ID] = t.Seen
		o := obs.Trials[t.ID]
		if o.Metrics != nil {
			observeMetrics(p, t, o.Metrics)
		}
		if t.State.Terminal() {
			continue
		}
		launch[t.ID] = advance(t, o, now)
		if t.State.Terminal() {
			t.EndSeq, t.Ended = st.Seq, now
		}
	}

	// Early stopping, for each running trial with points not judged yet.
	if p.Rule != nil && st.Status == StatusRunning {
		var h *stopping.History
		for i := range st.Trials {
			t := &st.Trials[i]
			if t.State != TrialRunning || t.Seen <= seen[t.ID] {
				continue
			}
			if h == nil {
				h = ruleHistory(p, st, obs, seen)
			}
			if d := p.Rule.Decide(t.ID, judging(*h, i)); d.Stop {
				res.Actions = append(res.Actions, stopTrial(t, obs.Trials[t.ID], orDefault(p.RuleName, "early_stop"), d.Reason, now)...)
			}
		}
	}

	endSweep(p, st, obs, now, &res)

	exhausted := false
	if st.Status == StatusRunning {
		var err error
		if exhausted, err = propose(p, st, now, launch); err != nil {
			return res, err
		}
	}
	// Launches last, for the trials still pending: one stopped in this
	// round (the sweep ended) is not launched.
	for i := range st.Trials {
		if t := &st.Trials[i]; launch[t.ID] && t.State == TrialPending {
			res.Actions = append(res.Actions, Action{Kind: Launch, Trial: *t})
		}
	}

	requested := map[string]bool{}
	for _, a := range res.Actions {
		if a.Kind == RequestStop {
			requested[a.Trial.ID] = true
		}
	}
	active := 0
	for i := range st.Trials {
		t := &st.Trials[i]
		if !t.State.Active() {
			continue
		}
		active++
		if t.State == TrialStopping && !requested[t.ID] && !obs.Trials[t.ID].StopRequested {
			res.Actions = append(res.Actions, Action{Kind: RequestStop, Trial: *t, Reason: t.Reason})
		}
		if t.State == TrialStopping {
			due := t.StopAt.Add(StopGrace)
			if !now.Before(due) {
				res.Actions = append(res.Actions, Action{Kind: StopJob, Trial: *t, Reason: t.Reason})
			} else if res.Wake.IsZero() || due.Before(res.Wake) {
				res.Wake = due
			}
		}
	}
	if st.Status == StatusRunning && active == 0 && (len(st.Trials) >= st.MaxTrials || exhausted) {
		st.Status, st.Reason = StatusCompleted, summary(st)
		if exhausted && len(st.Trials) < st.MaxTrials {
			st.Reason += fmt.Sprintf(" (the search space has no combination left for the other %d of max_trials = %d)",
				st.MaxTrials-len(st.Trials), st.MaxTrials)
		}
	}
	if st.Status.Terminal() && active == 0 {
		res.Done = true
		if st.Ended.IsZero() {
			st.Ended = now
		}
	}
	// Stops first: they free GPUs the launches may be waiting for, and a
	// stopped trial's job must go within StopGrace of the decision.
	slices.SortStableFunc(res.Actions, func(a, b Action) int { return cmp.Compare(actionOrder(a.Kind), actionOrder(b.Kind)) })
	return res, nil
}

func actionOrder(k ActionKind) int {
	switch k {
	case StopJob:
		return 0
	case RequestStop:
		return 1
	}
	return 2
}

// observeMetrics folds the trial's metrics record into t.
func observeMetrics(p *Plan, t *Trial, m *sweepkv.Metrics) {
	t.Rewinds = m.Rewinds
	if r := m.Reporting; r.Throttled() {
		t.Held = &sweepkv.Reporting{ResultsDeferred: r.ResultsDeferred, ByteBudgetWaits: r.ByteBudgetWaits, DroppedLines: r.DroppedLines}
	}
	if len(m.Points) == 0 {
		return
	}
	last := m.Points[len(m.Points)-1].Step
	t.Step = last
	if v, ok := objective(p, m); ok {
		t.Value = &v
	}
	t.Seen = max(t.Seen, last+1)
}

// objective is the trial's latest finite value of the objective metric:
// the final result's when it has one.
func objective(p *Plan, m *sweepkv.Metrics) (float64, bool) {
	for i := len(m.Points) - 1; i >= 0; i-- {
		if v, ok := m.Points[i].Values[p.Metric]; ok && !math.IsNaN(v) && !math.IsInf(v, 0) {
			return v, true
		}
	}
	return 0, false
}

func hasFinal(m *sweepkv.Metrics) bool {
	return m != nil && len(m.Points) > 0 && m.Points[len(m.Points)-1].Final
}

// advance moves a non-terminal trial along what its job did, and says
// whether a pending trial's job must be launched.
func advance(t *Trial, o TrialObservation, now time.Time) (launch bool) {
	if o.Job.Phase == "" {
		// Not observed (a Launcher that left it out): nothing is known.
		return false
	}
	if t.State == TrialPending {
		if o.Job.Phase == JobMissing && o.Metrics == nil {
			if o.LaunchErr != nil {
				t.State, t.Reason = TrialFailed, "its job could not be launched: "+o.LaunchErr.Error()
				t.Waiting = ""
				return false
			}
			return true
		}
		// Its job exists, or it ran and is gone: it was launched.
		t.State = TrialRunning
	}
	if t.Started.IsZero() && (o.Job.Phase == JobRunning || o.Metrics != nil) {
		t.Started = now
	}
	stopping := t.State == TrialStopping
	t.Waiting = ""
	switch o.Job.Phase {
	case JobQueued:
		if !stopping {
			t.Waiting = orDefault(o.Job.Reason, "its job waits for Nomad to place it")
		}
	case JobRunning:
		if !stopping && o.Metrics != nil && !o.Live {
			t.Waiting = "its supervisor stopped reporting (its node may be lost); Nomad restarts or reschedules it"
		}
	case JobComplete:
		switch {
		case stopping:
			t.State = TrialStopped
		case t.Value != nil:
			t.State = TrialCompleted
		default:
			t.State = TrialFailed
			t.Reason = "it finished without reporting the objective metric (a gpujob-metric: or gpujob-result: line of rank 0 with that field)"
		}
	case JobFailed:
		switch {
		case stopping:
			t.State = TrialStopped
		case hasFinal(o.Metrics) && t.Value != nil:
			// Its result is in (a job whose node was lost counts as
			// failed in Nomad's summary although its rescheduled run
			// finished): the trial is complete.
			t.State = TrialCompleted
		default:
			t.State, t.Reason = TrialFailed, orDefault(o.Job.Reason, "its job failed")
		}
	case JobStopped:
		if !stopping {
			t.StoppedBy, t.Reason = StoppedByUser, "its job was stopped outside the sweep"
		}
		t.State = TrialStopped
	case JobMissing:
		switch {
		case stopping:
			// A job that is missing may still be on its way: a trial
			// stopped while pending, whose launch a predecessor that lost
			// the lock had in flight. It is stopped for good once the
			// grace has passed with the job stopped (StopJob) or absent.
			if !now.Before(t.StopAt.Add(StopGrace)) {
				t.State = TrialStopped
			}
		case hasFinal(o.Metrics) && t.Value != nil:
			t.State = TrialCompleted
		default:
			t.State, t.Reason = TrialFailed, "its job disappeared (purged or garbage-collected) before it finished"
		}
	}
	return false
}

// stopTrial asks an active trial to stop: through its stop request, which
// its supervisor turns into a task event and a clean exit, and, for a trial
// whose job is not running (pending, queued or missing: no supervisor to
// obey), by stopping its job at once. A running job is stopped StopGrace
// after the request if it has not ended by then.
func stopTrial(t *Trial, o TrialObservation, by, reason string, now time.Time) []Action {
	if t.State == TrialStopping || t.State.Terminal() {
		return nil
	}
	t.StoppedBy, t.Reason, t.Waiting = by, reason, ""
	running := t.State == TrialRunning && o.Job.Phase == JobRunning
	t.State, t.StopAt = TrialStopping, now
	acts := []Action{{Kind: RequestStop, Trial: *t, Reason: reason}}
	if !running {
		acts = append(acts, Action{Kind: StopJob, Trial: *t, Reason: reason})
	}
	return acts
}

// endSweep ends the sweep on a stop request, too many failed trials, or the
// goal, and stops its active trials. The failure count and the goal end it
// only on a trial that ended in this round, so a sweep reopened by extend
// runs on until another trial fails or reaches the goal.
func endSweep(p *Plan, st *State, obs Observations, now time.Time, res *Result) {
	if st.Status == StatusRunning {
		failed, lastFail, failedNow := 0, "", false
		for _, t := range st.Trials {
			if t.State == TrialFailed {
				failed++
				lastFail = t.ID + ": " + t.Reason
				failedNow = failedNow || t.EndSeq == st.Seq
			}
		}
		switch {
		case st.StopRequested:
			st.Status, st.Reason = StatusStopped, "stopped by gpujob sweep stop"
		case failedNow && failed > p.MaxFailedTrials:
			st.Status = StatusFailed
			st.Reason = fmt.Sprintf("%s failed, more than max_failed_trials = %d; the last: %s", plural(failed, "trial"), p.MaxFailedTrials, lastFail)
		case p.Goal != nil:
			if t := reached(p, st); t != nil {
				st.Status = StatusCompleted
				st.Reason = fmt.Sprintf("%s reached the goal: %s %s (goal %s)", t.ID, p.Metric, formatFloat(*t.Value), formatFloat(*p.Goal))
			}
		}
	}
	if !st.Status.Terminal() {
		return
	}
	by, why := StoppedByUser, "the sweep was stopped"
	switch {
	case st.Status == StatusFailed:
		by, why = StoppedBySweep, "the sweep failed: "+st.Reason
	case st.Status == StatusCompleted:
		by, why = StoppedByGoal, "the sweep ended: "+st.Reason
	}
	for i := range st.Trials {
		t := &st.Trials[i]
		if t.State == TrialPending || t.State == TrialRunning {
			res.Actions = append(res.Actions, stopTrial(t, obs.Trials[t.ID], by, why, now)...)
		}
	}
}

// reached returns the first trial completed in this round that meets the
// goal.
func reached(p *Plan, st *State) *Trial {
	for i := range st.Trials {
		t := &st.Trials[i]
		if t.State != TrialCompleted || t.Value == nil || t.EndSeq != st.Seq {
			continue
		}
		if (p.maximize() && *t.Value >= *p.Goal) || (!p.maximize() && *t.Value <= *p.Goal) {
			return t
		}
	}
	return nil
}

// propose adds trials while fewer than Parallel are active and fewer than
// MaxTrials exist. It says whether the sampler has no proposal left (a grid
// smaller than max_trials): the sweep then ends once its trials have.
func propose(p *Plan, st *State, now time.Time, launch map[string]bool) (exhausted bool, err error) {
	active := 0
	for _, t := range st.Trials {
		if t.State.Active() {
			active++
		}
	}
	for active < p.Parallel && len(st.Trials) < st.MaxTrials {
		a, err := p.Sampler.Next(searchHistory(st))
		if errors.Is(err, search.ErrExhausted) {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("sweep %q: proposing trial %d: %w", p.Sweep, len(st.Trials)+1, err)
		}
		i := len(st.Trials)
		t := Trial{ID: TrialID(i), Index: i, JobID: TrialJobID(p.Sweep, i), Params: a, State: TrialPending, Created: now}
		st.Trials = append(st.Trials, t)
		launch[t.ID] = true
		active++
	}
	return false, nil
}

// searchHistory is the trials so far as the samplers see them. A trial
// stopped early counts with its last value, as Optuna's TPE counts a
// pruned trial's last intermediate value; one without a value as failed.
func searchHistory(st *State) []search.Trial {
	h := make([]search.Trial, len(st.Trials))
	for i, t := range st.Trials {
		h[i] = search.Trial{Params: t.Params}
		switch {
		case (t.State == TrialCompleted || t.State == TrialStopped) && t.Value != nil:
			h[i].Done, h[i].Value = true, *t.Value
		case t.State.Terminal():
			h[i].Failed = true
		}
	}
	return h
}

// The sequence numbers ruleHistory gives the stopping rules.
const (
	seqJudged = 1 // the judged trial's points seen in earlier rounds (judging)
	seqBefore = 2 // points seen, and trial ends, in earlier rounds
	seqNow    = 3 // points first seen, and trial ends, in this round
)

// ruleHistory is the sweep as the stopping rule sees it in this round, in
// the order of st.Trials: every trial's points that carry the objective,
// those at or past its Seen before this round (seen) being new.
//
// Every point seen in an earlier round was judged then, so the history only
// has to order this round against the past: the new points come after
// everything seen before (other trials' new points tie with them, and the
// rules break the tie by trial ID). Trials that ended in an earlier round
// count as ended for the new points; a trial ending in this round does not.
// This is what the sequence numbers of the stopping package mean, with no
// per-point record in the state (which would grow with every report), no
// replay of whole curves every round, and no second judgement of a point
// after a rewind replaced what other trials were compared with.
func ruleHistory(p *Plan, st *State, obs Observations, seen map[string]int) *stopping.History {
	h := &stopping.History{Mode: p.Mode, Trials: make([]stopping.Trial, 0, len(st.Trials))}
	for i := range st.Trials {
		t := &st.Trials[i]
		ht := stopping.Trial{ID: t.ID, State: ruleState(t.State)}
		switch {
		case t.EndSeq == 0:
		case t.EndSeq < st.Seq:
			ht.EndSeq = seqBefore
		default:
			ht.EndSeq = seqNow
		}
		if m := obs.Trials[t.ID].Metrics; m != nil {
			ht.Points = make([]stopping.Point, 0, len(m.Points))
			for _, pt := range m.Points {
				v, ok := pt.Values[p.Metric]
				if !ok {
					continue
				}
				seq := int64(seqBefore)
				if pt.Step >= seen[t.ID] {
					seq = seqNow
				}
				ht.Points = append(ht.Points, stopping.Point{Seq: seq, Step: pt.Step, Value: v})
			}
		}
		h.Trials = append(h.Trials, ht)
	}
	return h
}

// judging is h as the rule must see it to judge the i-th trial: its own
// points seen before come before everything else, so that they are not
// judged again against evidence that arrived after them (they were judged
// when first seen).
func judging(h stopping.History, i int) stopping.History {
	h.Trials = slices.Clone(h.Trials)
	pts := slices.Clone(h.Trials[i].Points)
	for j := range pts {
		if pts[j].Seq == seqBefore {
			pts[j].Seq = seqJudged
		}
	}
	h.Trials[i].Points = pts
	return h
}

func ruleState(s TrialState) stopping.State {
	switch s {
	case TrialCompleted:
		return stopping.Completed
	case TrialStopped, TrialStopping:
		return stopping.Stopped
	case TrialFailed:
		return stopping.Failed
	}
	return stopping.Running
}

func summary(st *State) string {
	c := st.Counts()
	parts := []string{fmt.Sprintf("%d completed", c[TrialCompleted])}
	if n := c[TrialStopped]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d stopped early", n))
	}
	if n := c[TrialFailed]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d failed", n))
	}
	all := fmt.Sprintf("all %d trials", len(st.Trials))
	if len(st.Trials) == 1 {
		all = "the 1 trial"
	}
	return fmt.Sprintf("%s ended: %s", all, strings.Join(parts, ", "))
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func formatFloat(v float64) string { return fmt.Sprintf("%.4g", v) }
