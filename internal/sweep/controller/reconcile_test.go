package controller

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/sweep/search"
	"github.com/gpujob/gpujob/internal/sweep/stopping"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

func ptr(v float64) *float64 { return &v }

func asha(p *Plan) {
	p.Rule, p.RuleName = stopping.ASHA{GracePeriod: 10, ReductionFactor: 3}, StoppedByASHA
}

// startTrials runs rounds until n trials run (their jobs JobRunning).
func (s *sim) startTrials(n int) {
	s.t.Helper()
	for i := 0; i < 2*n+2 && len(s.st.Trials) < n; i++ {
		s.launchAll(s.round())
	}
	for i := range n {
		s.job(TrialID(i), JobRunning)
	}
	s.round()
	for i := range n {
		if st := s.tr(TrialID(i)).State; st != TrialRunning {
			s.t.Fatalf("%s is %s after starting, want running", TrialID(i), st)
		}
	}
}

func TestReconcile(t *testing.T) {
	tests := []struct {
		name string
		plan func(*Plan)
		run  func(t *testing.T, s *sim)
	}{
		{
			name: "dispatches up to parallel, never above max_trials, and completes",
			plan: func(p *Plan) { p.MaxTrials, p.Parallel = 5, 2 },
			run: func(t *testing.T, s *sim) {
				res := s.round()
				wantActs(t, res, "launch trial-001", "launch trial-002")
				s.wantStates(map[string]TrialState{"trial-001": TrialPending, "trial-002": TrialPending})
				if got := s.tr("trial-002"); got.JobID != "sw-trial-002" || got.Index != 1 || !got.Params.Equal(search.Assignment{"x": search.IntValue(1)}) {
					t.Errorf("trial-002 = %+v", got)
				}
				// The launches are not seen yet: the same trials are
				// launched again (Launch is idempotent), none is added.
				res = s.round()
				wantActs(t, res, "launch trial-001", "launch trial-002")
				s.launchAll(res)
				wantActs(t, s.round())
				s.wantStates(map[string]TrialState{"trial-001": TrialRunning, "trial-002": TrialRunning})
				maxActive := 0
				for r := 0; r < 30; r++ {
					// Complete the oldest active trial.
					for _, tr := range s.st.Trials {
						if tr.State.Active() {
							s.job(tr.ID, JobRunning)
							s.report(tr.ID, 5, 0.5)
							s.completeTrial(tr.ID, 10, 0.5+float64(tr.Index)/100)
							break
						}
					}
					s.now = s.now.Add(time.Second)
					res = s.round()
					s.launchAll(res)
					active := 0
					for _, tr := range s.st.Trials {
						if tr.State.Active() {
							active++
						}
					}
					maxActive = max(maxActive, active)
					if res.Done {
						break
					}
				}
				if maxActive > 2 {
					t.Errorf("%d trials active at once, parallel is 2", maxActive)
				}
				if n := len(s.st.Trials); n != 5 {
					t.Errorf("%d trials, want max_trials 5", n)
				}
				s.wantStatus(StatusCompleted, "all 5 trials ended: 5 completed")
				if s.st.Ended.IsZero() || s.st.MaxTrials != 5 {
					t.Errorf("Ended %v, MaxTrials %d", s.st.Ended, s.st.MaxTrials)
				}
				if b := s.st.Best(true); b == nil || b.ID != "trial-005" || *b.Value != 0.54 {
					t.Errorf("best %+v", b)
				}
				// Nothing more is proposed, however often it runs.
				res = s.round()
				wantActs(t, res)
				if !res.Done || len(s.st.Trials) != 5 {
					t.Errorf("after the end: done %v, %d trials", res.Done, len(s.st.Trials))
				}
			},
		},
		{
			name: "pending, running, completed with its value, step and times",
			plan: func(p *Plan) { p.MaxTrials, p.Parallel = 1, 1 },
			run: func(t *testing.T, s *sim) {
				s.launchAll(s.round())
				s.now = s.now.Add(time.Second)
				s.round()
				tr := s.tr("trial-001")
				if tr.State != TrialRunning || !tr.Started.IsZero() || tr.Waiting == "" {
					t.Errorf("queued: %+v", tr)
				}
				s.job("trial-001", JobRunning)
				s.report("trial-001", 3, 0.4)
				s.now = s.now.Add(time.Second)
				s.round()
				tr = s.tr("trial-001")
				if tr.State != TrialRunning || !tr.Started.Equal(t0.Add(2*time.Second)) || tr.Step != 3 || *tr.Value != 0.4 || tr.Waiting != "" {
					t.Errorf("running: %+v", tr)
				}
				s.completeTrial("trial-001", 6, 0.7)
				s.now = s.now.Add(time.Second)
				res := s.round()
				tr = s.tr("trial-001")
				if tr.State != TrialCompleted || tr.Step != 6 || *tr.Value != 0.7 || tr.EndSeq != s.st.Seq || !tr.Ended.Equal(s.now) {
					t.Errorf("completed: %+v", tr)
				}
				if !res.Done || s.st.Status != StatusCompleted {
					t.Errorf("done %v, status %s", res.Done, s.st.Status)
				}
			},
		},
		{
			name: "a launch refused for good fails the trial",
			plan: func(p *Plan) { p.MaxTrials, p.Parallel, p.MaxFailedTrials = 2, 1, 5 },
			run: func(t *testing.T, s *sim) {
				wantActs(t, s.round(), "launch trial-001")
				s.refused["trial-001"] = fmt.Errorf("job sw-trial-001: %w: no such driver", ErrRefused)
				wantActs(t, s.round(), "launch trial-002")
				if tr := s.tr("trial-001"); tr.State != TrialFailed || !strings.Contains(tr.Reason, "could not be launched") || !strings.Contains(tr.Reason, "no such driver") {
					t.Errorf("trial-001: %+v", tr)
				}
			},
		},
		{
			name: "failed trials beyond max_failed_trials end the sweep",
			plan: func(p *Plan) { p.MaxTrials, p.Parallel, p.MaxFailedTrials = 10, 3, 1 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(3)
				s.jobs["trial-001"] = JobObservation{Phase: JobFailed, Reason: "exit code 3"}
				res := s.round()
				wantActs(t, res, "launch trial-004")
				s.wantStatus(StatusRunning, "")
				s.wantStates(map[string]TrialState{"trial-001": TrialFailed})
				if r := s.tr("trial-001").Reason; r != "exit code 3" {
					t.Errorf("reason %q", r)
				}
				s.jobs["trial-002"] = JobObservation{Phase: JobFailed}
				s.now = s.now.Add(time.Second)
				res = s.round()
				s.wantStatus(StatusFailed, "2 trials failed, more than max_failed_trials = 1; the last: trial-002: its job failed")
				// trial-003 runs: asked to stop; trial-004 was never
				// seen launched: its job is stopped at once.
				wantActs(t, res, "stop-job trial-004", "request-stop trial-003", "request-stop trial-004")
				if res.Done || !res.Wake.Equal(s.now.Add(StopGrace)) {
					t.Errorf("done %v, wake %v", res.Done, res.Wake)
				}
				for _, id := range []string{"trial-003", "trial-004"} {
					tr := s.tr(id)
					if tr.State != TrialStopping || tr.StoppedBy != StoppedBySweep || !strings.Contains(tr.Reason, "the sweep failed: 2 trials failed") {
						t.Errorf("%s: %+v", id, tr)
					}
				}
				s.now = s.now.Add(StopGrace)
				res = s.round()
				// trial-004's job did not appear within the grace: it
				// is stopped; trial-003's job is stopped now.
				wantActs(t, res, "stop-job trial-003")
				s.wantStates(map[string]TrialState{"trial-003": TrialStopping, "trial-004": TrialStopped})
				s.job("trial-003", JobStopped)
				res = s.round()
				s.wantStates(map[string]TrialState{"trial-003": TrialStopped})
				if !res.Done || len(s.st.Trials) != 4 {
					t.Errorf("done %v, %d trials", res.Done, len(s.st.Trials))
				}
				s.wantStatus(StatusFailed, "2 trials failed")
			},
		},
		{
			name: "the goal ends the sweep and stops the other trials",
			plan: func(p *Plan) { p.Goal, p.MaxTrials, p.Parallel = ptr(0.9), 10, 2 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(2)
				s.completeTrial("trial-001", 10, 0.85)
				wantActs(t, s.round(), "launch trial-003")
				s.wantStatus(StatusRunning, "")
				s.launchAll(Result{Actions: []Action{{Kind: Launch, Trial: *s.tr("trial-003")}}})
				s.job("trial-003", JobRunning)
				s.completeTrial("trial-002", 10, 0.93)
				res := s.round()
				s.wantStatus(StatusCompleted, "trial-002 reached the goal: acc 0.93 (goal 0.9)")
				wantActs(t, res, "request-stop trial-003")
				if tr := s.tr("trial-003"); tr.StoppedBy != StoppedByGoal || tr.State != TrialStopping {
					t.Errorf("trial-003: %+v", tr)
				}
				s.job("trial-003", JobComplete) // its supervisor obeyed
				res = s.round()
				s.wantStates(map[string]TrialState{"trial-003": TrialStopped})
				if !res.Done {
					t.Error("not done")
				}
			},
		},
		{
			name: "a minimizing goal",
			plan: func(p *Plan) { p.Goal, p.Mode, p.MaxTrials, p.Parallel = ptr(0.1), stopping.Min, 10, 1 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(1)
				s.completeTrial("trial-001", 10, 0.2)
				s.launchAll(s.round())
				s.wantStatus(StatusRunning, "")
				s.job("trial-002", JobRunning)
				s.completeTrial("trial-002", 10, 0.05)
				s.round()
				s.wantStatus(StatusCompleted, "trial-002 reached the goal")
			},
		},
		{
			name: "a stop request stops running, queued and pending trials",
			plan: func(p *Plan) { p.MaxTrials, p.Parallel = 10, 3 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(3)
				s.job("trial-002", JobQueued) // e.g. rescheduled
				delete(s.jobs, "trial-003")   // not launched yet
				s.tr("trial-003").State = TrialPending
				s.st.StopRequested = true
				res := s.round()
				s.wantStatus(StatusStopped, "stopped by gpujob sweep stop")
				wantActs(t, res, "stop-job trial-002", "stop-job trial-003",
					"request-stop trial-001", "request-stop trial-002", "request-stop trial-003")
				for _, a := range res.Actions {
					if a.Reason != "the sweep was stopped" {
						t.Errorf("%s: reason %q", a.Trial.ID, a.Reason)
					}
				}
				if !res.Wake.Equal(s.now.Add(StopGrace)) || res.Done {
					t.Errorf("wake %v, done %v", res.Wake, res.Done)
				}
				s.now = s.now.Add(StopGrace / 2)
				s.job("trial-002", JobStopped)
				res = s.round()
				wantActs(t, res)
				s.wantStates(map[string]TrialState{"trial-001": TrialStopping, "trial-002": TrialStopped, "trial-003": TrialStopping})
				if tr := s.tr("trial-002"); tr.StoppedBy != StoppedByUser || tr.Reason != "the sweep was stopped" {
					t.Errorf("trial-002: %+v", tr)
				}
				s.now = s.now.Add(StopGrace / 2)
				res = s.round()
				// trial-003's job never appeared within the grace: stopped.
				wantActs(t, res, "stop-job trial-001")
				s.wantStates(map[string]TrialState{"trial-003": TrialStopped})
				s.job("trial-001", JobStopped)
				res = s.round()
				if !res.Done || len(s.st.Trials) != 3 {
					t.Errorf("done %v, %d trials", res.Done, len(s.st.Trials))
				}
			},
		},
		{
			name: "ASHA stops a bad trial: stop request, then its job after the grace",
			plan: func(p *Plan) { asha(p); p.MaxTrials, p.Parallel = 4, 2 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(2)
				s.report("trial-001", 10, 0.9)
				wantActs(t, s.round())
				s.report("trial-002", 5, 0.6)
				wantActs(t, s.round())
				s.report("trial-002", 10, 0.5)
				s.now = s.now.Add(time.Second)
				decided := s.now
				res := s.round()
				wantActs(t, res, "request-stop trial-002")
				tr := s.tr("trial-002")
				want := "stopped by ASHA at step 10: 0.5 < rung cut 0.9"
				if tr.State != TrialStopping || tr.StoppedBy != StoppedByASHA || tr.Reason != want || res.Actions[0].Reason != want {
					t.Errorf("trial-002: %+v", tr)
				}
				if !res.Wake.Equal(decided.Add(StopGrace)) {
					t.Errorf("wake %v, want %v", res.Wake, decided.Add(StopGrace))
				}
				// Still reporting within the grace: no second decision,
				// no new trial while it holds its GPUs.
				s.report("trial-002", 12, 0.99)
				s.now = decided.Add(StopGrace - time.Millisecond)
				res = s.round()
				wantActs(t, res)
				if !res.Wake.Equal(decided.Add(StopGrace)) || s.tr("trial-002").Reason != want {
					t.Errorf("wake %v, reason %q", res.Wake, s.tr("trial-002").Reason)
				}
				s.now = decided.Add(StopGrace)
				res = s.round()
				wantActs(t, res, "stop-job trial-002")
				if !res.Wake.IsZero() {
					t.Errorf("wake %v after the stop", res.Wake)
				}
				s.job("trial-002", JobStopped)
				wantActs(t, s.round(), "launch trial-003")
				if tr := s.tr("trial-002"); tr.State != TrialStopped || tr.Reason != want || tr.StoppedBy != StoppedByASHA {
					t.Errorf("trial-002: %+v", tr)
				}
			},
		},
		{
			name: "ASHA compares with the values recorded at the rung before, not after",
			plan: func(p *Plan) { asha(p); p.MaxTrials, p.Parallel = 3, 3 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(3)
				s.report("trial-002", 10, 0.5)
				wantActs(t, s.round())
				s.report("trial-001", 10, 0.9)
				wantActs(t, s.round())
				// trial-002 passed its rung before trial-001 got there.
				s.report("trial-002", 20, 0.55)
				wantActs(t, s.round())
				// Same round: the tie goes by trial ID (trial-001 first).
				s.report("trial-003", 10, 0.6)
				s.report("trial-001", 30, 0.2)
				s.report("trial-002", 30, 0.8)
				res := s.round()
				wantActs(t, res, "request-stop trial-003")
				s.wantStates(map[string]TrialState{"trial-001": TrialRunning, "trial-002": TrialRunning, "trial-003": TrialStopping})
				if r := s.tr("trial-003").Reason; !strings.Contains(r, "at step 10: 0.6 < rung cut") {
					t.Errorf("trial-003: %q", r)
				}
			},
		},
		{
			name: "ASHA in one round: the lower trial ID reaches the rung first",
			plan: func(p *Plan) { asha(p); p.MaxTrials, p.Parallel = 2, 2 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(2)
				s.report("trial-001", 10, 0.9)
				s.report("trial-002", 10, 0.5)
				wantActs(t, s.round(), "request-stop trial-002")
			},
		},
		{
			name: "ASHA: a trial whose job is queued is stopped directly",
			plan: func(p *Plan) { asha(p); p.MaxTrials, p.Parallel = 2, 2 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(2)
				s.report("trial-001", 10, 0.9)
				s.round()
				s.report("trial-002", 10, 0.5)
				s.job("trial-002", JobQueued) // restarting after a node loss
				wantActs(t, s.round(), "stop-job trial-002", "request-stop trial-002")
			},
		},
		{
			name: "ASHA does not judge again what a rewind reports again",
			plan: func(p *Plan) { asha(p); p.MaxTrials, p.Parallel = 2, 2 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(2)
				s.report("trial-001", 10, 0.9)
				s.round()
				s.report("trial-002", 10, 0.95)
				s.report("trial-002", 20, 0.96)
				wantActs(t, s.round())
				// Restarted from its step-0 checkpoint, trial-002 reports
				// step 10 again, worse: judged once already, not again.
				s.report("trial-002", 10, 0.2)
				wantActs(t, s.round())
				tr := s.tr("trial-002")
				if tr.State != TrialRunning || tr.Step != 10 || tr.Rewinds != 1 || tr.Seen != 21 || *tr.Value != 0.2 {
					t.Errorf("after the rewind: %+v", tr)
				}
				s.report("trial-002", 20, 0.3)
				wantActs(t, s.round())
				// A step past what was seen is new: judged at rung 30.
				s.report("trial-001", 30, 0.9)
				s.round()
				s.report("trial-002", 30, 0.4)
				wantActs(t, s.round(), "request-stop trial-002")
				if r := s.tr("trial-002").Reason; r != "stopped by ASHA at step 30: 0.4 < rung cut 0.9" {
					t.Errorf("reason %q", r)
				}
			},
		},
		{
			name: "ASHA lets a NaN value continue; a NaN-only trial fails without an objective",
			plan: func(p *Plan) { asha(p); p.MaxTrials, p.Parallel, p.MaxFailedTrials = 2, 2, 2 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(2)
				s.report("trial-001", 10, 0.9)
				s.round()
				s.report("trial-002", 10, nan)
				wantActs(t, s.round())
				if tr := s.tr("trial-002"); tr.State != TrialRunning || tr.Value != nil {
					t.Errorf("trial-002: %+v", tr)
				}
				s.point("trial-001", sweepkv.Point{Step: 20, Values: map[string]float64{"acc": nan}, Final: true})
				s.job("trial-001", JobComplete)
				s.completeTrial("trial-002", 20, nan)
				s.round()
				if tr := s.tr("trial-001"); tr.State != TrialCompleted || *tr.Value != 0.9 {
					t.Errorf("trial-001 (last finite value 0.9): %+v", tr)
				}
				if tr := s.tr("trial-002"); tr.State != TrialFailed || !strings.Contains(tr.Reason, "without reporting the objective metric") {
					t.Errorf("trial-002: %+v", tr)
				}
			},
		},
		{
			name: "median stopping against trials completed in earlier rounds",
			plan: func(p *Plan) {
				p.Rule, p.RuleName = stopping.Median{MinTrials: 1}, StoppedByMedian
				p.MaxTrials, p.Parallel = 3, 3
			},
			run: func(t *testing.T, s *sim) {
				s.startTrials(3)
				s.report("trial-001", 1, 0.8)
				s.report("trial-001", 2, 0.9)
				s.round()
				s.completeTrial("trial-001", 2, 0.9)
				// Reported in the round trial-001 is seen completed: not
				// judged against it.
				s.report("trial-002", 1, 0.3)
				wantActs(t, s.round())
				s.report("trial-002", 2, 0.35)
				s.report("trial-003", 1, 0.85)
				res := s.round()
				wantActs(t, res, "request-stop trial-002")
				tr := s.tr("trial-002")
				if tr.StoppedBy != StoppedByMedian || tr.Reason != "stopped by median stopping at step 2: best 0.35 < median 0.9 of 1 completed trials" {
					t.Errorf("trial-002: %+v", tr)
				}
				s.wantStates(map[string]TrialState{"trial-003": TrialRunning})
			},
		},
		{
			name: "jobs that disappear",
			plan: func(p *Plan) { p.MaxTrials, p.Parallel, p.MaxFailedTrials = 4, 3, 4 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(3)
				// Garbage-collected after its result: completed.
				s.report("trial-001", 5, 0.5)
				s.final("trial-001", 10, 0.6)
				delete(s.jobs, "trial-001")
				// Purged mid-run: failed.
				s.report("trial-002", 5, 0.5)
				delete(s.jobs, "trial-002")
				// Purged before it reported: failed, not launched again.
				delete(s.jobs, "trial-003")
				res := s.round()
				s.wantStates(map[string]TrialState{"trial-001": TrialCompleted, "trial-002": TrialFailed, "trial-003": TrialFailed})
				if r := s.tr("trial-002").Reason; !strings.Contains(r, "disappeared") {
					t.Errorf("trial-002: %q", r)
				}
				for _, a := range res.Actions {
					if a.Kind == Launch && a.Trial.ID != "trial-004" {
						t.Errorf("launched %s again", a.Trial.ID)
					}
				}
				// A pending trial whose job ran and is gone before any
				// controller saw it: it has metrics, so it was launched.
				s.final("trial-004", 10, 0.7)
				wantActs(t, s.round())
				if tr := s.tr("trial-004"); tr.State != TrialCompleted || *tr.Value != 0.7 {
					t.Errorf("trial-004: %+v", tr)
				}
			},
		},
		{
			name: "a job dead as failed after its result completes the trial",
			plan: func(p *Plan) { p.MaxTrials, p.Parallel, p.MaxFailedTrials = 2, 2, 5 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(2)
				s.final("trial-001", 10, 0.8)
				s.jobs["trial-001"] = JobObservation{Phase: JobFailed, Reason: "an allocation was lost"}
				s.report("trial-002", 5, 0.8)
				s.jobs["trial-002"] = JobObservation{Phase: JobFailed, Reason: "exit code 1"}
				s.round()
				if tr := s.tr("trial-001"); tr.State != TrialCompleted || *tr.Value != 0.8 {
					t.Errorf("trial-001: %+v", tr)
				}
				if tr := s.tr("trial-002"); tr.State != TrialFailed || tr.Reason != "exit code 1" {
					t.Errorf("trial-002: %+v", tr)
				}
			},
		},
		{
			name: "completion without the objective metric fails the trial",
			plan: func(p *Plan) { p.MaxTrials, p.Parallel, p.MaxFailedTrials = 2, 2, 5 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(2)
				s.point("trial-001", sweepkv.Point{Step: 10, Values: map[string]float64{"loss": 0.3}, Final: true})
				s.job("trial-001", JobComplete)
				s.job("trial-002", JobComplete) // never reported at all
				s.round()
				for _, id := range []string{"trial-001", "trial-002"} {
					if tr := s.tr(id); tr.State != TrialFailed || !strings.Contains(tr.Reason, "without reporting the objective metric") {
						t.Errorf("%s: %+v", id, tr)
					}
				}
			},
		},
		{
			name: "a job stopped by hand, and a stopping trial whose job fails",
			plan: func(p *Plan) { asha(p); p.MaxTrials, p.Parallel = 3, 3 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(3)
				s.job("trial-001", JobStopped)
				s.report("trial-002", 10, 0.9)
				s.round()
				if tr := s.tr("trial-001"); tr.State != TrialStopped || tr.StoppedBy != StoppedByUser || !strings.Contains(tr.Reason, "outside the sweep") {
					t.Errorf("trial-001: %+v", tr)
				}
				s.report("trial-003", 10, 0.1)
				wantActs(t, s.round(), "request-stop trial-003")
				s.jobs["trial-003"] = JobObservation{Phase: JobFailed, Reason: "killed"}
				s.round()
				if tr := s.tr("trial-003"); tr.State != TrialStopped || tr.StoppedBy != StoppedByASHA {
					t.Errorf("trial-003: %+v", tr)
				}
			},
		},
		{
			name: "a trial the launcher did not answer for is left as it is",
			plan: func(p *Plan) { p.MaxTrials, p.Parallel = 1, 1 },
			run: func(t *testing.T, s *sim) {
				s.round()
				s.unobserved["trial-001"] = true
				wantActs(t, s.round())
				s.wantStates(map[string]TrialState{"trial-001": TrialPending})
			},
		},
		{
			name: "waiting reasons: Nomad's while queued, a lost supervisor while running",
			plan: func(p *Plan) { p.MaxTrials, p.Parallel = 1, 1 },
			run: func(t *testing.T, s *sim) {
				s.round()
				s.jobs["trial-001"] = JobObservation{Phase: JobQueued, Reason: "no node has a free GPU (4 in use)"}
				s.round()
				if w := s.tr("trial-001").Waiting; w != "no node has a free GPU (4 in use)" {
					t.Errorf("queued: waiting %q", w)
				}
				s.job("trial-001", JobRunning)
				s.report("trial-001", 1, 0.5)
				s.round()
				if w := s.tr("trial-001").Waiting; w != "" {
					t.Errorf("running: waiting %q", w)
				}
				s.dead["trial-001"] = true
				s.round()
				if w := s.tr("trial-001").Waiting; !strings.Contains(w, "supervisor stopped reporting") {
					t.Errorf("supervisor gone: waiting %q", w)
				}
			},
		},
		{
			name: "stops come before launches in a round",
			plan: func(p *Plan) { asha(p); p.MaxTrials, p.Parallel = 4, 2 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(2)
				s.report("trial-001", 10, 0.9)
				s.round()
				s.report("trial-002", 10, 0.1)
				wantActs(t, s.round(), "request-stop trial-002")
				s.now = s.now.Add(StopGrace)
				s.completeTrial("trial-001", 20, 0.9)
				wantActs(t, s.round(), "stop-job trial-002", "launch trial-003")
			},
		},
		{
			name: "extend: a completed sweep running again proposes more trials",
			plan: func(p *Plan) { p.MaxTrials, p.Parallel = 2, 2 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(2)
				s.completeTrial("trial-001", 10, 0.5)
				s.completeTrial("trial-002", 10, 0.6)
				if !s.round().Done {
					t.Fatal("not done")
				}
				s.wantStatus(StatusCompleted, "all 2 trials ended")
				// gpujob sweep extend --max-trials +2
				s.st.Status, s.st.MaxTrials = StatusRunning, 4
				s.now = s.now.Add(time.Hour)
				res := s.round()
				wantActs(t, res, "launch trial-003", "launch trial-004")
				if res.Done || s.st.Reason != "" || !s.st.Ended.IsZero() {
					t.Errorf("done %v, reason %q, ended %v", res.Done, s.st.Reason, s.st.Ended)
				}
				if !s.tr("trial-003").Params.Equal(search.Assignment{"x": search.IntValue(2)}) {
					t.Errorf("trial-003 params %v", s.tr("trial-003").Params)
				}
				s.launchAll(res)
				s.job("trial-003", JobRunning)
				s.job("trial-004", JobRunning)
				s.round()
				s.completeTrial("trial-003", 10, 0.7)
				s.completeTrial("trial-004", 10, 0.8)
				if !s.round().Done {
					t.Fatal("not done after the extension")
				}
				s.wantStatus(StatusCompleted, "all 4 trials ended: 4 completed")
				if !s.st.Ended.Equal(s.now) {
					t.Errorf("ended %v, want %v", s.st.Ended, s.now)
				}
			},
		},
		{
			name: "extend after the goal: runs on until a new trial reaches it",
			plan: func(p *Plan) { p.Goal, p.MaxTrials, p.Parallel = ptr(0.9), 2, 1 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(1)
				s.completeTrial("trial-001", 10, 0.95)
				if !s.round().Done {
					t.Fatal("not done")
				}
				s.wantStatus(StatusCompleted, "reached the goal")
				s.st.Status, s.st.MaxTrials = StatusRunning, 4
				res := s.round()
				wantActs(t, res, "launch trial-002")
				s.wantStatus(StatusRunning, "")
				s.launchAll(res)
				s.job("trial-002", JobRunning)
				s.round()
				s.completeTrial("trial-002", 10, 0.5)
				s.launchAll(s.round())
				s.wantStatus(StatusRunning, "")
				s.job("trial-003", JobRunning)
				s.completeTrial("trial-003", 10, 0.97)
				s.round()
				s.wantStatus(StatusCompleted, "trial-003 reached the goal")
			},
		},
		{
			name: "extend after failure: runs on until the next failure",
			plan: func(p *Plan) { p.MaxTrials, p.Parallel, p.MaxFailedTrials = 2, 2, 0 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(2)
				s.job("trial-001", JobFailed)
				s.round()
				s.job("trial-002", JobStopped)
				s.round()
				s.wantStatus(StatusFailed, "1 trial failed")
				s.st.Status, s.st.MaxTrials = StatusRunning, 4
				res := s.round()
				s.wantStatus(StatusRunning, "")
				wantActs(t, res, "launch trial-003", "launch trial-004")
				s.launchAll(res)
				s.job("trial-003", JobFailed)
				s.round()
				s.wantStatus(StatusFailed, "2 trials failed, more than max_failed_trials = 0")
			},
		},
		{
			name: "grid exhaustion ends the sweep below max_trials",
			plan: func(p *Plan) { p.Sampler, p.MaxTrials, p.Parallel = fakeSampler{limit: 3}, 5, 2 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(2)
				s.completeTrial("trial-001", 10, 0.5)
				s.launchAll(s.round())
				s.job("trial-003", JobRunning)
				s.completeTrial("trial-002", 10, 0.5)
				res := s.round()
				wantActs(t, res)
				if len(s.st.Trials) != 3 || res.Done || s.st.MaxTrials != 5 {
					t.Errorf("%d trials, done %v, max_trials %d", len(s.st.Trials), res.Done, s.st.MaxTrials)
				}
				s.completeTrial("trial-003", 10, 0.5)
				res = s.round()
				if !res.Done || s.st.MaxTrials != 5 {
					t.Errorf("done %v, max_trials %d", res.Done, s.st.MaxTrials)
				}
				s.wantStatus(StatusCompleted, "all 3 trials ended: 3 completed (the search space has no combination left for the other 2 of max_trials = 5)")
				// Extending an exhausted grid ends again at once.
				s.st.Status, s.st.MaxTrials = StatusRunning, 7
				res = s.round()
				wantActs(t, res)
				if !res.Done {
					t.Error("an exhausted grid extended is not done")
				}
				s.wantStatus(StatusCompleted, "no combination left for the other 4 of max_trials = 7")
			},
		},
		{
			name: "a stop request lost with its controller is written again",
			plan: func(p *Plan) { asha(p); p.MaxTrials, p.Parallel = 2, 2 },
			run: func(t *testing.T, s *sim) {
				s.startTrials(2)
				s.report("trial-001", 10, 0.9)
				s.round()
				s.report("trial-002", 10, 0.1)
				wantActs(t, s.round(), "request-stop trial-002")
				// The controller died after saving, before writing it.
				delete(s.stopKeys, "trial-002")
				res := s.round()
				wantActs(t, res, "request-stop trial-002")
				if !strings.HasPrefix(res.Actions[0].Reason, "stopped by ASHA at step 10") {
					t.Errorf("reason %q", res.Actions[0].Reason)
				}
				wantActs(t, s.round())
			},
		},
		{
			name: "a state from another controller resumes as it is",
			plan: func(p *Plan) { p.MaxTrials, p.Parallel = 3, 2 },
			run: func(t *testing.T, s *sim) {
				// The predecessor saved two pending trials, then died.
				s.round()
				// A new controller proposes nothing new and launches the
				// very same trials.
				res := s.round()
				wantActs(t, res, "launch trial-001", "launch trial-002")
				if len(s.st.Trials) != 2 {
					t.Errorf("%d trials", len(s.st.Trials))
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newSim(t, tc.plan))
		})
	}
}

