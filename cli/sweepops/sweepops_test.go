package sweepops_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/cli/sweepjob/fixture"
	"github.com/gpujob/gpujob/cli/sweepops"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/search"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
	"github.com/gpujob/gpujob/internal/testagent"
)

var epoch = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// The tests share one real Consul agent, each under a KV prefix of its own.
var shared testagent.Lazy

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

// newSweeps is the sweeps of namespace default under a prefix of the
// test's own, with a fake Nomad and the clock at epoch.
func newSweeps(t *testing.T) (*sweepops.Sweeps, *nomadapi.Fake) {
	t.Helper()
	f := nomadapi.NewFake()
	return &sweepops.Sweeps{Consul: shared.Client(t), Nomad: f, Namespace: "default", Prefix: "sweepops-test/" + t.Name(),
		Now: func() time.Time { return epoch }}, f
}

// seed records fixture.Record's sweep lr with a state of the given
// status and a trial of each of states (trial i reported the value i/10);
// the active trials' jobs run in f.
func seed(t *testing.T, s *sweepops.Sweeps, f *nomadapi.Fake, status controller.Status, states ...controller.TrialState) *sweepjob.Record {
	t.Helper()
	rec, _ := fixture.Record(t)
	st := &controller.State{Namespace: "default", Sweep: "lr", Status: status, MaxTrials: len(states), Starts: 1}
	if status.Terminal() {
		st.Ended = epoch.Add(-time.Minute)
	}
	for i, ts := range states {
		v := float64(i) / 10
		tr := controller.Trial{ID: controller.TrialID(i), Index: i, JobID: controller.TrialJobID("lr", i), State: ts,
			Params: search.Assignment{"lr": search.FloatValue(v)}, Step: 10 * (i + 1), Value: &v}
		st.Trials = append(st.Trials, tr)
		if ts.Active() {
			setJob(f, tr.JobID, "running", "lr")
		}
	}
	if err := sweepjob.Create(context.Background(), s.Consul, s.Prefix, rec, st); err != nil {
		t.Fatal(err)
	}
	return rec
}

// setJob sets a job of the status with the sweep in its meta ("" none).
func setJob(f *nomadapi.Fake, id, status, sweep string) {
	meta := map[string]string{}
	if sweep != "" {
		meta[contract.MetaSweep] = sweep
	}
	f.SetJob(&api.Job{ID: &id, Name: &id, Status: &status, Meta: meta})
}

// stop runs s.Stop and returns what it told of its steps.
func stop(t *testing.T, s *sweepops.Sweeps, purge bool) (*sweepops.Purged, []sweepops.StopEvent, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*sweepops.StopWait)
	defer cancel()
	var events []sweepops.StopEvent
	p, err := s.Stop(ctx, "lr", purge, func(ev sweepops.StopEvent) { events = append(events, ev) })
	return p, events, err
}

func TestNewStatusCountsTheTrialsAndPointsAtTheBest(t *testing.T) {
	rec, _ := fixture.Record(t)
	v := func(f float64) *float64 { return &f }
	held := &sweepkv.Reporting{DroppedLines: 1}
	st := &controller.State{Status: controller.StatusRunning, Reason: "", MaxTrials: 5, Starts: 2, Trials: []controller.Trial{
		{ID: "trial-001", JobID: "lr-trial-001", State: controller.TrialCompleted, Value: v(0.5)},
		{ID: "trial-002", JobID: "lr-trial-002", State: controller.TrialCompleted, Value: v(0.9), Held: held},
		{ID: "trial-003", JobID: "lr-trial-003", State: controller.TrialStopped, Value: v(0.1), StoppedBy: controller.StoppedByASHA},
		{ID: "trial-004", JobID: "lr-trial-004", State: controller.TrialRunning},
	}}
	s := sweepops.NewStatus(rec, st)
	if s.Sweep != "lr" || s.Metric != "acc" || s.Mode != "max" || s.MaxTrials != 5 || s.Parallel != 1 || s.Controller.Starts != 2 {
		t.Errorf("status %+v", s)
	}
	if want := map[string]int{"completed": 2, "stopped": 1, "running": 1}; !reflect.DeepEqual(s.Counts, want) {
		t.Errorf("counts %v, want %v", s.Counts, want)
	}
	if s.Best == nil || s.Best != &s.Trials[1] {
		t.Errorf("best %+v, want trial-002 of the trials", s.Best)
	}
	if s.Trials[1].Held != held || s.Trials[2].StoppedBy != controller.StoppedByASHA || s.Trials[3].Value != nil {
		t.Errorf("trials %+v", s.Trials)
	}
	// No trial with a value: no best; an empty state: counts but no trials.
	if s := sweepops.NewStatus(rec, &controller.State{}); s.Best != nil || len(s.Trials) != 0 || s.Counts == nil || s.Trials == nil {
		t.Errorf("empty state: %+v", s)
	}
}

