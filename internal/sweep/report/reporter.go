// Package report is a sweep trial's side of the sweep's records in Consul
// KV (package sweepkv): the Reporter forwards rank 0's metric and result
// lines to the trial's metrics record, and WatchStop tells when the sweep
// asks the trial to stop. The trial's supervisor runs both; nothing outside
// the task parses its logs. It imports nothing of Nomad.
//
// Training never waits for Consul here: a line is parsed and kept in memory
// as it is written, the record is written from a goroutine of its own at
// most about once a second (at once for a result, while the results'
// allowance lasts), within a byte budget, and every Consul error is
// retried with backoff and logged, throttled, never returned to the rank.
//
// The budgets (Budget) bound what rank 0 — code of the job's author — can
// make the cluster do: however fast and however large the lines it prints,
// its trial's record is written at most once per Interval plus a few
// results, and at most BytesPerSecond on average. What they hold back is
// coalesced into the next write, never lost, and counted in the record
// (sweepkv.Reporting).
package report

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	"golang.org/x/time/rate"

	"github.com/gpujob/gpujob/internal/backoff"
	"github.com/gpujob/gpujob/internal/consul"
	"github.com/gpujob/gpujob/internal/errlog"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// Defaults of Config.
const (
	// DefaultSessionTTL: a supervisor that died stops showing as live
	// within 2×TTL (Consul's grace), or at once when its node fails.
	DefaultSessionTTL = 15 * time.Second
	// DefaultInterval is the least time between two writes of the record:
	// a workload may print a metric line every step, and Consul's Raft log
	// should not see every one.
	DefaultInterval = time.Second
	// holderWait bounds one blocking query on a record another session
	// holds, so a reporter that waits for it also sees Consul go away.
	holderWait = 5 * time.Minute
	// throttleLogEvery spaces the log lines that say the budgets hold
	// writes back.
	throttleLogEvery = time.Minute
)

// Budget bounds the writes of one trial's record. Zero fields take
// DefaultBudget's.
type Budget struct {
	// Results is how many results may be written at once, skipping the
	// write interval; the allowance refills one per ResultsEvery. A result
	// beyond it waits for the interval like any metric line.
	Results      int
	ResultsEvery time.Duration
	// BytesPerSecond is the average rate of bytes written (the record is
	// written whole every time); BurstBytes what may be written at once,
	// never less than a whole record (400 KiB).
	BytesPerSecond int
	BurstBytes     int
}

// DefaultBudget: three results at once, then one a minute; 32 KiB/s on
// average, a whole record at once. An ordinary trial — a metric line per
// step, one result — never meets the results' allowance, and meets the byte
// budget only once its record passes 32 KiB (some 600 points of two
// values): from then on its record is written every few seconds instead of
// every second (every 3 to 4 s at MaxPoints such points), which a stopping
// rule that judges every tens of steps does not notice.
func DefaultBudget() Budget {
	return Budget{Results: 3, ResultsEvery: time.Minute, BytesPerSecond: 32 << 10, BurstBytes: maxRecordBytes}
}

func (b Budget) withDefaults() Budget {
	d := DefaultBudget()
	if b.Results <= 0 {
		b.Results = d.Results
	}
	if b.ResultsEvery <= 0 {
		b.ResultsEvery = d.ResultsEvery
	}
	if b.BytesPerSecond <= 0 {
		b.BytesPerSecond = d.BytesPerSecond
	}
	// A burst smaller than a whole record would never let one be written.
	b.BurstBytes = max(b.BurstBytes, maxRecordBytes)
	return b
}

// errBudget says a write must wait for the byte budget.
type errBudget struct{ wait time.Duration }

func (e *errBudget) Error() string {
	return fmt.Sprintf("the byte budget allows the next write in %s", e.wait)
}

// Config says where a Reporter writes.
type Config struct {
	Client *api.Client
	// Key is the trial's sweepkv.MetricsKey.
	Key string
	// SessionName names the Consul session (for operators).
	SessionName string
	SessionTTL  time.Duration // DefaultSessionTTL when 0
	Interval    time.Duration // DefaultInterval when 0
	Budget      Budget        // DefaultBudget's for its zero fields
	// Logf hears of Consul errors (throttled: one line per run of them,
	// then one every 30 s) and of a record taken over from an earlier
	// supervisor. Optional.
	Logf func(format string, args ...any)
}

