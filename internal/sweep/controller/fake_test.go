package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
	"github.com/gpujob/gpujob/internal/testagent"
)

// consulClient is the dev agent this test binary started (nil in -short),
// at consulAddress.
var (
	consulClient  *api.Client
	consulAddress string
)

func TestMain(m *testing.M) {
	// TTLs down to 1 s, so a test can wait for a session to expire.
	os.Exit(testagent.Main(m, `session_ttl_min = "1s"`, func(a *testagent.Consul) (err error) {
		consulAddress = a.Addr
		consulClient, err = api.NewClient(&api.Config{Address: a.Addr})
		return err
	}))
}

func needConsul(t *testing.T) *api.Client {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a Consul agent; skipped in -short mode")
	}
	return consulClient
}

// fakeCluster is Nomad as the controllers see it through their Launchers:
// in-memory jobs whose phases the test (or its fake supervisors) drives.
type fakeCluster struct {
	mu      sync.Mutex
	jobs    map[string]*fakeJob
	order   []string // job IDs in creation order
	calls   []call   // every Launch and StopJob call, in order
	index   uint64
	changed chan struct{} // closed and replaced on every change
	// maxActive is the most jobs queued or running at once.
	maxActive int
	// created is signalled with each new job.
	created chan *fakeJob
}

type fakeJob struct {
	id      string
	trial   Trial
	phase   JobPhase
	created time.Time
	stopped time.Time // when StopJob stopped it
}

type call struct {
	op, who, jobID string
	at             time.Time
}

func newFakeCluster() *fakeCluster {
	return &fakeCluster{jobs: map[string]*fakeJob{}, changed: make(chan struct{}), created: make(chan *fakeJob, 1000)}
}

// bump records a change; f.mu is held.
func (f *fakeCluster) bump() {
	f.index++
	close(f.changed)
	f.changed = make(chan struct{})
	active := 0
	for _, j := range f.jobs {
		if j.phase == JobQueued || j.phase == JobRunning {
			active++
		}
	}
	f.maxActive = max(f.maxActive, active)
}

func (f *fakeCluster) setPhase(id string, phase JobPhase) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if j := f.jobs[id]; j != nil && j.phase != phase {
		j.phase = phase
		f.bump()
	}
}

func (f *fakeCluster) phase(id string) JobPhase {
	f.mu.Lock()
	defer f.mu.Unlock()
	if j := f.jobs[id]; j != nil {
		return j.phase
	}
	return JobMissing
}

// callsOf returns the calls of op ("launch", "stop"), of everyone when who
// is empty.
func (f *fakeCluster) callsOf(op, who string) []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if c.op == op && (who == "" || c.who == who) {
			out = append(out, c)
		}
	}
	return out
}

// launcher is one controller's view of the cluster. hook, when set, runs
// at the start of each Launch, Observe and StopJob (op "launch", "observe",
// "stop") and again after a Launch has created its job ("launched"); an
// error it returns is the call's.
type launcher struct {
	f    *fakeCluster
	who  string
	hook func(op, jobID string) error
}

func (l *launcher) run(op, jobID string) error {
	if l.hook == nil {
		return nil
	}
	return l.hook(op, jobID)
}

func (l *launcher) Launch(ctx context.Context, t Trial) error {
	if err := l.run("launch", t.JobID); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	f := l.f
	f.mu.Lock()
	f.calls = append(f.calls, call{op: "launch", who: l.who, jobID: t.JobID, at: time.Now()})
	if f.jobs[t.JobID] == nil {
		j := &fakeJob{id: t.JobID, trial: t, phase: JobQueued, created: time.Now()}
		f.jobs[t.JobID] = j
		f.order = append(f.order, t.JobID)
		f.bump()
		f.created <- j
	}
	f.mu.Unlock()
	return l.run("launched", t.JobID)
}

func (l *launcher) Observe(ctx context.Context, ids []string) (map[string]JobObservation, error) {
	if err := l.run("observe", ""); err != nil {
		return nil, err
	}
	f := l.f
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]JobObservation{}
	for _, id := range ids {
		out[id] = JobObservation{Phase: JobMissing}
		if j := f.jobs[id]; j != nil {
			out[id] = JobObservation{Phase: j.phase}
		}
	}
	return out, nil
}

