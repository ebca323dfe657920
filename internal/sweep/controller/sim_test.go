package controller

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/sweep/search"
	"github.com/gpujob/gpujob/internal/sweep/stopping"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// fakeSampler proposes {"x": n} for the n-th trial (0-based): deterministic
// in the history's length, like search.Random. With limit > 0 it has only
// limit proposals, like a grid of that size.
type fakeSampler struct{ limit int }

func (f fakeSampler) Next(h []search.Trial) (search.Assignment, error) {
	if f.limit > 0 && len(h) >= f.limit {
		return nil, fmt.Errorf("fake grid of %d: %w", f.limit, search.ErrExhausted)
	}
	return search.Assignment{"x": search.IntValue(int64(len(h)))}, nil
}

var t0 = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

// sim drives Reconcile round by round: the test sets what each trial's job
// and metrics look like, and every round's state goes through JSON, as it
// does through Consul KV.
type sim struct {
	t       testing.TB
	p       *Plan
	st      *State
	now     time.Time
	jobs    map[string]JobObservation // by trial ID; absent: JobMissing
	metrics map[string]*sweepkv.Metrics
	dead    map[string]bool // supervisor gone (metrics record without session)
	refused map[string]error
	// stopKeys are the stop requests written (by the rounds' RequestStop
	// actions, as the controller carries them out).
	stopKeys map[string]bool
	// unobserved trials get no observation at all (a Launcher that left
	// them out).
	unobserved map[string]bool
}

func basePlan() *Plan {
	return &Plan{
		Namespace: "default", Sweep: "sw", Metric: "acc", Mode: stopping.Max,
		Sampler: fakeSampler{}, MaxTrials: 4, Parallel: 2, MaxFailedTrials: 1,
	}
}

func newSim(t testing.TB, mod func(*Plan)) *sim {
	t.Helper()
	p := basePlan()
	if mod != nil {
		mod(p)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	return &sim{
		t: t, p: p, st: &State{Namespace: p.Namespace, Sweep: p.Sweep}, now: t0,
		jobs: map[string]JobObservation{}, metrics: map[string]*sweepkv.Metrics{},
		dead: map[string]bool{}, refused: map[string]error{}, unobserved: map[string]bool{}, stopKeys: map[string]bool{},
	}
}

// round runs one Reconcile and "saves" the state.
func (s *sim) round() Result {
	s.t.Helper()
	obs := Observations{Now: s.now, Trials: map[string]TrialObservation{}}
	for _, tr := range s.st.Trials {
		if s.unobserved[tr.ID] {
			continue
		}
		job, ok := s.jobs[tr.ID]
		if !ok {
			job = JobObservation{Phase: JobMissing}
		}
		obs.Trials[tr.ID] = TrialObservation{Job: job, Metrics: s.metrics[tr.ID], Live: s.metrics[tr.ID] != nil && !s.dead[tr.ID], LaunchErr: s.refused[tr.ID], StopRequested: s.stopKeys[tr.ID]}
	}
	res, err := Reconcile(s.p, s.st, obs)
	if err != nil {
		s.t.Fatalf("Reconcile: %v", err)
	}
	for _, a := range res.Actions {
		if a.Kind == RequestStop {
			s.stopKeys[a.Trial.ID] = true
		}
	}
	b, err := json.Marshal(s.st)
	if err != nil {
		s.t.Fatalf("encoding the state: %v", err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		s.t.Fatalf("decoding the state: %v", err)
	}
	s.st = &st
	if n := len(s.st.Trials); n > s.st.MaxTrials {
		s.t.Fatalf("%d trials, more than max_trials %d", n, s.st.MaxTrials)
	}
	return res
}

// launchAll marks every job a round asked to launch as queued.
func (s *sim) launchAll(res Result) {
	for _, a := range res.Actions {
		if a.Kind == Launch {
			if _, ok := s.jobs[a.Trial.ID]; !ok {
				s.jobs[a.Trial.ID] = JobObservation{Phase: JobQueued}
			}
		}
	}
}

func (s *sim) job(id string, phase JobPhase) { s.jobs[id] = JobObservation{Phase: phase} }

// report appends a point of the objective (and "loss") to the trial's
// metrics record.
func (s *sim) report(id string, step int, value float64) {
	s.point(id, sweepkv.Point{Step: step, Values: map[string]float64{"acc": value, "loss": 1 - value}})
}

func (s *sim) final(id string, step int, value float64) {
	s.point(id, sweepkv.Point{Step: step, Values: map[string]float64{"acc": value}, Final: true})
}

// point appends p, replacing every point from p's step on as the
// supervisor does after a rewind.
func (s *sim) point(id string, p sweepkv.Point) {
	m := s.metrics[id]
	if m == nil {
		m = &sweepkv.Metrics{}
	}
	c := &sweepkv.Metrics{Points: append([]sweepkv.Point(nil), m.Points...), Rewinds: m.Rewinds}
	n := len(c.Points)
	if n > 0 && p.Final && p.Step == c.Points[n-1].Step {
		// A result at the last point's step merges into it.
		values := map[string]float64{}
		for k, v := range c.Points[n-1].Values {
			values[k] = v
		}
		for k, v := range p.Values {
			values[k] = v
		}
		c.Points[n-1] = sweepkv.Point{Step: p.Step, Values: values, Final: true}
		s.metrics[id] = c
		return
	}
	if n > 0 && p.Step <= c.Points[n-1].Step {
		i := 0
		for i < n && c.Points[i].Step < p.Step {
			i++
		}
		c.Points = c.Points[:i]
		c.Rewinds++
	}
	c.Points = append(c.Points, p)
	s.metrics[id] = c
}

func (s *sim) tr(id string) *Trial {
	s.t.Helper()
	t := s.st.Trial(id)
	if t == nil {
		s.t.Fatalf("no trial %s", id)
	}
	return t
}

// wantStates checks each listed trial's state.
func (s *sim) wantStates(want map[string]TrialState) {
	s.t.Helper()
	for id, w := range want {
		if got := s.tr(id).State; got != w {
			s.t.Errorf("round %d: %s is %s, want %s", s.st.Seq, id, got, w)
		}
	}
}

func (s *sim) wantStatus(status Status, reason string) {
	s.t.Helper()
	if s.st.Status != status || !strings.Contains(s.st.Reason, reason) {
		s.t.Errorf("round %d: sweep %s (%q), want %s with a reason containing %q", s.st.Seq, s.st.Status, s.st.Reason, status, reason)
	}
}

// acts renders a round's actions as "launch trial-001", "request-stop
// trial-002", "stop-job trial-003", in order.
func acts(res Result) []string {
	var out []string
	for _, a := range res.Actions {
		kind := map[ActionKind]string{Launch: "launch", RequestStop: "request-stop", StopJob: "stop-job"}[a.Kind]
		out = append(out, kind+" "+a.Trial.ID)
	}
	return out
}

func wantActs(t *testing.T, res Result, want ...string) {
	t.Helper()
	got := acts(res)
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("actions %q, want %q", got, want)
	}
}

// completeTrial reports the trial's final value and ends its job.
func (s *sim) completeTrial(id string, step int, value float64) {
	s.final(id, step, value)
	s.job(id, JobComplete)
}

var nan = math.NaN()