// errHeld says the record is held by another session: an earlier
// supervisor of the trial whose session has not ended yet.
var errHeld = errors.New("the metrics record is held by another supervisor's session")

// Reporter keeps a trial's metrics record: the points of rank 0's lines in
// memory, written to Config.Key with a KV acquire under a Consul session of
// its own (see session).
//
// The record outlives a supervisor: a group restart keeps the same
// Reporter, and a new allocation of the trial resumes the record the last
// one left (merge), so a trial that resumes from its checkpoint continues
// its curve, with the steps it reports again replacing the old ones.
type Reporter struct {
	cfg  Config
	errs *errlog.Run

	mu      sync.Mutex
	own     sweepkv.Metrics // this reporter's points; after takeOver, the whole record
	urgent  bool            // a result came: write without waiting for the interval
	closing bool

	kick   chan struct{} // cap 1: there is something to write
	hurry  chan struct{} // cap 1: write now (a result)
	cancel context.CancelFunc
	done   chan struct{} // closed when the loop has returned

	// The budgets (rate.Limiter is safe for concurrent use).
	results *rate.Limiter // results written at once
	bytes   *rate.Limiter // bytes written
	// lastThrottleLog is when the budgets were last said to hold writes
	// back (the loop's alone).
	lastThrottleLog time.Time

	// The loop's (and, once it has returned, Close's) alone.
	sess  *consul.Session
	held  bool             // the record was taken over: own is all of it
	tried *sweepkv.Metrics // the base of a takeover whose answer was lost
	// waitedOn is the holder the last log line named, so that waiting
	// for an earlier supervisor is said once per holder.
	waitedOn string
}

// Start returns a Reporter that takes the record at once: it creates its
// session and acquires the key (resuming what is there) in the
// background, so that the record shows a live supervisor before rank 0
// prints anything. Close it on every way out.
func Start(cfg Config) (*Reporter, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("report: no consul client")
	case cfg.Key == "" || cfg.Key[0] == '/':
		return nil, fmt.Errorf("report: metrics key %q must be a relative consul key", cfg.Key)
	case cfg.SessionTTL != 0 && cfg.SessionTTL < time.Second:
		return nil, fmt.Errorf("report: session TTL %s: must be at least 1s", cfg.SessionTTL)
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.SessionName == "" {
		cfg.SessionName = "gpujob sweep trial " + cfg.Key
	}
	cfg.Budget = cfg.Budget.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Reporter{
		cfg:     cfg,
		errs:    errlog.NewRetrying(cfg.Logf, "writing sweep metrics to "+cfg.Key),
		kick:    make(chan struct{}, 1),
		hurry:   make(chan struct{}, 1),
		cancel:  cancel,
		done:    make(chan struct{}),
		results: rate.NewLimiter(rate.Every(cfg.Budget.ResultsEvery), cfg.Budget.Results),
		bytes:   rate.NewLimiter(rate.Limit(cfg.Budget.BytesPerSecond), cfg.Budget.BurstBytes),
	}
	r.signal(r.kick)
	go r.loop(ctx)
	return r, nil
}

// Line reads one line of rank 0's output; a metric or result line becomes
// a point, any other line is ignored.
func (r *Reporter) Line(line string) {
	if p, ok := parseLine(line); ok {
		r.Add(p)
	}
}

// Writer returns a writer for one start of rank 0's output (see
// LineWriter); the lines it skips for their length are counted.
func (r *Reporter) Writer() *LineWriter {
	w := NewLineWriter(r.Line)
	w.OnSkip = r.Skipped
	return w
}

// Skipped counts a line of rank 0 skipped unread for its length.
func (r *Reporter) Skipped() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.own.Reporting.DroppedLines++
}