// queuedNomad is the fake with Nomad's summary saying that the groups of
// the jobs in queued wait to be placed (the fake counts no queued ones).
type queuedNomad struct {
	*nomadapi.Fake
	queued map[string]bool
}

func (q queuedNomad) Jobs(o *api.QueryOptions) ([]*api.JobListStub, *api.QueryMeta, error) {
	stubs, meta, err := q.Fake.Jobs(o)
	for _, s := range stubs {
		if q.queued[s.ID] {
			s.JobSummary = &api.JobSummary{Summary: map[string]api.TaskGroupSummary{render.Group: {Queued: 1}}}
		}
	}
	return stubs, meta, err
}

func TestReadStatusSaysWhyQueuedTrialsWait(t *testing.T) {
	s, f := newSweeps(t)
	seed(t, s, f, controller.StatusRunning, controller.TrialCompleted, controller.TrialRunning, controller.TrialRunning, controller.TrialRunning)
	setJob(f, controller.ControllerJobID("lr"), "running", "lr")
	f.PlanFunc = func(job *api.Job) (*api.JobPlanResponse, error) {
		if *job.ID != "lr-trial-002" {
			return &api.JobPlanResponse{}, nil
		}
		return &api.JobPlanResponse{FailedTGAllocs: map[string]*api.AllocationMetric{render.Group: {NodesEvaluated: 0}}}, nil
	}
	s.Nomad = queuedNomad{Fake: f, queued: map[string]bool{"lr-trial-002": true, "lr-trial-003": true}}
	st, err := s.ReadStatus(context.Background(), "lr")
	if err != nil {
		t.Fatal(err)
	}
	if st.Controller.Job != "lr-controller" || st.Controller.Status != "running" || st.Controller.Starts != 1 {
		t.Errorf("controller %+v", st.Controller)
	}
	if w := st.Trials[1].Waiting; !strings.HasPrefix(w, "needs ") {
		t.Errorf("the trial Nomad cannot place waits %q, want the placement explained", w)
	}
	if w := st.Trials[2].Waiting; w != "Nomad has not placed it yet" {
		t.Errorf("the trial Nomad has not placed waits %q", w)
	}
	if w := st.Trials[0].Waiting + st.Trials[3].Waiting; w != "" {
		t.Errorf("trials not queued wait %q", w)
	}

	// Without a controller job it is missing; a sweep never submitted is
	// ErrNoSweep.
	f.RemoveJob("lr-controller")
	if st, err := s.ReadStatus(context.Background(), "lr"); err != nil || st.Controller.Status != "missing" {
		t.Errorf("without a controller: %+v, %v", st, err)
	}
	if _, err := s.ReadStatus(context.Background(), "nosuch"); !errors.Is(err, sweepops.ErrNoSweep) ||
		!strings.Contains(err.Error(), `no sweep "nosuch" in namespace default`) {
		t.Errorf("an unknown sweep: %v", err)
	}
}

func TestStopOfAnEndedSweepStopsNothing(t *testing.T) {
	s, f := newSweeps(t)
	seed(t, s, f, controller.StatusCompleted, controller.TrialCompleted, controller.TrialFailed)
	p, events, err := stop(t, s, false)
	if err != nil || p != nil {
		t.Fatalf("%v %v", p, err)
	}
	if want := []sweepops.StopEvent{{Step: sweepops.StopEnded, Status: controller.StatusCompleted}}; !reflect.DeepEqual(events, want) {
		t.Errorf("events %+v, want %+v", events, want)
	}
	if len(f.Deregistered) != 0 {
		t.Errorf("deregistered %+v", f.Deregistered)
	}
}

