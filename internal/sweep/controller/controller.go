package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/gpujob/gpujob/internal/backoff"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/consul"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// Launcher is what the controller needs of Nomad.
type Launcher interface {
	// Launch registers the trial's job only if no job of its ID exists
	// (so no trial ever runs twice); an existing job is success. Errors
	// wrapping ErrRefused fail the trial; others are retried. It is called
	// again, for the same trial, every round until Observe sees the job.
	Launch(ctx context.Context, t Trial) error
	// Observe returns the phase of each job (every ID gets an answer; a
	// trial whose job gets none is left as it is). A job's final metrics
	// must be in Consul KV before Observe says it is dead: the supervisor
	// writes them before it exits, and the controller reads the metrics
	// after Observe.
	Observe(ctx context.Context, jobIDs []string) (map[string]JobObservation, error)
	// StopJob stops the job (not purging it); a missing job is success.
	StopJob(ctx context.Context, jobID string) error
	// WaitJobs blocks until the sweep's trial jobs may have changed since
	// index (a Nomad blocking query) and returns the new index.
	WaitJobs(ctx context.Context, index uint64) (uint64, error)
}

// ErrRefused marks a launch that cannot succeed by retrying.
var ErrRefused = errors.New("refused")

// Controller runs one sweep until it ends. Run it as the only task of a
// Nomad job: any number may start, one at a time holds the lock, and every
// write of the state checks, in the same transaction, that the writer
// still holds it. It logs each trial's changes and the sweep's progress
// through Logf.
type Controller struct {
	Consul   *api.Client
	Prefix   string // sweepkv prefix
	Plan     *Plan
	Launcher Launcher
	// AllocID is the controller's Nomad allocation (NOMAD_ALLOC_ID): a
	// restarted task of the same allocation takes over its predecessor's
	// lock at once instead of waiting for the session's TTL.
	AllocID    string
	SessionTTL time.Duration // default 10s
	// QueuePrefix is the queues' tree (contract.QueuePrefix when ""): when
	// its configuration exists, trials are queued there (queue.go) rather
	// than registered.
	QueuePrefix string
	Logf        func(format string, args ...any)
	Now         func() time.Time
}

func (c *Controller) logf(format string, args ...any) {
	if c.Logf != nil {
		c.Logf(format, args...)
	}
}

func (c *Controller) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Controller) key(f func(prefix, ns, sweep string) string) string {
	return f(c.Prefix, c.Plan.Namespace, c.Plan.Sweep)
}

// sessionOptions are the controller's Consul session's: TTL-only (it lives
// exactly as long as the controller renews it), deleting the lock key when
// it ends, with a lock delay of 1 ms so the lock passes to the next
// controller at once: every state write checks the lock in the same
// transaction, so a late write of the old controller cannot land.
func (c *Controller) sessionOptions() consul.SessionOptions {
	ttl := c.SessionTTL
	if ttl == 0 {
		ttl = 10 * time.Second
	}
	return consul.SessionOptions{
		Name: "gpujob-sweep " + c.Plan.Namespace + "/" + c.Plan.Sweep, TTL: ttl,
		Behavior: api.SessionBehaviorDelete, LockDelay: sessionLockDelay, TTLOnly: true, Logf: c.Logf,
	}
}

// sessionLockDelay is the controller session's lock-delay (see
// sessionOptions).
const sessionLockDelay = time.Millisecond

// errLockLost is the cause of a Run that lost the sweep's lock.
var errLockLost = errors.New("lost the sweep's lock")