// Add records a point; a Final one is written at once while the results'
// allowance lasts.
func (r *Reporter) Add(p sweepkv.Point) {
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		return
	}
	r.own.Reporting.Points++
	add(&r.own, p)
	if p.Final {
		r.urgent = true
	}
	r.mu.Unlock()
	r.signal(r.kick)
	if p.Final {
		r.signal(r.hurry)
	}
}

// Metrics is a copy of what the reporter knows: the whole record once it
// has taken the record over, else only its own points.
func (r *Reporter) Metrics() sweepkv.Metrics {
	r.mu.Lock()
	defer r.mu.Unlock()
	return clone(r.own)
}

func (r *Reporter) signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// loop writes the record whenever it changed, at most once per Interval
// unless a result hurries it (while the results' allowance lasts), within
// the byte budget, retrying failures with backoff.
func (r *Reporter) loop(ctx context.Context) {
	defer close(r.done)
	bo := newBackoff(backoffCap)
	var next time.Time // the earliest moment for the next write
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		}
		if !r.waitTurn(ctx, next) {
			return
		}
		// A hurry this write serves must not cut a later wait short.
		select {
		case <-r.hurry:
		default:
		}
		err := r.flush(ctx, true)
		var budget *errBudget
		switch {
		case ctx.Err() != nil:
			return
		case errors.As(err, &budget):
			// Wait for the bytes, then write what is newest by then.
			r.count(func(c *sweepkv.Reporting) { c.ByteBudgetWaits++ })
			r.throttled("the byte budget (%d KiB/s) delays the next write by %s", r.cfg.Budget.BytesPerSecond>>10, budget.wait.Round(time.Millisecond))
			next = time.Now().Add(budget.wait)
			r.signal(r.kick)
		case errors.Is(err, errHeld):
			// flush has waited for the holder to change: look again.
			r.signal(r.kick)
		case err != nil:
			r.errs.Failed(err)
			r.signal(r.kick)
			if !backoff.Sleep(ctx, bo.Next()) {
				return
			}
		default:
			r.errs.OK()
			bo.Reset()
			next = time.Now().Add(r.cfg.Interval)
		}
	}
}

// waitTurn waits until next, or less for a result that the results'
// allowance lets through at once; false when ctx ended.
func (r *Reporter) waitTurn(ctx context.Context, next time.Time) bool {
	deferred := false
	hurry := r.hurry
	for {
		wait := time.Until(next)
		if wait <= 0 {
			return true
		}
		if r.isUrgent() && !deferred {
			if r.results.Allow() {
				return true
			}
			// Spent: this result goes with the next write; further
			// results before it change nothing.
			deferred, hurry = true, nil
			r.count(func(c *sweepkv.Reporting) { c.ResultsDeferred++ })
			r.throttled("results come faster than %d at once and one per %s: coalescing them into a write per %s",
				r.cfg.Budget.Results, r.cfg.Budget.ResultsEvery, r.cfg.Interval)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-hurry:
			t.Stop()
		case <-t.C:
			return true
		}
	}
}

func (r *Reporter) isUrgent() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.urgent
}

// count changes the reporting counters of the record.
func (r *Reporter) count(f func(*sweepkv.Reporting)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(&r.own.Reporting)
}

// throttled logs that a budget holds writes back, at most once per
// throttleLogEvery (the loop's alone).
func (r *Reporter) throttled(format string, args ...any) {
	if r.cfg.Logf == nil || time.Since(r.lastThrottleLog) < throttleLogEvery {
		return
	}
	r.lastThrottleLog = time.Now()
	r.cfg.Logf("rank 0 reports sweep metrics faster than its budget allows: "+format+
		" (the record %s counts what was held back)", append(args, r.cfg.Key)...)
}

// spend takes n bytes from the byte budget, or says how long to wait for
// them; with enforce false (the last write, on Close) it only counts them.
func (r *Reporter) spend(n int, enforce bool) error {
	now := time.Now()
	res := r.bytes.ReserveN(now, min(n, r.cfg.Budget.BurstBytes))
	if !enforce || !res.OK() {
		return nil
	}
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return &errBudget{wait: d}
	}
	return nil
}

