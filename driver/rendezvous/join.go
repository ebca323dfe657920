package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/consul"
)

var errNotOpen = errors.New("rendezvous: not open (call Open first) or already closed")

func (r *Rendezvous) usable() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.opened || r.closed || r.cancel == nil {
		return errNotOpen
	}
	return nil
}

// Join blocks until a round that includes this member is complete and
// returns it. It registers the member for the open round (or, when the
// current round is already complete without it, for the next one: a late
// joiner, which with Min<Max makes the coordinator start a new round).
//
// Consul errors are retried with backoff; none ends Join early. A lost
// session is replaced and the member registers again with the new one.
// When JoinTimeout passes first, the round is marked timed out so that
// every member waiting for it returns the same *JoinTimeoutError; if Consul
// cannot be reached to record that within a short grace (2 s), Join returns
// a *JoinTimeoutError of its own with the Consul error as Cause. So Join
// returns within JoinTimeout + 2 s, or when ctx ends. A failure with the
// restart budget spent returns *RestartsExhaustedError.
func (r *Rendezvous) Join(ctx context.Context) (*Round, error) {
	if err := r.usable(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(r.cfg.JoinTimeout)
	hardDeadline := deadline.Add(timeoutGrace)
	bo := newBackoff()
	var (
		retryC  <-chan time.Time
		lastErr error
		last    memberState
	)
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("rendezvous %s: join as %s: %w", r.cfg.RunID, r.self.Name, err)
		}
		now := time.Now()
		timedOut := !now.Before(deadline)
		if !now.Before(hardDeadline) {
			return nil, r.localTimeout(last, lastErr)
		}
		st := r.state()
		last = st
		if st.fatal != nil {
			return nil, fmt.Errorf("rendezvous %s: join as %s: %w", r.cfg.RunID, r.self.Name, st.fatal)
		}
		stepDeadline := deadline
		if timedOut {
			stepDeadline = hardDeadline
		}
		if st.ok && st.sess != nil {
			sctx, cancel := context.WithDeadline(ctx, stepDeadline)
			rd, err := r.joinStep(sctx, st, timedOut)
			cancel()
			switch {
			case rd != nil:
				return rd, nil
			case err == nil:
				bo.Reset()
				retryC = nil
			case transient(err) || (errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil):
				lastErr = err
				r.logf("join: %v (retrying)", err)
				retryC = time.After(bo.Next())
			default:
				return nil, err
			}
		}
		wake := time.NewTimer(time.Until(stepDeadline))
		select {
		case <-ctx.Done():
		case <-st.changed:
		case <-retryC:
			retryC = nil
		case <-wake.C:
		}
		wake.Stop()
	}
}

