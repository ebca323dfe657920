package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/sweep/stopping"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"

	gconsul "github.com/gpujob/gpujob/internal/consul"
)

// rising is a trial that reports 0.5, 0.6, 0.7 and a result that grows
// with its index, so the best trial is the last.
func rising(tr Trial) script {
	return script{values: []float64{0.5, 0.6, 0.7 + float64(tr.Index)/100}}
}

func TestRunCompletes(t *testing.T) {
	cleanKV(t)
	f := newFakeCluster()
	p := basePlan()
	p.MaxTrials, p.Parallel, p.MaxFailedTrials = 6, 2, 1
	startSupervisors(t, f, "sw", func(tr Trial) script {
		sc := rising(tr)
		sc.fail = tr.Index == 2
		return sc
	})
	c := newController(t, p, &launcher{f: f, who: "a"}, "alloc-a")
	start := time.Now()
	if err := waitRun(t, runAsync(context.Background(), c), 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("6 trials in %s", time.Since(start))
	f.checkCreatedOnce(t, "sw", 6)
	if f.maxActive > 2 {
		t.Errorf("%d jobs active at once, parallel is 2", f.maxActive)
	}
	st := loadState(t)
	if st.Status != StatusCompleted || st.Reason != "all 6 trials ended: 5 completed, 1 failed" || st.Ended.IsZero() {
		t.Errorf("sweep %s: %q (ended %v)", st.Status, st.Reason, st.Ended)
	}
	if len(st.Trials) != 6 || st.Starts != 1 || st.Controller != "alloc-a" {
		t.Errorf("%d trials, %d starts, controller %q", len(st.Trials), st.Starts, st.Controller)
	}
	for _, tr := range st.Trials {
		want := TrialCompleted
		if tr.Index == 2 {
			want = TrialFailed
		}
		if tr.State != want || tr.Step != 3 || tr.Waiting != "" {
			t.Errorf("%s: %+v, want %s at step 3", tr.ID, tr, want)
		}
	}
	if b := st.Best(true); b == nil || b.ID != "trial-006" || *b.Value != 0.75 {
		t.Errorf("best %+v", b)
	}
	checkNoGoroutines(t)
	checkReleased(t)
}

// cutTransport is a Consul connection the test can cut, as a controller
// killed at once (or cut off the network) can no longer destroy its
// session.
type cutTransport struct {
	base http.RoundTripper
	cut  atomic.Bool
}

func (c *cutTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.cut.Load() {
		return nil, errors.New("connection cut by the test")
	}
	return c.base.RoundTrip(r)
}

// TestRunResumes kills controller after controller at different points of
// a round (before a saved trial is launched, right after, while observing)
// and starts the next, until the sweep ends: every trial is launched as one
// job, exactly max_trials of them.
func TestRunResumes(t *testing.T) {
	cleanKV(t)
	f := newFakeCluster()
	p := basePlan()
	p.MaxTrials, p.Parallel = 9, 3
	startSupervisors(t, f, "sw", rising)
	crashes := []struct {
		alloc string // the controller's allocation
		op    string // the launcher call it dies in
		n     int    // at its n-th call
		hard  bool   // its Consul connection is cut too: its session is left behind
	}{
		{"alloc-1", "launch", 1, false},   // saved the first trials, launched none
		{"alloc-1", "launched", 2, false}, // launched one, not the second
		{"alloc-1", "launch", 2, true},    // killed outright between saving and launching
		{"alloc-1", "observe", 2, false},  // (Nomad restarted the task: takes over at once)
		{"alloc-2", "launched", 1, false}, // (Nomad rescheduled it)
		{"alloc-2", "launch", 1, false},
		{"alloc-3", "observe", 3, false},
		{"alloc-3", "", 0, false}, // the last one runs to the end
	}
	var killed []<-chan error
	var cuts []*cutTransport
	for i, cr := range crashes {
		ctx, cancel := context.WithCancel(context.Background())
		l := &launcher{f: f, who: cr.alloc}
		c := newController(t, p, l, cr.alloc)
		ct := &cutTransport{base: http.DefaultTransport}
		client, err := api.NewClient(&api.Config{Address: consulAddr(t), HttpClient: &http.Client{Transport: ct}})
		if err != nil {
			t.Fatal(err)
		}
		c.Consul = client
		calls := 0
		l.hook = func(op, jobID string) error {
			if op != cr.op {
				return nil
			}
			calls++
			if calls != cr.n {
				return nil
			}
			t.Logf("controller %d (%s) dies in %s %s", i+1, cr.alloc, op, jobID)
			if cr.hard {
				ct.cut.Store(true)
			}
			cancel()
			return context.Canceled
		}
		ch := runAsync(ctx, c)
		if cr.op == "" {
			if err := waitRun(t, ch, 30*time.Second); err != nil {
				t.Fatalf("the last controller: %v", err)
			}
			cancel()
			break
		}
		select {
		case err := <-ch:
			cancel()
			t.Fatalf("controller %d returned before its crash: %v", i+1, err)
		case <-ctx.Done():
		}
		if cr.hard {
			// Its deferred session close cannot get through: it returns
			// later; the next controller takes over meanwhile.
			killed, cuts = append(killed, ch), append(cuts, ct)
		} else if err := waitRun(t, ch, 10*time.Second); err == nil {
			t.Fatalf("controller %d: Run returned nil after its crash", i+1)
		}
	}
	for _, ct := range cuts {
		ct.cut.Store(false)
	}
	for _, ch := range killed {
		waitRun(t, ch, 10*time.Second)
	}
	f.checkCreatedOnce(t, "sw", 9)
	st := loadState(t)
	if st.Status != StatusCompleted || len(st.Trials) != 9 || st.Counts()[TrialCompleted] != 9 {
		t.Errorf("sweep %s (%s), %d trials, counts %v", st.Status, st.Reason, len(st.Trials), st.Counts())
	}
	if st.Starts > len(crashes) || st.Starts < 2 {
		t.Errorf("%d starts recorded, %d controllers", st.Starts, len(crashes))
	}
	t.Logf("%d controllers (%d saved a round), %d launch calls for %d jobs", len(crashes), st.Starts, len(f.callsOf("launch", "")), len(f.order))
	checkNoGoroutines(t)
	checkReleased(t)
}

func consulAddr(t *testing.T) string {
	needConsul(t)
	return consulAddress
}

// TestRunTwoControllers: of two controllers started together, one runs the
// sweep; the other waits for the lock, and takes it only to find the sweep
// ended.
func TestRunTwoControllers(t *testing.T) {
	cleanKV(t)
	f := newFakeCluster()
	p := basePlan()
	p.MaxTrials, p.Parallel = 4, 2
	startSupervisors(t, f, "sw", rising)
	var mu sync.Mutex
	used := map[string]int{} // launcher calls by controller
	var runs []<-chan error
	for _, alloc := range []string{"alloc-a", "alloc-b"} {
		l := &launcher{f: f, who: alloc, hook: func(op, jobID string) error {
			mu.Lock()
			used[alloc]++
			mu.Unlock()
			return nil
		}}
		runs = append(runs, runAsync(context.Background(), newController(t, p, l, alloc)))
	}
	for _, ch := range runs {
		if err := waitRun(t, ch, 30*time.Second); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	if (used["alloc-a"] == 0) == (used["alloc-b"] == 0) {
		t.Errorf("launcher calls by controller: %v; want one of them only", used)
	}
	f.checkCreatedOnce(t, "sw", 4)
	st := loadState(t)
	if st.Status != StatusCompleted || st.Starts != 2 {
		t.Errorf("sweep %s (%s), %d starts", st.Status, st.Reason, st.Starts)
	}
	checkNoGoroutines(t)
	checkReleased(t)
}

// TestRunLockTakeover: a lock left by a controller that died without
// releasing it is taken over at once by its own allocation's next
// controller (Nomad restarted the task), and only once its session has
// expired by a controller of another allocation.
func TestRunLockTakeover(t *testing.T) {
	for _, tc := range []struct {
		name, alloc string
		ttl         time.Duration // the dead controller's session
	}{
		{"same allocation", "alloc-1", 10 * time.Second},
		{"another allocation", "alloc-2", time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cleanKV(t)
			consul := needConsul(t)
			f := newFakeCluster()
			p := basePlan()
			p.MaxTrials, p.Parallel = 2, 1
			c := newController(t, p, &launcher{f: f, who: tc.alloc}, tc.alloc)
			// The dead predecessor of allocation alloc-1: its session,
			// made as Run makes its own, holds the lock.
			opts := c.sessionOptions()
			dead, _, err := consul.Session().CreateNoChecks(&api.SessionEntry{
				Name: opts.Name, TTL: tc.ttl.String(), LockDelay: opts.LockDelay, Behavior: api.SessionBehaviorDelete,
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer consul.Session().Destroy(dead, nil)
			lockKey := sweepkv.LockKey(testPrefix(t), "default", "sw")
			if ok, _, err := consul.KV().Acquire(&api.KVPair{Key: lockKey, Value: []byte("alloc-1"), Session: dead}, nil); !ok || err != nil {
				t.Fatalf("predecessor's lock: %v %v", ok, err)
			}
			died := time.Now()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ch := runAsync(ctx, c)
			waitFor(t, 10*time.Second, "first launch", func() bool { return len(f.callsOf("launch", "")) > 0 })
			took := time.Since(died)
			info, _, err := consul.Session().Info(dead, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("first launch %s after the predecessor died", took)
			if info != nil {
				t.Errorf("launched while the dead controller's session lives")
			}
			switch tc.alloc {
			case "alloc-1":
				if took >= 2*time.Second {
					t.Errorf("same-allocation takeover took %s, want < 2s", took)
				}
			default:
				if took < tc.ttl {
					t.Errorf("took the lock after %s, before the session's TTL %s", took, tc.ttl)
				}
			}
			if st := loadState(t); st.Controller != tc.alloc || st.Starts != 1 {
				t.Errorf("state: controller %q, %d starts", st.Controller, st.Starts)
			}
			cancel()
			if err := waitRun(t, ch, 10*time.Second); !errors.Is(err, context.Canceled) {
				t.Errorf("Run after cancel: %v", err)
			}
			checkNoGoroutines(t)
			checkReleased(t)
		})
	}
}

// TestRunLockLost: a controller whose session is destroyed from outside
// stops.
func TestRunLockLost(t *testing.T) {
	cleanKV(t)
	consul := needConsul(t)
	f := newFakeCluster()
	p := basePlan()
	p.MaxTrials, p.Parallel = 2, 1
	c := newController(t, p, &launcher{f: f, who: "a"}, "alloc-a")
	ch := runAsync(context.Background(), c)
	waitFor(t, 10*time.Second, "first launch", func() bool { return len(f.callsOf("launch", "")) > 0 })
	pair, _, err := consul.KV().Get(sweepkv.LockKey(testPrefix(t), "default", "sw"), nil)
	if err != nil || pair == nil || pair.Session == "" {
		t.Fatalf("lock: %+v %v", pair, err)
	}
	if _, err := consul.Session().Destroy(pair.Session, nil); err != nil {
		t.Fatal(err)
	}
	err = waitRun(t, ch, 10*time.Second)
	if !errors.Is(err, errLockLost) {
		t.Errorf("Run: %v, want the lock lost", err)
	}
	checkNoGoroutines(t)
}

// TestRunStopRequest: gpujob sweep stop writes StopRequested with
// check-and-set; the controller stops every trial (a supervisor that obeys
// ends its job; one that does not has its job stopped StopGrace after the
// request, within 2 s) and exits.
func TestRunStopRequest(t *testing.T) {
	cleanKV(t)
	consul := needConsul(t)
	f := newFakeCluster()
	p := basePlan()
	p.MaxTrials, p.Parallel = 10, 3
	sup := startSupervisors(t, f, "sw", func(Trial) script { return script{values: []float64{0.5}, forever: true} })
	sup.stubborn = func(tr Trial) bool { return tr.Index == 1 }
	ch := runAsync(context.Background(), newController(t, p, &launcher{f: f, who: "a"}, "alloc-a"))
	waitFor(t, 10*time.Second, "3 trials running", func() bool {
		st := loadState(t)
		return st.Counts()[TrialRunning] == 3 && st.Trials[0].Step > 0 && st.Trials[1].Step > 0 && st.Trials[2].Step > 0
	})
	// Another writer: check-and-set, again on a conflict.
	for {
		st, index, err := LoadState(context.Background(), consul, testPrefix(t), "default", "sw")
		if err != nil {
			t.Fatal(err)
		}
		st.StopRequested = true
		ok, err := SaveState(context.Background(), consul, testPrefix(t), st, index)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
	}
	if err := waitRun(t, ch, 10*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st := loadState(t)
	if st.Status != StatusStopped || st.Reason != "stopped by gpujob sweep stop" || len(st.Trials) != 3 {
		t.Errorf("sweep %s (%q), %d trials", st.Status, st.Reason, len(st.Trials))
	}
	for _, tr := range st.Trials {
		if tr.State != TrialStopped || tr.StoppedBy != StoppedByUser || tr.Reason != "the sweep was stopped" {
			t.Errorf("%s: %+v", tr.ID, tr)
		}
		req := stopRequest(t, tr.ID)
		stops := f.callsOf("stop", "")
		var stopCall *call
		for i := range stops {
			if stops[i].jobID == tr.JobID {
				stopCall = &stops[i]
			}
		}
		switch {
		case tr.Index == 1 && stopCall == nil:
			t.Errorf("%s ignored its stop request and its job was never stopped", tr.ID)
		case tr.Index == 1:
			// The grace counts from the decision to stop (StopAt, the
			// round's clock), which the request's own time follows by the
			// write: on a loaded machine by over 100 ms.
			after := stopCall.at.Sub(tr.StopAt)
			t.Logf("%s: job stopped %s after the decision to stop it (%s after its request was written)", tr.ID, after, stopCall.at.Sub(req.At))
			if after > StopGrace+3*time.Second || after < StopGrace-100*time.Millisecond {
				t.Errorf("%s: job stopped %s after the decision to stop it, want within [%s, %s]", tr.ID, after, StopGrace, StopGrace+3*time.Second)
			}
		case stopCall != nil:
			t.Errorf("%s obeyed its stop request, yet its job was stopped", tr.ID)
		}
	}
	if n := len(f.callsOf("launch", "")); n != 3 {
		t.Errorf("%d launches", n)
	}
	for _, id := range f.order {
		if ph := f.phase(id); ph == JobQueued || ph == JobRunning {
			t.Errorf("Run returned while job %s is %s", id, ph)
		}
	}
	checkNoGoroutines(t)
	checkReleased(t)
}

func stopRequest(t *testing.T, trial string) sweepkv.StopRequest {
	t.Helper()
	pair, _, err := needConsul(t).KV().Get(sweepkv.StopKey(testPrefix(t), "default", "sw", trial), nil)
	if err != nil || pair == nil {
		t.Fatalf("stop request of %s: %v %v", trial, pair, err)
	}
	var r sweepkv.StopRequest
	if err := json.Unmarshal(pair.Value, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRunEarlyStopping: ASHA stops the bad trials through the controller:
// their stop requests carry the reason, a stubborn one's job is stopped
// within 2 s, and the good trials complete.
func TestRunEarlyStopping(t *testing.T) {
	cleanKV(t)
	f := newFakeCluster()
	p := basePlan()
	p.MaxTrials, p.Parallel = 4, 2
	p.Rule, p.RuleName = stopping.ASHA{GracePeriod: 2, ReductionFactor: 2}, StoppedByASHA
	sup := startSupervisors(t, f, "sw", func(tr Trial) script {
		if tr.Index%2 == 1 {
			// The bad trials start late, so the good ones have reached
			// each rung before them.
			return script{values: []float64{0.1, 0.1, 0.2}, delay: 150 * time.Millisecond, forever: tr.Index == 3}
		}
		return script{values: []float64{0.5, 0.6, 0.7, 0.8}}
	})
	sup.stubborn = func(tr Trial) bool { return tr.Index == 3 }
	sup.interval = 40 * time.Millisecond
	if err := waitRun(t, runAsync(context.Background(), newController(t, p, &launcher{f: f, who: "a"}, "alloc-a")), 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st := loadState(t)
	for _, tr := range st.Trials {
		switch tr.Index % 2 {
		case 0:
			if tr.State != TrialCompleted {
				t.Errorf("%s: %+v", tr.ID, tr)
			}
		case 1:
			if tr.State != TrialStopped || tr.StoppedBy != StoppedByASHA || !strings.HasPrefix(tr.Reason, "stopped by ASHA at step 2: 0.1 < rung cut") {
				t.Errorf("%s: %+v", tr.ID, tr)
				continue
			}
			if r := stopRequest(t, tr.ID); r.Reason != tr.Reason {
				t.Errorf("%s: stop request %q", tr.ID, r.Reason)
			}
		}
	}
	stops := f.callsOf("stop", "")
	if len(stops) != 1 || stops[0].jobID != TrialJobID("sw", 3) {
		t.Fatalf("jobs stopped: %v; want only the stubborn trial-004's", stops)
	}
	after := stops[0].at.Sub(stopRequest(t, "trial-004").At)
	t.Logf("trial-004: job stopped %s after the stop request", after)
	if after > 2*time.Second || after < StopGrace-100*time.Millisecond {
		t.Errorf("trial-004's job stopped %s after the decision, want within [%s, 2s]", after, StopGrace)
	}
	checkNoGoroutines(t)
}

// TestRunExtend: a sweep that completed (its controller exited) and is
// then extended (gpujob sweep extend: Status running again, MaxTrials
// raised, with check-and-set) is run on by a new controller from the
// recorded history.
func TestRunExtend(t *testing.T) {
	cleanKV(t)
	consul := needConsul(t)
	f := newFakeCluster()
	p := basePlan()
	p.MaxTrials, p.Parallel = 2, 2
	startSupervisors(t, f, "sw", rising)
	if err := waitRun(t, runAsync(context.Background(), newController(t, p, &launcher{f: f, who: "a"}, "alloc-a")), 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st, index, err := LoadState(context.Background(), consul, testPrefix(t), "default", "sw")
	if err != nil || st.Status != StatusCompleted {
		t.Fatalf("before the extension: %v, %+v", err, st)
	}
	st.Status, st.MaxTrials = StatusRunning, st.MaxTrials+3
	if ok, err := SaveState(context.Background(), consul, testPrefix(t), st, index); !ok || err != nil {
		t.Fatalf("extending: %v %v", ok, err)
	}
	if err := waitRun(t, runAsync(context.Background(), newController(t, p, &launcher{f: f, who: "b"}, "alloc-b")), 30*time.Second); err != nil {
		t.Fatalf("Run after the extension: %v", err)
	}
	f.checkCreatedOnce(t, "sw", 5)
	st = loadState(t)
	if st.Status != StatusCompleted || st.Reason != "all 5 trials ended: 5 completed" || st.Starts != 2 || len(f.callsOf("launch", "a")) != 2 {
		t.Errorf("sweep %s (%q), %d starts, %d launches by the first", st.Status, st.Reason, st.Starts, len(f.callsOf("launch", "a")))
	}
	checkNoGoroutines(t)
	checkReleased(t)
}

// TestRunCASConflict: another writer changes the state between the
// controller's read and its write (here gpujob sweep extend, in the middle
// of a round): the controller's write fails, it reads the state again and
// reconciles that, so neither change is lost.
func TestRunCASConflict(t *testing.T) {
	cleanKV(t)
	consul := needConsul(t)
	f := newFakeCluster()
	p := basePlan()
	p.MaxTrials, p.Parallel = 2, 2
	startSupervisors(t, f, "sw", rising)
	var once sync.Once
	l := &launcher{f: f, who: "a", hook: func(op, jobID string) error {
		if op != "observe" {
			return nil
		}
		once.Do(func() {
			st, index, err := LoadState(context.Background(), consul, testPrefix(t), "default", "sw")
			if err != nil {
				t.Error(err)
				return
			}
			st.MaxTrials = 3
			if ok, err := SaveState(context.Background(), consul, testPrefix(t), st, index); !ok || err != nil {
				t.Errorf("the other writer: %v %v", ok, err)
			}
		})
		return nil
	}}
	if err := waitRun(t, runAsync(context.Background(), newController(t, p, l, "alloc-a")), 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	f.checkCreatedOnce(t, "sw", 3)
	if st := loadState(t); st.Status != StatusCompleted || len(st.Trials) != 3 || st.MaxTrials != 3 || st.Starts != 1 {
		t.Errorf("sweep %s (%q): %d trials of max %d, %d starts", st.Status, st.Reason, len(st.Trials), st.MaxTrials, st.Starts)
	}
	checkNoGoroutines(t)
}

// TestRunLaunchRefused: a launch the cluster refuses fails its trial in the
// next round, at once (nothing else would wake the controller here).
func TestRunLaunchRefused(t *testing.T) {
	cleanKV(t)
	f := newFakeCluster()
	p := basePlan()
	p.MaxTrials, p.Parallel, p.MaxFailedTrials = 1, 1, 0
	l := &launcher{f: f, who: "a", hook: func(op, jobID string) error {
		if op == "launch" {
			return fmt.Errorf("job %s: %w: the job's driver is not allowed", jobID, ErrRefused)
		}
		return nil
	}}
	start := time.Now()
	if err := waitRun(t, runAsync(context.Background(), newController(t, p, l, "alloc-a")), 10*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("took %s", took)
	}
	st := loadState(t)
	if st.Status != StatusFailed || !strings.Contains(st.Reason, "1 trial failed, more than max_failed_trials = 0; the last: trial-001: its job could not be launched: job sw-trial-001: refused: the job's driver is not allowed") {
		t.Errorf("sweep %s: %q", st.Status, st.Reason)
	}
	checkNoGoroutines(t)
	checkReleased(t)
}

// TestSaveChecksTheLock: the controller's state write lands only while its
// session holds the lock, and tells a lost lock from a check-and-set
// conflict.
func TestSaveChecksTheLock(t *testing.T) {
	cleanKV(t)
	consul := needConsul(t)
	ctx := context.Background()
	c := newController(t, basePlan(), &launcher{f: newFakeCluster()}, "alloc-a")
	opts := c.sessionOptions()
	mk := func() string {
		id, _, err := consul.Session().CreateNoChecks(&api.SessionEntry{Name: opts.Name, TTL: "10s", LockDelay: time.Millisecond, Behavior: api.SessionBehaviorDelete}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { consul.Session().Destroy(id, nil) })
		return id
	}
	sess, err := gconsul.NewSession(ctx, consul, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Close(context.Background()) })
	holder, other := sess.ID(), mk()
	if err := c.lock(ctx, sess); err != nil {
		t.Fatal(err)
	}
	st := &State{Namespace: "default", Sweep: "sw", Status: StatusRunning}
	if _, _, err := c.save(ctx, other, st, 0); !errors.Is(err, errLockLost) {
		t.Errorf("save without the lock: %v, want the lock lost", err)
	}
	ok, index, err := c.save(ctx, holder, st, 0)
	if !ok || err != nil || index == 0 {
		t.Fatalf("save with the lock: %v %d %v", ok, index, err)
	}
	if ok, _, err := c.save(ctx, holder, st, index-1); ok || err != nil {
		t.Errorf("save at a stale index: %v %v, want a conflict", ok, err)
	}
	if _, got, _ := LoadState(ctx, consul, testPrefix(t), "default", "sw"); got != index {
		t.Errorf("state at index %d, saved at %d", got, index)
	}
}