// snapshot is the record to write now: the reporter's, with this write
// counted (the counter is raised once it landed). It clears the result
// flag with the same lock, so a result that comes after it is not taken
// for written; a write that fails gives the flag back (unwritten).
func (r *Reporter) snapshot() (rec sweepkv.Metrics, unwritten func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec = clone(r.own)
	rec.Reporting.Writes++
	urgent := r.urgent
	r.urgent = false
	return rec, func() {
		if urgent {
			r.mu.Lock()
			r.urgent = true
			r.mu.Unlock()
		}
	}
}

// flush makes one attempt at writing the record under the session, within
// the byte budget when enforce is set.
func (r *Reporter) flush(ctx context.Context, enforce bool) error {
	if err := r.ensureSession(ctx); err != nil {
		return err
	}
	if !r.held {
		return r.takeOver(ctx, enforce)
	}
	rec, unwritten := r.snapshot()
	rec.Updated = time.Now().UTC()
	value, err := encode(rec)
	if err == nil {
		err = r.spend(len(value), enforce)
	}
	if err != nil {
		unwritten()
		return err
	}
	ok, _, err := r.cfg.Client.KV().Acquire(&api.KVPair{Key: r.cfg.Key, Value: value, Session: r.sess.ID()},
		(&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		unwritten()
		r.sess.Check()
		return fmt.Errorf("writing %s: %w", r.cfg.Key, err)
	}
	if !ok {
		unwritten()
		// Another session took the record while ours was gone: only a
		// second supervisor of the same trial would. Ours is written
		// again once that one's session ends.
		r.sess.Check()
		return fmt.Errorf("writing %s: %w", r.cfg.Key, errHeld)
	}
	r.count(func(c *sweepkv.Reporting) { c.Writes++ })
	return nil
}

// ensureSession makes a session when there is none or Consul said it is
// gone (the record it held has been released; the next write takes it
// again).
func (r *Reporter) ensureSession(ctx context.Context) error {
	if r.sess != nil && !r.sess.Lost() {
		return nil
	}
	if r.sess != nil {
		r.sess.StopRenewing()
		r.sess = nil
	}
	s, err := consul.NewSession(ctx, r.cfg.Client, sessionOptions(r.cfg.SessionName, r.cfg.SessionTTL, r.cfg.Logf))
	if err != nil {
		return err
	}
	r.sess = s
	go func() {
		// Lost: the record it held is released; write again at once.
		<-s.Done()
		if s.Lost() {
			r.signal(r.kick)
		}
	}()
	return nil
}

// sessionOptions are the reporter's own Consul session's, under which it
// holds the metrics record (a KV acquire), so that the record's Session is
// set exactly while this supervisor lives:
//
//   - Behavior release: when the session ends — Close destroys it, or
//     Consul invalidates it because the supervisor stopped renewing (it
//     died) or its node failed (the default serfHealth check) — the record
//     stays, with its Session cleared. A trial whose supervisor or node
//     died is never shown running, and its points are kept.
//   - LockDelay 0: Consul's default of 15 s would keep the next supervisor
//     of the trial (the group's new allocation on another node) from
//     taking the record over for that long after a node died. Nothing else
//     competes for the record, so the delay protects nothing here.
//   - CreateOnce: the reporter's own loop retries, with its budget.
func sessionOptions(name string, ttl time.Duration, logf func(string, ...any)) consul.SessionOptions {
	return consul.SessionOptions{
		Name: name, TTL: ttl, Behavior: api.SessionBehaviorRelease, LockDelay: 0,
		CreateOnce: true, Logf: logf,
	}
}

// takeOver is the first write: it reads what an earlier supervisor of the
// trial left, and writes that followed by this reporter's points in one
// transaction that takes the lock only if the record is still what it
// read. A record another live session holds is waited for (a blocking
// query) until that session ends.
func (r *Reporter) takeOver(ctx context.Context, enforce bool) error {
	kv := r.cfg.Client.KV()
	pair, meta, err := kv.Get(r.cfg.Key, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("reading %s: %w", r.cfg.Key, err)
	}
	if pair != nil && pair.Session != "" && pair.Session != r.sess.ID() {
		if r.waitedOn != pair.Session && r.cfg.Logf != nil {
			r.cfg.Logf("the sweep metrics record %s is held by session %s (an earlier supervisor of this trial); "+
				"resuming it once that session ends", r.cfg.Key, pair.Session)
		}
		r.waitedOn = pair.Session
		q := &api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: holderWait}
		if _, _, err := kv.Get(r.cfg.Key, q.WithContext(ctx)); err != nil {
			return fmt.Errorf("waiting for %s: %w", r.cfg.Key, err)
		}
		return errHeld
	}
	var base sweepkv.Metrics
	switch {
	case pair == nil:
	case pair.Session == r.sess.ID() && r.tried != nil:
		// Our own takeover landed although its answer was lost: its
		// base is the record before it.
		base = *r.tried
	default:
		if base, err = decode(pair.Value); err != nil && r.cfg.Logf != nil {
			r.cfg.Logf("the sweep metrics record %s cannot be resumed (%v); starting it over", r.cfg.Key, err)
		}
	}
	own, unwritten := r.snapshot()
	rec := merge(base, own)
	rec.Updated = time.Now().UTC()
	value, err := encode(rec)
	if err == nil {
		err = r.spend(len(value), enforce)
	}
	if err != nil {
		unwritten()
		return err
	}
	guard := &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: r.cfg.Key}
	if pair != nil {
		guard = &api.KVTxnOp{Verb: api.KVCheckIndex, Key: r.cfg.Key, Index: pair.ModifyIndex}
	}
	r.tried = &base
	ok, resp, _, err := r.cfg.Client.Txn().Txn(api.TxnOps{
		{KV: guard},
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: r.cfg.Key, Value: value, Session: r.sess.ID()}},
	}, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		unwritten()
		r.sess.Check()
		return fmt.Errorf("taking over %s: %w", r.cfg.Key, err)
	}
	if !ok {
		// The record changed since it was read (or the session is gone):
		// read it again.
		unwritten()
		r.sess.Check()
		return fmt.Errorf("taking over %s: %s", r.cfg.Key, txnErrors(resp))
	}
	r.mu.Lock()
	r.own.Reporting.Writes++
	r.own = merge(base, r.own)
	r.mu.Unlock()
	r.held, r.tried = true, nil
	if r.waitedOn != "" && r.cfg.Logf != nil {
		r.cfg.Logf("resumed the sweep metrics record %s (%d points)", r.cfg.Key, len(rec.Points))
	}
	return nil
}