// Run takes the sweep's lock and reconciles until the sweep has ended and
// none of its trials is active. It returns nil then; an error when ctx ends,
// the lock is lost, or the sweep's records are unusable. Every goroutine it
// starts has ended when it returns, and its session is destroyed (which
// releases the lock).
func (c *Controller) Run(ctx context.Context) error {
	if err := c.Plan.Validate(); err != nil {
		return err
	}
	sess, err := consul.NewSession(ctx, c.Consul, c.sessionOptions())
	if err != nil {
		return fmt.Errorf("sweep %s: controller session: %w", c.Plan.Sweep, err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = sess.Close(cctx) // releases the lock
	}()
	ctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel(nil)
		wg.Wait()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-sess.Done():
			cancel(fmt.Errorf("%w: %v", errLockLost, sess.Err()))
		case <-ctx.Done():
		}
	}()
	if err := c.lock(ctx, sess); err != nil {
		if cause := context.Cause(ctx); cause != nil {
			err = cause
		}
		return fmt.Errorf("sweep %s: taking the lock: %w", c.Plan.Sweep, err)
	}
	c.logf("sweep %s/%s: holding the lock (allocation %s)", c.Plan.Namespace, c.Plan.Sweep, orDefault(c.AllocID, "?"))

	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	var saved atomic.Uint64 // the state's ModifyIndex after this controller's last write
	wg.Add(4)
	go func() { defer wg.Done(); c.watchTrials(ctx, notify) }()
	go func() { defer wg.Done(); c.watchState(ctx, &saved, notify) }()
	go func() { defer wg.Done(); c.watchJobs(ctx, notify) }()
	go func() { defer wg.Done(); c.watchQueue(ctx, notify) }()

	r := &runner{c: c, session: sess.ID(), launchErrs: map[string]error{}, unreadable: map[string]uint64{}}
	for {
		done, wake, err := r.round(ctx, &saved)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("sweep %s: %w", c.Plan.Sweep, context.Cause(ctx))
			}
			return err
		}
		if done {
			return nil
		}
		if err := c.wait(ctx, changed, wake); err != nil {
			return err
		}
	}
}

// runner is one Run's memory between rounds; none of it is needed for
// correctness after a restart.
type runner struct {
	c       *Controller
	session string
	started bool // a round of this controller has been saved
	loaded  bool // the state existed when this controller read it
	// launchErrs are the launches the cluster refused, by trial ID.
	launchErrs map[string]error
	// unreadable is the ModifyIndex of each trial's metrics record that
	// could not be decoded, so that it is logged once, not every round.
	unreadable map[string]uint64
	progress   string // what the last progress line logged said
	// launcher is the round's: a queueLauncher around c.Launcher that
	// queues in queue mode (queue.go).
	launcher Launcher
	// queueWarned: the queue configuration's trouble was logged.
	queueWarned bool
}

// round loads the state, observes, reconciles, saves the state if it
// changed, and carries out the actions. It returns when the next round is
// due at the latest (zero: on a change).
func (r *runner) round(ctx context.Context, saved *atomic.Uint64) (done bool, wake time.Time, err error) {
	c := r.c
	for {
		st, index, err := c.load(ctx)
		if err != nil {
			return false, time.Time{}, err
		}
		if index == 0 && r.loaded {
			return false, time.Time{}, fmt.Errorf("sweep %s: its state %s was deleted (gpujob sweep stop --purge?)", c.Plan.Sweep, c.key(sweepkv.StateKey))
		}
		before, err := json.Marshal(st)
		if err != nil {
			return false, time.Time{}, err
		}
		prev := map[string]TrialState{}
		for _, t := range st.Trials {
			prev[t.ID] = t.State
		}
		if !r.started {
			st.Starts++
			st.Controller = c.AllocID
		}
		queued, err := r.queueMode(ctx)
		if err != nil {
			return false, time.Time{}, err
		}
		ql := &queueLauncher{c: c, inner: c.Launcher, queue: queued, trials: map[string]Trial{}}
		for _, t := range st.Trials {
			ql.trials[t.JobID] = t
		}
		r.launcher = ql
		obs, err := c.observe(ctx, r.launcher, st, r.launchErrs, r.unreadable)
		if err != nil {
			return false, time.Time{}, err
		}
		// Launches follow a configuration read after the observations: a
		// queue configuration removed before a trial ended (which this
		// round has seen) is gone for the trial launched in its place.
		if ql.queue, err = r.queueMode(ctx); err != nil {
			return false, time.Time{}, err
		}
		res, err := Reconcile(c.Plan, st, obs)
		if err != nil {
			return false, time.Time{}, err
		}
		if changed(before, st) {
			ok, newIndex, err := c.save(ctx, r.session, st, index)
			if err != nil {
				return false, time.Time{}, err
			}
			if !ok {
				continue // another writer came first (gpujob sweep stop, extend): again
			}
			saved.Store(newIndex)
			if !r.started && st.Starts > 1 {
				c.logf("sweep %s: resuming (controller start %d): %d of %d trials proposed", c.Plan.Sweep, st.Starts, len(st.Trials), st.MaxTrials)
			}
			r.started = true
			r.logChanges(st, prev)
		}
		r.loaded = true
		wake = res.Wake
		for _, a := range res.Actions {
			retryAt, err := r.act(ctx, a)
			if ctx.Err() != nil {
				return false, time.Time{}, ctx.Err()
			}
			if err != nil {
				c.logf("sweep %s: %s: %v (retried next round)", c.Plan.Sweep, a.Trial.ID, err)
			}
			if !retryAt.IsZero() && (wake.IsZero() || retryAt.Before(wake)) {
				wake = retryAt
			}
		}
		if ql.entries != nil {
			r.forgetEnded(ctx, st, ql.entries)
		}
		if res.Done {
			c.logf("sweep %s %s: %s", c.Plan.Sweep, st.Status, st.Reason)
		}
		return res.Done, wake, nil
	}
}