// joinStep acts on one state: it returns the round when Join is done, an
// error when Join fails (or a request failed), or neither to keep waiting.
func (r *Rendezvous) joinStep(ctx context.Context, st memberState, timedOut bool) (*Round, error) {
	rec := st.snap.round
	sid := st.sess.ID()
	r.mu.Lock()
	registered, last := r.registered, r.lastReturned
	if r.regSession != sid {
		registered = 0 // our registration went with the old session
	}
	r.mu.Unlock()
	switch {
	case rec == nil:
		// The first coordinator creates round 1 as it takes the lock;
		// register once the watch shows it. Not before: while P/ctl/
		// holds no key, Consul wakes every member's watch of it on
		// every write near it, and registrations are such writes.
		if timedOut {
			// Our watch may lag (or Consul be down): ask Consul
			// itself whether round 1 is still to come.
			cur, _, err := r.getRound(ctx)
			if err != nil {
				return nil, err
			}
			if cur != nil {
				break // the watch will show it
			}
			return nil, &JoinTimeoutError{RunID: r.cfg.RunID, Round: 1, Timeout: r.cfg.JoinTimeout.String(), Min: r.cfg.Min, Max: r.cfg.Max, Missing: r.cfg.Expected}
		}
	case rec.terminal():
		if r.tookPart() {
			return nil, r.terminalError(rec)
		}
		// A member that never took part finds a run that ended for
		// good: it is a new attempt (Nomad restarted the group under
		// the same run ID), so it opens a fresh round with a fresh
		// budget. The round number keeps counting so stale
		// registrations of the old attempt never match.
		next := &roundRecord{Number: rec.Number + 1, Status: statusJoining, MaxRestarts: r.cfg.MaxRestarts, Min: r.cfg.Min, Max: r.cfg.Max}
		if _, err := r.casRound(ctx, next, st.snap.roundIndex); err != nil {
			return nil, err
		}
	case rec.Status == statusJoining:
		if registered != rec.Number {
			if err := r.register(ctx, sid, rec.Number); err != nil {
				return nil, err
			}
		}
		if timedOut {
			if err := r.declareTimeout(ctx, rec.Number); err != nil {
				return nil, err
			}
		}
	case rec.Status == statusComplete:
		if rec.Number <= last {
			// Our view still shows the round we were handed last
			// (e.g. right after our own Fail): wait for the next.
			break
		}
		members, err := r.snapRoster(st.snap, rec.Number)
		if err != nil {
			return nil, err
		}
		if members == nil {
			break // no roster of this round: wait for the record to move on
		}
		if rd, ok := buildRound(rec, members, r.self.ID); ok {
			if registered != rec.Number {
				// In the roster, but we do not know that we registered
				// with this session: the answer to our registration was
				// lost (it did land), or our session was replaced after
				// the round completed (then the coordinator is about to
				// end the round: wait for that). Consul knows which.
				held, err := r.holdsRegistration(ctx, sid, rec.Number)
				if err != nil || !held {
					return nil, err
				}
			}
			r.mu.Lock()
			r.lastReturned, r.roundSession = rd.Number, st.sess
			r.mu.Unlock()
			return rd, nil
		}
		// Complete without us: ask for the next round.
		if registered != rec.Number+1 {
			if err := r.register(ctx, sid, rec.Number+1); err != nil {
				return nil, err
			}
		}
		if timedOut {
			return nil, &JoinTimeoutError{RunID: r.cfg.RunID, Round: rec.Number + 1, Timeout: r.cfg.JoinTimeout.String(), Min: r.cfg.Min, Max: r.cfg.Max,
				Missing: []string{r.self.Name + " (round " + fmt.Sprint(rec.Number) + " is complete with " + fmt.Sprint(rec.Size) + " members)"}}
		}
	}
	return nil, nil
}

// tookPart reports whether this member ever registered in the run.
func (r *Rendezvous) tookPart() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registered > 0
}

// localTimeout is the JoinTimeoutError of a member that could not reach
// Consul to record the timeout: it says what the member last saw.
func (r *Rendezvous) localTimeout(st memberState, cause error) error {
	e := &JoinTimeoutError{RunID: r.cfg.RunID, Round: 1, Timeout: r.cfg.JoinTimeout.String(), Min: r.cfg.Min, Max: r.cfg.Max,
		Missing: append([]string(nil), r.cfg.Expected...), Cause: cause}
	if rec := st.snap.round; st.ok && rec != nil {
		e.Round = rec.Number
		if rec.Min > 0 {
			e.Min, e.Max = rec.Min, rec.Max
		}
		if rec.Status == statusComplete {
			e.Round = rec.Number + 1
		}
	}
	if cause == nil {
		e.Cause = errors.New("consul did not answer before the join timeout")
	}
	return e
}

// register writes this member's registration for generation gen, held by
// session sid so that it vanishes with the session.
func (r *Rendezvous) register(ctx context.Context, sid string, gen int) error {
	val, err := json.Marshal(liveRecord{Member: r.self, Gen: gen})
	if err != nil {
		return permanent(fmt.Errorf("rendezvous %s: encode registration: %w", r.cfg.RunID, err))
	}
	got, _, err := r.kv.Acquire(&api.KVPair{Key: r.key(livePrefix + r.self.ID), Value: val, Session: sid}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		if consul.IsInvalidSession(err) {
			// Ours was just lost: have it confirmed now, so that the
			// retry can use its replacement.
			r.checkSession(sid)
		}
		return fmt.Errorf("rendezvous %s: register %s for round %d: %w", r.cfg.RunID, r.self.Name, gen, err)
	}
	if !got {
		if holder, err := r.heldByFormerSession(ctx); err != nil || holder != "" {
			// Our own replaced session still holds the key (Consul
			// had not applied its state when it said the session was
			// gone): it was destroyed now; retry.
			if err == nil {
				err = fmt.Errorf("key held by our replaced session %s, destroyed", holder)
			}
			return fmt.Errorf("rendezvous %s: register %s for round %d: %w", r.cfg.RunID, r.self.Name, gen, err)
		}
		return permanent(fmt.Errorf("rendezvous %s: register %s for round %d: key held by another session (duplicate member ID %q?)", r.cfg.RunID, r.self.Name, gen, r.self.ID))
	}
	r.mu.Lock()
	r.registered, r.regSession = gen, sid
	r.mu.Unlock()
	return nil
}