// TestReconcileStateStaysSmall: the state does not grow with the number of
// metric reports (it is rewritten on every change and Consul caps a value
// at 512 KiB).
func TestReconcileStateStaysSmall(t *testing.T) {
	s := newSim(t, func(p *Plan) { asha(p); p.MaxTrials, p.Parallel = 4, 4 })
	s.startTrials(4)
	size := map[int]int{}
	for step := 1; step <= 300; step++ {
		for i := range 4 {
			s.report(TrialID(i), step, 0.5+float64(i)/10)
		}
		s.round()
		if step == 100 || step == 300 {
			b, err := json.Marshal(s.st)
			if err != nil {
				t.Fatal(err)
			}
			size[step] = len(b)
		}
	}
	if size[300] > size[100]+16 {
		t.Errorf("the state grows with the reports: %d bytes after 100 rounds, %d after 300", size[100], size[300])
	}
}

// BenchmarkReconcileMedian is one round of a sweep with 8 running and 12
// completed trials of 2000 points each, where every running trial reports
// a new point: the rule judges only the new points (an old point was
// judged when it was first seen), so a round does not replay whole curves.
func BenchmarkReconcileMedian(b *testing.B) {
	s := newSim(b, func(p *Plan) {
		p.Rule, p.RuleName = stopping.Median{MinTrials: 1}, StoppedByMedian
		p.MaxTrials, p.Parallel = 20, 20
	})
	s.startTrials(20)
	for step := 1; step <= 2000; step++ {
		for i := range 20 {
			s.report(TrialID(i), step, 0.9)
		}
	}
	for i := range 12 {
		s.completeTrial(TrialID(i), 2000, 0.9)
	}
	s.round()
	step := 2000
	b.ResetTimer()
	for range b.N {
		step++
		for i := 12; i < 20; i++ {
			s.report(TrialID(i), step, 0.95)
		}
		s.round()
	}
	if s.st.Counts()[TrialRunning] != 8 {
		b.Fatalf("counts %v", s.st.Counts())
	}
}