// changed says whether st differs from the record before (its JSON)
// other than in the round's Seq and Updated: a round that changed nothing
// is not written, so the controller's writes do not wake it again and the
// state is written only when something happened.
func changed(before []byte, st *State) bool {
	var old State
	if err := json.Unmarshal(before, &old); err != nil {
		return true
	}
	seq, updated := st.Seq, st.Updated
	st.Seq, st.Updated = old.Seq, old.Updated
	after, err := json.Marshal(st)
	st.Seq, st.Updated = seq, updated
	return err != nil || !bytes.Equal(before, after)
}

// logChanges logs each trial that changed state in the round just saved,
// and the sweep's progress when it moved.
func (r *runner) logChanges(st *State, prev map[string]TrialState) {
	c := r.c
	for _, t := range st.Trials {
		old, ok := prev[t.ID]
		if ok && old == t.State {
			continue
		}
		line := fmt.Sprintf("sweep %s: %s %s", c.Plan.Sweep, t.ID, t.State)
		switch {
		case !ok:
			line = fmt.Sprintf("sweep %s: %s proposed (job %s): %s", c.Plan.Sweep, t.ID, t.JobID, t.Params)
		case t.Reason != "" && t.State != TrialCompleted:
			line += ": " + t.Reason
		case t.Value != nil:
			line += fmt.Sprintf(": %s %s at step %d", c.Plan.Metric, formatFloat(*t.Value), t.Step)
		}
		c.logf("%s", line)
	}
	n := st.Counts()
	line := fmt.Sprintf("sweep %s %s: %d of %d trials: %d pending, %d running, %d stopping, %d completed, %d stopped, %d failed",
		c.Plan.Sweep, st.Status, len(st.Trials), st.MaxTrials, n[TrialPending], n[TrialRunning], n[TrialStopping],
		n[TrialCompleted], n[TrialStopped], n[TrialFailed])
	key := line // what the line says, but for a running best trial's value
	if b := st.Best(c.Plan.maximize()); b != nil {
		key += "; best " + b.ID
		line += fmt.Sprintf("; best %s %s %s", b.ID, c.Plan.Metric, formatFloat(*b.Value))
		if b.State != TrialCompleted {
			line += " (" + string(b.State) + ")"
		}
	}
	if key != r.progress {
		r.progress = key
		c.logf("%s", line)
	}
}

// wait returns on a change, at wake (unless zero), or with ctx's end.
func (c *Controller) wait(ctx context.Context, changed <-chan struct{}, wake time.Time) error {
	var timer <-chan time.Time
	if !wake.IsZero() {
		t := time.NewTimer(wake.Sub(c.now()))
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("sweep %s: %w", c.Plan.Sweep, context.Cause(ctx))
	case <-changed:
	case <-timer:
	}
	return nil
}