// heldByFormerSession returns the session holding our registration key if
// it is one this member replaced, after destroying it; "" otherwise.
func (r *Rendezvous) heldByFormerSession(ctx context.Context) (string, error) {
	p, _, err := r.kv.Get(r.key(livePrefix+r.self.ID), r.readOptions(ctx))
	if err != nil || p == nil || p.Session == "" {
		return "", err
	}
	r.mu.Lock()
	former := slices.Contains(r.former, p.Session)
	r.mu.Unlock()
	if !former {
		return "", nil
	}
	if _, err := r.cfg.Client.Session().Destroy(p.Session, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return p.Session, fmt.Errorf("destroy our replaced session %s: %w", p.Session, err)
	}
	return p.Session, nil
}

// holdsRegistration reports whether our registration for generation gen is
// in Consul, held by session sid; if so, it is remembered.
func (r *Rendezvous) holdsRegistration(ctx context.Context, sid string, gen int) (bool, error) {
	p, _, err := r.kv.Get(r.key(livePrefix+r.self.ID), r.readOptions(ctx))
	if err != nil {
		return false, fmt.Errorf("rendezvous %s: read registration of %s: %w", r.cfg.RunID, r.self.Name, err)
	}
	var lr liveRecord
	if p == nil || p.Session != sid || json.Unmarshal(p.Value, &lr) != nil || lr.Gen != gen {
		return false, nil
	}
	r.mu.Lock()
	r.registered, r.regSession = gen, sid
	r.mu.Unlock()
	return true, nil
}

// checkSession asks session sid, if still current, to check with Consul now.
func (r *Rendezvous) checkSession(sid string) {
	r.mu.Lock()
	sess := r.sess
	r.mu.Unlock()
	if sess != nil && sess.ID() == sid {
		sess.Check()
	}
}

// casRound writes rec, a round that is not complete (completeRound writes
// those), if P/ctl/round still has ModifyIndex idx (0: absent). The roster
// of the round it replaces goes in the same transaction, so that the watch
// of P/ctl/ carries a roster only while its round is complete.
func (r *Rendezvous) casRound(ctx context.Context, rec *roundRecord, idx uint64) (bool, error) {
	val, err := json.Marshal(rec)
	if err != nil {
		return false, permanent(fmt.Errorf("rendezvous %s: encode round %d: %w", r.cfg.RunID, rec.Number, err))
	}
	ok, _, _, err := r.kv.Txn(api.KVTxnOps{
		{Verb: api.KVCAS, Key: r.key(roundKey), Value: val, Index: idx},
		{Verb: api.KVDelete, Key: r.key(rosterKey)},
	}, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("rendezvous %s: write round %d (%s): %w", r.cfg.RunID, rec.Number, rec.Status, err)
	}
	return ok, nil
}

// completeRound writes the roster and marks the open round complete in one
// transaction, the latter guarded by the round record's index.
func (r *Rendezvous) completeRound(ctx context.Context, rec *roundRecord, members []Member, idx uint64) (bool, error) {
	val, err := json.Marshal(rec)
	if err != nil {
		return false, permanent(fmt.Errorf("rendezvous %s: encode round %d: %w", r.cfg.RunID, rec.Number, err))
	}
	ok, _, _, err := r.kv.Txn(api.KVTxnOps{
		{Verb: api.KVSet, Key: r.key(rosterKey), Value: encodeRoster(rec.Number, members)},
		{Verb: api.KVCAS, Key: r.key(roundKey), Value: val, Index: idx},
	}, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("rendezvous %s: complete round %d: %w", r.cfg.RunID, rec.Number, err)
	}
	return ok, nil
}