// With no controller running, Stop stops the active trials' jobs itself
// and records that they, and the sweep, were stopped, at Now.
func TestStopWithoutAControllerStopsTheTrialsItself(t *testing.T) {
	s, f := newSweeps(t)
	seed(t, s, f, controller.StatusRunning, controller.TrialCompleted, controller.TrialRunning, controller.TrialPending)
	_, events, err := stop(t, s, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []sweepops.StopEvent{{Step: sweepops.StopDone, Counts: map[string]int{"completed": 1, "stopped": 2}}}
	if !reflect.DeepEqual(events, want) {
		t.Errorf("events %+v, want %+v", events, want)
	}
	want2 := []nomadapi.Deregistration{{JobID: "lr-trial-002"}, {JobID: "lr-trial-003"}}
	if !reflect.DeepEqual(f.Deregistered, want2) {
		t.Errorf("deregistered %+v, want %+v", f.Deregistered, want2)
	}
	_, st, _, err := s.Load(context.Background(), "lr")
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != controller.StatusStopped || st.Reason != "stopped by gpujob sweep stop" || !st.Ended.Equal(epoch) || !st.StopRequested {
		t.Errorf("state %s (%s), ended %v", st.Status, st.Reason, st.Ended)
	}
	for _, tr := range st.Trials[1:] {
		if tr.State != controller.TrialStopped || tr.StoppedBy != controller.StoppedByUser || !tr.Ended.Equal(epoch) {
			t.Errorf("trial %+v", tr)
		}
	}
}

// A state that names a job other than the sweep's own trial is not acted
// on: it is in Consul, where others may write.
func TestStopRefusesAStateThatNamesAnotherJob(t *testing.T) {
	s, f := newSweeps(t)
	seed(t, s, f, controller.StatusRunning, controller.TrialRunning)
	if _, err := s.Update(context.Background(), "lr", func(st *controller.State) error {
		st.Trials[0].JobID = "payroll"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	setJob(f, "payroll", "running", "")
	if _, _, err := stop(t, s, false); err == nil || !strings.Contains(err.Error(), "sweep lr: not stopping what its state names") {
		t.Errorf("stop: %v", err)
	}
	for _, d := range f.Deregistered {
		if d.JobID == "payroll" {
			t.Errorf("stop deregistered the job the state named")
		}
	}
}

// A running controller is asked to stop the trials, and Stop waits until
// it has ended the sweep, doing nothing of it itself.
func TestStopWaitsForARunningController(t *testing.T) {
	s, f := newSweeps(t)
	seed(t, s, f, controller.StatusRunning, controller.TrialCompleted, controller.TrialRunning)
	setJob(f, controller.ControllerJobID("lr"), "running", "lr")
	ctx, cancel := context.WithTimeout(context.Background(), sweepops.StopWait)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		// The controller: once asked, it stops the running trial and ends
		// the sweep.
		var index uint64
		for {
			st, meta, err := s.NextState(ctx, "lr", index, time.Second)
			if err != nil {
				done <- err
				return
			}
			index = meta.LastIndex
			if st.StopRequested {
				break
			}
		}
		_, err := s.Update(ctx, "lr", func(st *controller.State) error {
			st.Trials[1].State, st.Status, st.Ended = controller.TrialStopped, controller.StatusStopped, epoch
			return nil
		})
		done <- err
	}()
	_, events, err := stop(t, s, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want := []sweepops.StopEvent{{Step: sweepops.StopAsked}, {Step: sweepops.StopDone, Counts: map[string]int{"completed": 1, "stopped": 1}}}
	if !reflect.DeepEqual(events, want) {
		t.Errorf("events %+v, want %+v", events, want)
	}
	if len(f.Deregistered) != 0 {
		t.Errorf("stop deregistered %+v itself while the controller ran", f.Deregistered)
	}
}

// Purge removes the controller, every trial job of the sweep (named by its
// state, or carrying its meta) once their allocations are gone, and its KV
// tree; a job that only shares the name's prefix stays.
func TestPurgeRemovesTheSweepsJobsAndRecordsOnly(t *testing.T) {
	s, f := newSweeps(t)
	seed(t, s, f, controller.StatusRunning, controller.TrialCompleted, controller.TrialRunning)
	setJob(f, controller.ControllerJobID("lr"), "dead", "lr")
	setJob(f, "lr-trial-007", "running", "lr")   // the sweep's, not in its state
	setJob(f, "lr-frontend", "running", "other") // a stranger's
	f.SetAlloc(&api.Allocation{ID: "a1", JobID: "lr-trial-007", TaskGroup: render.Group, ClientStatus: "running"})
	f.OnDeregister = func(f *nomadapi.Fake, jobID string, purge bool) {
		if jobID == "lr-trial-007" && purge {
			f.UpdateAlloc("a1", func(a *api.Allocation) { a.ClientStatus = "complete" })
		}
	}
	p, events, err := stop(t, s, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 1 || events[0].Step != sweepops.StopDone {
		t.Errorf("events %+v, want the trials stopped first", events)
	}
	// The state's two trials (the first has no job left) and lr-trial-007.
	if want := (&sweepops.Purged{TrialJobs: 3}); !reflect.DeepEqual(p, want) {
		t.Errorf("purged %+v, want %+v", p, want)
	}
	jobs, _, _ := f.Jobs(nil)
	if len(jobs) != 1 || jobs[0].ID != "lr-frontend" {
		t.Errorf("%d jobs left, want lr-frontend only", len(jobs))
	}
	keys, _, err := s.Consul.KV().Keys(sweepkv.SweepKey(s.Prefix, "default", "lr")+"/", "", nil)
	if err != nil || len(keys) != 0 {
		t.Errorf("keys left: %v %v", keys, err)
	}
	if _, _, _, err := s.Load(context.Background(), "lr"); !errors.Is(err, sweepops.ErrNoSweep) {
		t.Errorf("after the purge: %v", err)
	}

	// A sweep with neither record nor state is purged of what is left of
	// it in Nomad; without purge it is an error.
	setJob(f, "lr-trial-009", "dead", "lr")
	if p, events, err := stop(t, s, true); err != nil || p.TrialJobs != 1 || len(events) != 0 {
		t.Errorf("purging what is left: %+v %+v %v", p, events, err)
	}
	if _, _, err := stop(t, s, false); !errors.Is(err, sweepops.ErrNoSweep) {
		t.Errorf("stopping a sweep that is gone: %v", err)
	}
}

// In queue mode the trials may wait in the queue as records: stop (without
// a controller) and purge withdraw them, and no other job's.
func TestStopAndPurgeWithdrawQueuedTrials(t *testing.T) {
	for _, purge := range []bool{false, true} {
		t.Run(fmt.Sprint("purge=", purge), func(t *testing.T) {
			s, f := newSweeps(t)
			s.QueuePrefix = "sweepops-test/" + t.Name() + "/queues"
			seed(t, s, f, controller.StatusRunning, controller.TrialRunning, controller.TrialRunning)
			kv := s.Consul.KV()
			for _, id := range []string{"lr-trial-001", "lr-trial-002", "lr-frontend", "lrx-trial-001"} {
				if _, err := kv.Put(&consul.KVPair{Key: s.QueuePrefix + "/jobs/default/" + id, Value: []byte("{}")}, nil); err != nil {
					t.Fatal(err)
				}
			}
			if _, _, err := stop(t, s, purge); err != nil {
				t.Fatal(err)
			}
			keys, _, err := kv.Keys(s.QueuePrefix+"/", "", nil)
			want := []string{s.QueuePrefix + "/jobs/default/lr-frontend", s.QueuePrefix + "/jobs/default/lrx-trial-001"}
			if err != nil || !reflect.DeepEqual(keys, want) {
				t.Errorf("queue records left %v (%v), want %v", keys, err, want)
			}
		})
	}
}

func TestControllerTroubleSaysWhyItCannotRun(t *testing.T) {
	s, f := newSweeps(t)
	if why := s.ControllerTrouble("lr"); why != "" {
		t.Errorf("no allocation: %q", why)
	}
	failed := func(id string, index uint64, ev *api.TaskEvent) {
		f.SetAlloc(&api.Allocation{ID: id, JobID: "lr-controller", ClientStatus: "failed", CreateIndex: index,
			TaskStates: map[string]*api.TaskState{"controller": {Events: []*api.TaskEvent{ev, {Type: api.TaskTerminated, Message: "exit 1"}}}}})
	}
	failed("a1", 10, &api.TaskEvent{Type: api.TaskDriverFailure, DriverError: "failed to launch command /old/gpujob"})
	if why := s.ControllerTrouble("lr"); why != "" {
		t.Errorf("one failure (Nomad retries): %q", why)
	}
	failed("a2", 20, &api.TaskEvent{Type: api.TaskDriverFailure, DriverError: "failed to launch command /opt/gpujob"})
	if why := s.ControllerTrouble("lr"); why != "failed to launch command /opt/gpujob" {
		t.Errorf("two failures: %q, want the last one's driver error", why)
	}
	f.SetAlloc(&api.Allocation{ID: "a3", JobID: "lr-controller", ClientStatus: "running"})
	if why := s.ControllerTrouble("lr"); why != "" {
		t.Errorf("one runs: %q", why)
	}
	if why := (&sweepops.Sweeps{}).ControllerTrouble("lr"); why != "" {
		t.Errorf("without Nomad: %q", why)
	}
}