// lock acquires the sweep's lock key with session. A lock held by a
// session of this same allocation is a killed predecessor's (Nomad
// restarted the task): it is destroyed at once. One held by another
// allocation is waited for: its session ends when that controller stops
// renewing it.
func (c *Controller) lock(ctx context.Context, sess *consul.Session) error {
	waitingFor := ""
	m := consul.NewMutex(sess, c.key(sweepkv.LockKey), consul.MutexOptions{
		Value: []byte(c.AllocID), LockDelay: sessionLockDelay, Logf: c.Logf,
		OnWait: func(ctx context.Context, holder *api.KVPair) {
			if c.AllocID != "" && string(holder.Value) == c.AllocID {
				// This allocation's previous controller (a restarted
				// task): its session would hold the lock for a TTL.
				c.logf("sweep %s: taking over the lock from this allocation's previous controller (session %s)", c.Plan.Sweep, holder.Session)
				if _, err := c.Consul.Session().Destroy(holder.Session, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
					c.logf("destroying session %s: %v", holder.Session, err)
				}
				return
			}
			if h := orDefault(string(holder.Value), "?"); h != waitingFor {
				waitingFor = h
				c.logf("sweep %s: waiting for the lock, held by allocation %s until its session ends", c.Plan.Sweep, h)
			}
		},
	})
	return m.Lock(ctx)
}

// load reads the state and its ModifyIndex (0 when there is none yet),
// retrying Consul's errors.
func (c *Controller) load(ctx context.Context) (st *State, index uint64, err error) {
	key := c.key(sweepkv.StateKey)
	var pair *api.KVPair
	if err := retry(ctx, c.logf, func() error {
		var err error
		pair, _, err = c.Consul.KV().Get(key, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
		return err
	}); err != nil {
		return nil, 0, err
	}
	return decodeState(pair, c.Plan.Namespace, c.Plan.Sweep)
}

// LoadState reads a sweep's state and its ModifyIndex; a sweep without a
// state yet gets an empty one and index 0.
func LoadState(ctx context.Context, consul *api.Client, prefix, ns, sweep string) (*State, uint64, error) {
	key := sweepkv.StateKey(prefix, ns, sweep)
	pair, _, err := consul.KV().Get(key, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, 0, fmt.Errorf("reading %s: %w", key, err)
	}
	return decodeState(pair, ns, sweep)
}

func decodeState(pair *api.KVPair, ns, sweep string) (*State, uint64, error) {
	st := &State{Namespace: ns, Sweep: sweep}
	if pair == nil {
		return st, 0, nil
	}
	if err := json.Unmarshal(pair.Value, st); err != nil {
		return nil, 0, fmt.Errorf("reading %s: %w", pair.Key, err)
	}
	return st, pair.ModifyIndex, nil
}

// SaveState writes st if the record is still at index (0: absent); false
// means another writer came first.
func SaveState(ctx context.Context, consul *api.Client, prefix string, st *State, index uint64) (bool, error) {
	key := sweepkv.StateKey(prefix, st.Namespace, st.Sweep)
	b, err := json.Marshal(st)
	if err != nil {
		return false, fmt.Errorf("encoding the state of sweep %s: %w", st.Sweep, err)
	}
	ok, _, err := consul.KV().CAS(&api.KVPair{Key: key, Value: b, ModifyIndex: index}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("writing %s: %w", key, err)
	}
	return ok, nil
}

// save writes st if the record is still at index and the lock is still
// held by session, in one transaction, retrying Consul's errors. ok is false
// when another writer came first; losing the lock is an error. newIndex is
// the record's ModifyIndex after the write.
func (c *Controller) save(ctx context.Context, session string, st *State, index uint64) (ok bool, newIndex uint64, err error) {
	key := c.key(sweepkv.StateKey)
	b, err := json.Marshal(st)
	if err != nil {
		return false, 0, fmt.Errorf("encoding the state of sweep %s: %w", st.Sweep, err)
	}
	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: c.key(sweepkv.LockKey), Session: session}},
		{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: key, Value: b, Index: index}},
	}
	var resp *api.TxnResponse
	err = retry(ctx, c.logf, func() error {
		var err error
		ok, resp, _, err = c.Consul.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return fmt.Errorf("writing %s: %w", key, err)
		}
		return nil
	})
	if err != nil {
		return false, 0, err
	}
	if ok {
		for _, r := range resp.Results {
			if r.KV != nil && r.KV.Key == key {
				newIndex = r.KV.ModifyIndex
			}
		}
		return true, newIndex, nil
	}
	for _, e := range resp.Errors {
		if e.OpIndex == 0 {
			return false, 0, fmt.Errorf("sweep %s: %w: writing %s: %s", c.Plan.Sweep, errLockLost, key, e.What)
		}
	}
	return false, 0, nil
}