// snapRoster decodes the roster that came with snapshot s and returns its
// members if it is round number's; nil, nil if it is absent or another
// round's. Each version of the roster is decoded once per member: the
// watch hands the same bytes to every later snapshot.
func (r *Rendezvous) snapRoster(s snapshot, number int) ([]Member, error) {
	if s.rosterIndex == 0 {
		return nil, nil
	}
	r.mu.Lock()
	c := r.rosterCache
	r.mu.Unlock()
	if c.index != s.rosterIndex {
		n, ms, err := decodeRoster(s.roster)
		if err != nil {
			return nil, permanent(fmt.Errorf("rendezvous %s: %w", r.cfg.RunID, err))
		}
		c = decodedRoster{index: s.rosterIndex, number: n, members: ms}
		r.mu.Lock()
		r.rosterCache = c
		r.mu.Unlock()
	}
	if c.number != number {
		return nil, nil
	}
	return c.members, nil
}

// getRoster reads the members of complete round number from Consul (for
// those that need a fresh view, not the watch's); nil, nil when the roster
// is absent or another round's.
func (r *Rendezvous) getRoster(ctx context.Context, number int) ([]Member, error) {
	p, _, err := r.kv.Get(r.key(rosterKey), r.readOptions(ctx))
	if err != nil {
		return nil, fmt.Errorf("rendezvous %s: read roster of round %d: %w", r.cfg.RunID, number, err)
	}
	if p == nil {
		return nil, nil
	}
	n, ms, err := decodeRoster(p.Value)
	if err != nil {
		return nil, permanent(fmt.Errorf("rendezvous %s: %w", r.cfg.RunID, err))
	}
	if n != number {
		return nil, nil
	}
	return ms, nil
}

// getRound reads the round record straight from Consul (not from the
// watch), for the read-modify-CAS of rare writers.
func (r *Rendezvous) getRound(ctx context.Context) (*roundRecord, uint64, error) {
	p, _, err := r.kv.Get(r.key(roundKey), r.readOptions(ctx))
	if err != nil {
		return nil, 0, fmt.Errorf("rendezvous %s: read round record: %w", r.cfg.RunID, err)
	}
	if p == nil {
		return nil, 0, nil
	}
	rec, err := decodeRoundRecord(p.Value)
	if err != nil {
		return nil, 0, permanent(fmt.Errorf("rendezvous %s: decode round record: %w", r.cfg.RunID, err))
	}
	return rec, p.ModifyIndex, nil
}

// declareTimeout marks open round n as timed out, recording who joined and
// who did not, so that every member waiting for it fails the same way. A
// lost CAS is no error: the record moved on, and the watch will show how.
func (r *Rendezvous) declareTimeout(ctx context.Context, n int) error {
	rec, idx, err := r.getRound(ctx)
	if err != nil || rec == nil || rec.Number != n || rec.Status != statusJoining {
		return err
	}
	pairs, _, err := r.kv.List(r.key(livePrefix), r.readOptions(ctx))
	if err != nil {
		return fmt.Errorf("rendezvous %s: list members for timeout of round %d: %w", r.cfg.RunID, n, err)
	}
	joined := parseMembers(r.base, pairs).candidates(n)
	have := map[string]bool{}
	for _, m := range joined {
		have[m.Name] = true
	}
	var missing []string
	for _, name := range r.cfg.Expected {
		if !have[name] {
			missing = append(missing, name)
		}
	}
	next := *rec
	next.Status, next.Joined, next.Missing, next.Timeout = statusTimeout, joined, missing, r.cfg.JoinTimeout.String()
	_, err = r.casRound(ctx, &next, idx)
	return err
}