func (l *launcher) StopJob(ctx context.Context, id string) error {
	if err := l.run("stop", id); err != nil {
		return err
	}
	f := l.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{op: "stop", who: l.who, jobID: id, at: time.Now()})
	if j := f.jobs[id]; j != nil && (j.phase == JobQueued || j.phase == JobRunning) {
		j.phase, j.stopped = JobStopped, time.Now()
		f.bump()
	}
	return nil
}

func (l *launcher) WaitJobs(ctx context.Context, index uint64) (uint64, error) {
	f := l.f
	for {
		f.mu.Lock()
		cur, ch := f.index, f.changed
		f.mu.Unlock()
		if cur != index {
			return cur, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return index, ctx.Err()
		}
	}
}

// checkCreatedOnce fails unless exactly the jobs of trials 0..n-1 exist,
// each created once (the map cannot hold two, so: no job was created while
// one of its ID existed, and no other job appeared).
func (f *fakeCluster) checkCreatedOnce(t *testing.T, sweep string, n int) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	want := make([]string, n)
	for i := range n {
		want[i] = TrialJobID(sweep, i)
	}
	got := slices.Sorted(slices.Values(f.order))
	if !slices.Equal(got, want) {
		t.Errorf("jobs created %v, want each of %v once", f.order, want)
	}
}

// supervisors plays every trial job's supervisor and Nomad's scheduling:
// each new job starts running after a moment, its rank 0 reports the
// points script gives for its trial (writing the metrics record under a
// session of its own, as the real reporter does), and the job ends: complete,
// or failed when script says so. A supervisor obeys its trial's stop
// request (it ends the job as complete) unless stubborn says otherwise.
type supervisors struct {
	t        *testing.T
	f        *fakeCluster
	consul   *api.Client
	prefix   string
	sweep    string
	script   func(tr Trial) script
	stubborn func(tr Trial) bool
	interval time.Duration // between points
	wg       sync.WaitGroup
	stop     chan struct{}
}

// script is what one trial does.
type script struct {
	values  []float64     // reported at steps 1, 2, ...
	fail    bool          // the job fails after its points
	forever bool          // keeps reporting its last value until stopped
	delay   time.Duration // before its first point
}

func startSupervisors(t *testing.T, f *fakeCluster, sweep string, sc func(Trial) script) *supervisors {
	s := &supervisors{t: t, f: f, consul: needConsul(t), prefix: testPrefix(t), sweep: sweep, script: sc,
		interval: 15 * time.Millisecond, stop: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			select {
			case j := <-f.created:
				s.wg.Add(1)
				go func() { defer s.wg.Done(); s.runJob(j) }()
			case <-s.stop:
				return
			}
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *supervisors) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.wg.Wait()
}

func (s *supervisors) sleep(d time.Duration) bool {
	select {
	case <-s.stop:
		return false
	case <-time.After(d):
		return true
	}
}