// observe reads the jobs of the active trials (one call), then every
// trial's metrics (one list). In that order: a job seen complete has
// written its last metrics before it ended, so the list read after it
// holds them.
func (c *Controller) observe(ctx context.Context, l Launcher, st *State, launchErrs map[string]error, unreadable map[string]uint64) (Observations, error) {
	obs := Observations{Now: c.now(), Trials: map[string]TrialObservation{}}
	var jobs []string
	for _, t := range st.Trials {
		if t.State.Active() {
			jobs = append(jobs, t.JobID)
		}
	}
	var phases map[string]JobObservation
	if len(jobs) > 0 {
		err := retry(ctx, c.logf, func() error {
			var err error
			phases, err = l.Observe(ctx, jobs)
			return err
		})
		if err != nil {
			return obs, err
		}
	}
	prefix := c.key(sweepkv.SweepKey) + "/trials/"
	var pairs api.KVPairs
	err := retry(ctx, c.logf, func() error {
		var err error
		pairs, _, err = c.Consul.KV().List(prefix, (&api.QueryOptions{}).WithContext(ctx))
		return err
	})
	if err != nil {
		return obs, err
	}
	byKey := map[string]*api.KVPair{}
	for _, p := range pairs {
		byKey[p.Key] = p
	}
	for _, t := range st.Trials {
		o := TrialObservation{Job: phases[t.JobID], LaunchErr: launchErrs[t.ID]}
		o.StopRequested = byKey[sweepkv.StopKey(c.Prefix, c.Plan.Namespace, c.Plan.Sweep, t.ID)] != nil
		if p := byKey[sweepkv.MetricsKey(c.Prefix, c.Plan.Namespace, c.Plan.Sweep, t.ID)]; p != nil {
			var m sweepkv.Metrics
			if err := json.Unmarshal(p.Value, &m); err != nil {
				// Read as no record: what it held before is lost anyway.
				if unreadable[t.ID] != p.ModifyIndex {
					unreadable[t.ID] = p.ModifyIndex
					c.logf("sweep %s: %s: unreadable metrics record %s: %v", c.Plan.Sweep, t.ID, p.Key, err)
				}
			} else {
				o.Metrics, o.Live = &m, p.Session != ""
			}
		}
		obs.Trials[t.ID] = o
	}
	return obs, nil
}

// act carries out one action. retryAt, when not zero, is when the next
// round is due for it: at once after a refused launch (which fails the
// trial), 2 s after an error.
func (r *runner) act(ctx context.Context, a Action) (retryAt time.Time, err error) {
	c := r.c
	switch a.Kind {
	case Launch:
		err := r.launcher.Launch(ctx, a.Trial)
		if errors.Is(err, ErrRefused) {
			r.launchErrs[a.Trial.ID] = err
			c.logf("sweep %s: %s: launching job %s: %v", c.Plan.Sweep, a.Trial.ID, a.Trial.JobID, err)
			return c.now(), nil
		}
		if err != nil {
			return c.now().Add(2 * time.Second), err
		}
		return time.Time{}, nil
	case RequestStop:
		b, err := json.Marshal(sweepkv.StopRequest{Reason: a.Reason, At: c.now()})
		if err != nil {
			return time.Time{}, err
		}
		key := sweepkv.StopKey(c.Prefix, c.Plan.Namespace, c.Plan.Sweep, a.Trial.ID)
		if _, err := c.Consul.KV().Put(&api.KVPair{Key: key, Value: b}, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
			// The job is stopped after the grace all the same.
			return c.now().Add(2 * time.Second), fmt.Errorf("writing %s: %w", key, err)
		}
		c.logf("sweep %s: %s: asked to stop: %s", c.Plan.Sweep, a.Trial.ID, a.Reason)
		return time.Time{}, nil
	case StopJob:
		if err := r.launcher.StopJob(ctx, a.Trial.JobID); err != nil {
			return c.now().Add(500 * time.Millisecond), err
		}
		c.logf("sweep %s: %s: stopped job %s", c.Plan.Sweep, a.Trial.ID, a.Trial.JobID)
		return time.Time{}, nil
	}
	return time.Time{}, fmt.Errorf("unknown action %d", a.Kind)
}