// Fail ends round for every member because of f (a local process exited
// non-zero) and consumes one restart of the group's budget. If the round has
// already ended (another member or the coordinator was first), it does
// nothing: one event, one restart.
//
// Consul errors are retried with backoff until the failure is recorded or
// ctx ends; Fail returns an error only then (or on a corrupt record). Give
// it as long as the member can wait for the group to restart, e.g. the
// task's own context (ended by a stop): while Consul is down nobody else can
// start the next round either, and a Fail given up would leave the other
// members (or, in a one-member group, this one) waiting for ever.
func (r *Rendezvous) Fail(ctx context.Context, round *Round, f Failure) error {
	if err := r.usable(); err != nil {
		return err
	}
	if f.Member == "" {
		f.Member = r.self.Name
	}
	bo := newBackoff()
	for {
		rec, idx, err := r.getRound(ctx)
		if err == nil {
			if rec == nil || rec.Number != round.Number || rec.Status != statusComplete {
				return nil
			}
			var ok bool
			ok, err = r.casRound(ctx, endRound(rec, failureRecord{Failure: f, MemberID: r.self.ID, ByID: r.self.ID}, true), idx)
			if err == nil && ok {
				return nil
			}
			if err == nil {
				continue // the record changed under us: read it again
			}
		}
		if !transient(err) {
			return fmt.Errorf("rendezvous %s: fail round %d: %w", r.cfg.RunID, round.Number, err)
		}
		r.logf("fail round %d: %v (retrying)", round.Number, err)
		if !bo.Wait(ctx) {
			return fmt.Errorf("rendezvous %s: fail round %d: %w (last error: %w)", r.cfg.RunID, round.Number, ctx.Err(), err)
		}
	}
}

// Done records that this member finished round successfully, so that its
// departure is not taken for a failure. Like Fail it retries Consul errors
// until the record is written or ctx ends; give it as long as a successful
// run can afford to wait to say so (a Done given up makes the member's
// departure look like a failure to the others).
func (r *Rendezvous) Done(ctx context.Context, round *Round) error {
	if err := r.usable(); err != nil {
		return err
	}
	val, err := json.Marshal(doneRecord{Gen: round.Number})
	if err != nil {
		return fmt.Errorf("rendezvous %s: encode done record: %w", r.cfg.RunID, err)
	}
	err = retry(ctx, r.logfFunc(), "mark done", func(ctx context.Context) error {
		_, err := r.kv.Put(&api.KVPair{Key: r.key(donePrefix + r.self.ID), Value: val}, (&api.WriteOptions{}).WithContext(ctx))
		return err
	})
	if err != nil {
		return fmt.Errorf("rendezvous %s: mark %s done in round %d: %w", r.cfg.RunID, r.self.Name, round.Number, err)
	}
	return nil
}

// logfFunc is r.logf, or nil without Config.Logf (for retry).
func (r *Rendezvous) logfFunc() func(string, ...any) {
	if r.cfg.Logf == nil {
		return nil
	}
	return r.logf
}

// Watch delivers one Failure, then closes, when round ends for a reason
// other than this member's own Fail: another member's Fail, a member that
// vanished without Done (session invalidated), a late joiner with Min<Max,
// the restart budget running out, or this member's session being lost
// (Consul said it does not exist; the member gets a new session for its
// next Join). It closes without delivering when ctx ends, the member is
// closed, or the run was cleaned up after success. A Consul outage delivers
// nothing: the watch waits for Consul to answer again. It waits on the
// member's blocking query of the control keys, so it costs no requests of
// its own.
func (r *Rendezvous) Watch(ctx context.Context, round *Round) <-chan Failure {
	ch := make(chan Failure, 1)
	r.mu.Lock()
	closedCh := r.closedCh
	sess := r.sess
	if round != nil && round.Number == r.lastReturned && r.roundSession != nil {
		sess = r.roundSession
	}
	r.mu.Unlock()
	var lostC <-chan struct{}
	if sess != nil {
		lostC = sess.Done()
	}
	go func() {
		defer close(ch)
		if sess == nil {
			ch <- Failure{Member: r.self.Name, Reason: "consul session lost"}
			return
		}
		for {
			st := r.state()
			if st.fatal != nil {
				ch <- Failure{Member: r.self.Name, Reason: st.fatal.Error()}
				return
			}
			if st.ok {
				rec := st.snap.round
				if rec == nil {
					return // cleaned up: the run is over
				}
				if rec.Number > round.Number || rec.Status != statusComplete {
					if rec.LastFailure != nil && rec.LastFailure.ByID != r.self.ID {
						ch <- rec.LastFailure.Failure
					}
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-closedCh:
				return
			case <-lostC:
				if sess.Lost() {
					ch <- Failure{Member: r.self.Name, Reason: sess.Err().Error()}
					return
				}
				lostC = nil // closed by Close: closedCh follows
			case <-st.changed:
			}
		}
	}()
	return ch
}