func (s *supervisors) runJob(j *fakeJob) {
	tr := j.trial
	sc := s.script(tr)
	if !s.sleep(10 * time.Millisecond) {
		return
	}
	if s.f.phase(j.id) != JobQueued {
		return
	}
	s.f.setPhase(j.id, JobRunning)
	kv := s.consul.KV()
	sess, _, err := s.consul.Session().CreateNoChecks(&api.SessionEntry{Name: "fake supervisor " + j.id, TTL: "10s", Behavior: api.SessionBehaviorRelease, LockDelay: time.Millisecond}, nil)
	if err != nil {
		s.t.Errorf("supervisor session: %v", err)
		return
	}
	// Ending the session (Behavior release) leaves the record, not
	// held: the trial has no live supervisor.
	defer s.consul.Session().Destroy(sess, nil)
	metricsKey := sweepkv.MetricsKey(s.prefix, "default", s.sweep, tr.ID)
	stopKey := sweepkv.StopKey(s.prefix, "default", s.sweep, tr.ID)
	var m sweepkv.Metrics
	write := func(p sweepkv.Point) {
		m.Points = append(m.Points, p)
		m.Updated = time.Now()
		b, _ := json.Marshal(m)
		if ok, _, err := kv.Acquire(&api.KVPair{Key: metricsKey, Value: b, Session: sess}, nil); err != nil || !ok {
			s.t.Errorf("writing %s: %v %v", metricsKey, ok, err)
		}
	}
	stopped := func() bool {
		if s.f.phase(j.id) != JobRunning {
			return true // stopped by the controller
		}
		if s.stubborn != nil && s.stubborn(tr) {
			return false
		}
		if p, _, _ := kv.Get(stopKey, nil); p != nil {
			s.f.setPhase(j.id, JobComplete) // obeys: a clean exit
			return true
		}
		return false
	}
	if sc.delay > 0 && !s.sleep(sc.delay) {
		return
	}
	step := 0
	for i := 0; i < len(sc.values) || sc.forever; i++ {
		if !s.sleep(s.interval) || stopped() {
			return
		}
		v := sc.values[min(i, len(sc.values)-1)]
		step++
		write(sweepkv.Point{Step: step, Values: map[string]float64{"acc": v}, Final: i == len(sc.values)-1 && !sc.fail && !sc.forever})
	}
	if !s.sleep(s.interval) || stopped() {
		return
	}
	if sc.fail {
		s.f.setPhase(j.id, JobFailed)
	} else {
		s.f.setPhase(j.id, JobComplete)
	}
}

// testPrefix is a KV prefix of the test's own.
func testPrefix(t *testing.T) string {
	return "test-sweeps/" + strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
}

// cleanKV deletes the test's KV tree now and when it ends.
func cleanKV(t *testing.T) {
	c := needConsul(t)
	del := func() { _, _ = c.KV().DeleteTree(testPrefix(t)+"/", nil) }
	del()
	t.Cleanup(del)
}

// newController is a controller of sweep "sw" in namespace "default".
func newController(t *testing.T, plan *Plan, l Launcher, alloc string) *Controller {
	return &Controller{
		Consul: needConsul(t), Prefix: testPrefix(t), Plan: plan, Launcher: l, AllocID: alloc,
		SessionTTL: 2 * time.Second,
		Logf: func(format string, args ...any) {
			t.Logf("[%s] %s", alloc, fmt.Sprintf(format, args...))
		},
	}
}

// runAsync runs c and sends its result.
func runAsync(ctx context.Context, c *Controller) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- c.Run(ctx) }()
	return ch
}

func waitRun(t *testing.T, ch <-chan error, limit time.Duration) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(limit):
		t.Fatalf("Run has not returned after %s", limit)
		return nil
	}
}

// waitFor polls cond until it holds or limit passes.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s", what, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// loadState reads the test's sweep state.
func loadState(t *testing.T) *State {
	t.Helper()
	st, _, err := LoadState(context.Background(), needConsul(t), testPrefix(t), "default", "sw")
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// checkNoGoroutines fails if a goroutine of a Controller or of its Consul
// session is still there (after every Run of the test has returned).
func checkNoGoroutines(t *testing.T) {
	t.Helper()
	var left string
	for range 100 {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		left = ""
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "sweep/controller.(*Controller)") || strings.Contains(g, "sweep/controller.(*runner)") ||
				strings.Contains(g, "internal/consul.(*Session)") {
				left += g + "\n\n"
			}
		}
		if left == "" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("goroutines left after Run returned:\n%s", left)
}

// checkReleased fails if the sweep's lock key or a controller session is
// left.
func checkReleased(t *testing.T) {
	t.Helper()
	c := needConsul(t)
	if p, _, err := c.KV().Get(sweepkv.LockKey(testPrefix(t), "default", "sw"), nil); err != nil || p != nil {
		t.Errorf("lock key left: %+v (%v)", p, err)
	}
	ss, _, err := c.Session().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		if s.Name == "gpujob-sweep default/sw" {
			t.Errorf("controller session left: %s", s.ID)
		}
	}
}