func txnErrors(resp *api.TxnResponse) string {
	if resp == nil || len(resp.Errors) == 0 {
		return "the transaction was rolled back"
	}
	msg := ""
	for i, e := range resp.Errors {
		if i > 0 {
			msg += "; "
		}
		msg += e.What
	}
	return msg
}

// Close writes the record one last time and destroys the session, which
// leaves the record with its Session cleared: the trial no longer has a
// live supervisor. It retries Consul errors until ctx ends; if it gives up,
// Consul still ends the session when its TTL runs out. Points added after
// Close are dropped. A second Close does nothing.
func (r *Reporter) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		return nil
	}
	r.closing = true
	r.mu.Unlock()
	r.cancel()
	<-r.done

	bo := newBackoff(backoffCap)
	var flushErr error
	for {
		// The last write is never held back: it is one, and it carries
		// the trial's result.
		flushErr = r.flush(ctx, false)
		if flushErr == nil || ctx.Err() != nil {
			break
		}
		if !errors.Is(flushErr, errHeld) && !backoff.Sleep(ctx, bo.Next()) {
			break
		}
	}
	if flushErr != nil {
		flushErr = fmt.Errorf("the last write of the sweep metrics: %w", flushErr)
	}
	if r.sess == nil {
		return flushErr
	}
	// Destroyed even when the write failed: a session left to its TTL
	// shows a live supervisor for up to 2×TTL after this one has gone.
	// With ctx over, one short attempt of its own.
	dctx, cancel := ctx, context.CancelFunc(func() {})
	if ctx.Err() != nil {
		dctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	}
	defer cancel()
	return errors.Join(flushErr, r.sess.Close(dctx))
}