// watchTrials signals every change under the sweep's trials (metrics
// records, stop requests), by blocking queries.
func (c *Controller) watchTrials(ctx context.Context, notify func()) {
	prefix := c.key(sweepkv.SweepKey) + "/trials/"
	keys := func(q *api.QueryOptions) ([]string, *api.QueryMeta, error) {
		return c.Consul.KV().Keys(prefix, "", q)
	}
	_ = consul.Watch(ctx, keys, c.watchOptions("watching "+prefix), func([]string, uint64) error {
		notify()
		return nil
	})
}

// watchState signals every write of the state by another writer (the
// CLI's stop and extend): the controller's own writes (saved) do not wake
// it again.
func (c *Controller) watchState(ctx context.Context, saved *atomic.Uint64, notify func()) {
	key := c.key(sweepkv.StateKey)
	_ = consul.Watch(ctx, consul.KeyQuery(c.Consul, key), c.watchOptions("watching "+key), func(pair *api.KVPair, _ uint64) error {
		if pair == nil || pair.ModifyIndex != saved.Load() {
			notify()
		}
		return nil
	})
}

// watchOptions pace the controller's watches: a failed read is retried
// within a second or so (the reconcile loop's own reads say more).
func (c *Controller) watchOptions(what string) consul.WatchOptions {
	return consul.WatchOptions{BackoffBase: 250 * time.Millisecond, BackoffCap: time.Second, Logf: c.Logf, What: "sweep " + c.Plan.Sweep + ": " + what}
}

// watchQueue signals every change of the queue configuration (queue mode
// on or off) and of the statuses of the sweep's queued trials.
func (c *Controller) watchQueue(ctx context.Context, notify func()) {
	opts := c.watchOptions("watching the queues")
	// A controller whose token may not read the queues (issued before
	// them) hears nothing here: its retries are slow and quiet.
	opts.BackoffCap, opts.Logf = 30*time.Second, nil
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = consul.Watch(ctx, consul.KeyQuery(c.Consul, queuekv.ConfigKey(c.queuePrefix())), opts, func(*api.KVPair, uint64) error {
			notify()
			return nil
		})
	}()
	prefix := c.queueStatusPrefix()
	keys := func(q *api.QueryOptions) ([]string, *api.QueryMeta, error) { return c.Consul.KV().Keys(prefix, "", q) }
	_ = consul.Watch(ctx, keys, opts, func([]string, uint64) error {
		notify()
		return nil
	})
	wg.Wait()
}

// watchJobs signals every change of the trial jobs.
func (c *Controller) watchJobs(ctx context.Context, notify func()) {
	var index uint64
	for ctx.Err() == nil {
		began := time.Now()
		next, err := c.Launcher.WaitJobs(ctx, index)
		if err != nil {
			if !backoff.Sleep(ctx, time.Second) {
				return
			}
			continue
		}
		if next != index {
			notify()
		} else if time.Since(began) < 100*time.Millisecond && !backoff.Sleep(ctx, 100*time.Millisecond) {
			return // a WaitJobs that does not block must not spin
		}
		index = next
	}
}

// retry runs f until it succeeds or ctx ends, backing off up to 5 s.
func retry(ctx context.Context, logf func(string, ...any), f func() error) error {
	wait := 200 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if logf != nil && !strings.Contains(err.Error(), "context canceled") {
			logf("%v (retrying in %s)", err, wait)
		}
		if !backoff.Sleep(ctx, wait) {
			return ctx.Err()
		}
		wait = min(2*wait, 5*time.Second)
	}
}
