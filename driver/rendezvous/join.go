package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"
)

var errNotOpen = errors.New("rendezvous: not open (call Open first) or already closed")

func (r *Rendezvous) usable() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.opened || r.closed || r.sessionID == "" {
		return errNotOpen
	}
	return nil
}

// Join blocks until a round that includes this member is complete and
// returns it. It registers the member for the open round (or, when the
// current round is already complete without it, for the next one: a late
// joiner, which with Min<Max makes the coordinator start a new round).
//
// When JoinTimeout passes first, the round is marked timed out so that
// every member waiting for it returns the same *JoinTimeoutError at once.
// A failure with the restart budget spent returns *RestartsExhaustedError.
func (r *Rendezvous) Join(ctx context.Context) (*Round, error) {
	if err := r.usable(); err != nil {
		return nil, err
	}
	timer := time.NewTimer(r.cfg.JoinTimeout)
	defer timer.Stop()
	timedOut := false
	for {
		s, ok, changed, lost := r.state()
		if lost != nil {
			return nil, fmt.Errorf("rendezvous %s: join as %s: %w", r.cfg.RunID, r.self.Name, lost)
		}
		if ok {
			rd, err := r.joinStep(ctx, s, timedOut)
			if err != nil || rd != nil {
				return rd, err
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("rendezvous %s: join as %s: %w", r.cfg.RunID, r.self.Name, ctx.Err())
		case <-changed:
		case <-timer.C:
			timedOut = true
		}
	}
}

// joinStep acts on one snapshot: it returns the round when Join is done, an
// error when Join fails, or neither to keep waiting.
func (r *Rendezvous) joinStep(ctx context.Context, s snapshot, timedOut bool) (*Round, error) {
	rec := s.round
	r.mu.Lock()
	registered, last := r.registered, r.lastReturned
	r.mu.Unlock()
	switch {
	case rec == nil:
		// The coordinator creates round 1; register for it meanwhile.
		if registered != 1 {
			if err := r.register(ctx, 1); err != nil {
				return nil, err
			}
		}
		if timedOut {
			return nil, &JoinTimeoutError{RunID: r.cfg.RunID, Round: 1, Timeout: r.cfg.JoinTimeout.String(), Min: r.cfg.Min, Max: r.cfg.Max, Missing: r.cfg.Expected}
		}
	case rec.terminal():
		if registered > 0 {
			return nil, r.terminalError(rec)
		}
		// A member that never took part finds a run that ended for
		// good: it is a new attempt (Nomad restarted or rescheduled the
		// group), so it opens a fresh round with a fresh budget. The
		// round number keeps counting so stale registrations of the old
		// attempt never match.
		next := &roundRecord{Number: rec.Number + 1, Status: statusJoining, MaxRestarts: r.cfg.MaxRestarts, Min: r.cfg.Min, Max: r.cfg.Max}
		if _, err := r.casRound(ctx, next, s.roundIndex); err != nil {
			return nil, err
		}
	case rec.Status == statusJoining:
		if registered != rec.Number {
			if err := r.register(ctx, rec.Number); err != nil {
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
		if r.tr != nil {
			r.tr[0] = time.Now()
		}
		members, err := r.getRoster(ctx, rec.Number)
		if r.tr != nil {
			r.tr[1] = time.Now()
		}
		if err != nil {
			return nil, err
		}
		if members == nil {
			break // the roster has moved on: so will the record
		}
		if rd, ok := buildRound(rec, members, r.self.ID); ok {
			r.mu.Lock()
			r.lastReturned = rd.Number
			r.mu.Unlock()
			return rd, nil
		}
		// Complete without us: ask for the next round.
		if registered != rec.Number+1 {
			if err := r.register(ctx, rec.Number+1); err != nil {
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

// register writes this member's registration for generation gen, held by
// its session so that it vanishes with the session.
func (r *Rendezvous) register(ctx context.Context, gen int) error {
	val, err := json.Marshal(liveRecord{Member: r.self, Gen: gen})
	if err != nil {
		return fmt.Errorf("rendezvous %s: encode registration: %w", r.cfg.RunID, err)
	}
	got, _, err := r.kv.Acquire(&api.KVPair{Key: r.key(livePrefix + r.self.ID), Value: val, Session: r.SessionID()}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("rendezvous %s: register %s for round %d: %w", r.cfg.RunID, r.self.Name, gen, err)
	}
	if !got {
		return fmt.Errorf("rendezvous %s: register %s for round %d: key held by another session (duplicate member ID %q, or our session was invalidated)", r.cfg.RunID, r.self.Name, gen, r.self.ID)
	}
	r.mu.Lock()
	r.registered = gen
	r.mu.Unlock()
	return nil
}

// casRound writes rec if P/ctl/round still has ModifyIndex idx (0: absent).
func (r *Rendezvous) casRound(ctx context.Context, rec *roundRecord, idx uint64) (bool, error) {
	val, err := json.Marshal(rec)
	if err != nil {
		return false, fmt.Errorf("rendezvous %s: encode round %d: %w", r.cfg.RunID, rec.Number, err)
	}
	ok, _, err := r.kv.CAS(&api.KVPair{Key: r.key(roundKey), Value: val, ModifyIndex: idx}, (&api.WriteOptions{}).WithContext(ctx))
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
		return false, fmt.Errorf("rendezvous %s: encode round %d: %w", r.cfg.RunID, rec.Number, err)
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

// getRoster reads the members of complete round number; nil, nil when the
// roster already belongs to another round.
func (r *Rendezvous) getRoster(ctx context.Context, number int) ([]Member, error) {
	p, _, err := r.kv.Get(r.key(rosterKey), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("rendezvous %s: read roster of round %d: %w", r.cfg.RunID, number, err)
	}
	if p == nil {
		return nil, nil
	}
	n, ms, err := decodeRoster(p.Value)
	if err != nil {
		return nil, fmt.Errorf("rendezvous %s: %w", r.cfg.RunID, err)
	}
	if n != number {
		return nil, nil
	}
	return ms, nil
}

// getRound reads the round record straight from Consul (not from the
// watch), for the read-modify-CAS of rare writers.
func (r *Rendezvous) getRound(ctx context.Context) (*roundRecord, uint64, error) {
	p, _, err := r.kv.Get(r.key(roundKey), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, 0, fmt.Errorf("rendezvous %s: read round record: %w", r.cfg.RunID, err)
	}
	if p == nil {
		return nil, 0, nil
	}
	var rec roundRecord
	if err := json.Unmarshal(p.Value, &rec); err != nil {
		return nil, 0, fmt.Errorf("rendezvous %s: decode round record: %w", r.cfg.RunID, err)
	}
	return &rec, p.ModifyIndex, nil
}

// declareTimeout marks open round n as timed out, recording who joined and
// who did not, so that every member waiting for it fails the same way.
func (r *Rendezvous) declareTimeout(ctx context.Context, n int) error {
	for attempt := 0; attempt < 5; attempt++ {
		rec, idx, err := r.getRound(ctx)
		if err != nil || rec == nil || rec.Number != n || rec.Status != statusJoining {
			return err
		}
		pairs, _, err := r.kv.List(r.key(livePrefix), (&api.QueryOptions{}).WithContext(ctx))
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
		if ok, err := r.casRound(ctx, &next, idx); ok || err != nil {
			return err
		}
	}
	return nil
}

// endRound is the record that follows rec when failure f ends it. consume
// says whether f spends a restart (failures do; membership changes don't).
func endRound(rec *roundRecord, f failureRecord, consume bool) *roundRecord {
	if consume && rec.Restarts >= rec.MaxRestarts {
		next := *rec
		next.Status, next.LastFailure = statusExhausted, &f
		return &next
	}
	restarts := rec.Restarts
	if consume {
		restarts++
	}
	return &roundRecord{Number: rec.Number + 1, Status: statusJoining, Restarts: restarts, MaxRestarts: rec.MaxRestarts, LastFailure: &f, Min: rec.Min, Max: rec.Max}
}

// Fail ends round for every member because of f (a local process exited
// non-zero) and consumes one restart of the group's budget. If the round has
// already ended (another member or the coordinator was first), it does
// nothing: one event, one restart.
func (r *Rendezvous) Fail(ctx context.Context, round *Round, f Failure) error {
	if err := r.usable(); err != nil {
		return err
	}
	if f.Member == "" {
		f.Member = r.self.Name
	}
	for attempt := 0; attempt < 10; attempt++ {
		rec, idx, err := r.getRound(ctx)
		if err != nil {
			return fmt.Errorf("fail round %d: %w", round.Number, err)
		}
		if rec == nil || rec.Number != round.Number || rec.Status != statusComplete {
			return nil
		}
		ok, err := r.casRound(ctx, endRound(rec, failureRecord{Failure: f, MemberID: r.self.ID, ByID: r.self.ID}, true), idx)
		if err != nil {
			return fmt.Errorf("fail round %d: %w", round.Number, err)
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("rendezvous %s: fail round %d: round record kept changing", r.cfg.RunID, round.Number)
}

// Done records that this member finished round successfully, so that its
// departure is not taken for a failure.
func (r *Rendezvous) Done(ctx context.Context, round *Round) error {
	if err := r.usable(); err != nil {
		return err
	}
	val, _ := json.Marshal(doneRecord{Gen: round.Number})
	if _, err := r.kv.Put(&api.KVPair{Key: r.key(donePrefix + r.self.ID), Value: val}, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("rendezvous %s: mark %s done in round %d: %w", r.cfg.RunID, r.self.Name, round.Number, err)
	}
	return nil
}

// Watch delivers one Failure, then closes, when round ends for a reason
// other than this member's own Fail: another member's Fail, a member that
// vanished without Done (session invalidated), a late joiner with Min<Max,
// the restart budget running out, or this member's session being lost. It
// closes without delivering when ctx ends, the member is closed, or the run
// was cleaned up after success. It waits on the member's blocking query of
// the control keys, so it costs no requests of its own.
func (r *Rendezvous) Watch(ctx context.Context, round *Round) <-chan Failure {
	ch := make(chan Failure, 1)
	r.mu.Lock()
	closedCh := r.closedCh
	r.mu.Unlock()
	go func() {
		defer close(ch)
		for {
			s, ok, changed, lost := r.state()
			if lost != nil {
				ch <- Failure{Member: r.self.Name, Reason: lost.Error()}
				return
			}
			if ok {
				rec := s.round
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
			case <-changed:
			}
		}
	}()
	return ch
}

// Close leaves the run: it stops the background work and destroys the
// session (which deletes this member's registration and releases the
// coordinator lock if held).
//
// Cleanup: the member that finds no live registration left after its own is
// gone is the last one out. It deletes every key of the run when the run is
// over — every member of the last complete round called Done, a join timed
// out, or the restart budget ran out — in a transaction guarded by the round
// record's ModifyIndex, so it never deletes a round someone has reopened
// since. Otherwise (members died, a round is open) the state is kept: Nomad
// reschedules the allocations and the new members continue with the same
// round numbers and restart count. Use Purge to drop such a run for good.
func (r *Rendezvous) Close(ctx context.Context) error {
	r.mu.Lock()
	if !r.opened || r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	close(r.closedCh)
	id := r.sessionID
	r.mu.Unlock()

	r.cancel()
	close(r.renewStop)
	<-r.renewDone
	r.wg.Wait()
	if _, err := r.ses.Destroy(id, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("rendezvous %s: destroy session of %s: %w", r.cfg.RunID, r.self.Name, err)
	}
	if err := r.cleanup(ctx); err != nil {
		return fmt.Errorf("rendezvous %s: cleanup: %w", r.cfg.RunID, err)
	}
	return nil
}

// Stop is Close for a member that was stopped on purpose (its job is being
// stopped): if it is the last member out, the run is over and its state is
// deleted, where Close would keep it for replacements of dead members.
func (r *Rendezvous) Stop(ctx context.Context) error {
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	return r.Close(ctx)
}

func (r *Rendezvous) cleanup(ctx context.Context) error {
	live, _, err := r.kv.Keys(r.key(livePrefix), "", (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("list live members: %w", err)
	}
	if len(live) > 0 {
		return nil // not the last one out
	}
	rec, idx, err := r.getRound(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	over := r.stopping || rec == nil || rec.terminal()
	r.mu.Unlock()
	if !over && rec.Status == statusComplete {
		pairs, _, err := r.kv.List(r.key(donePrefix), (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return fmt.Errorf("list finished members: %w", err)
		}
		done := parseMembers(r.base, pairs).done
		if r.tr != nil {
			r.tr[0] = time.Now()
		}
		members, err := r.getRoster(ctx, rec.Number)
		if r.tr != nil {
			r.tr[1] = time.Now()
		}
		if err != nil {
			return err
		}
		over = members != nil
		for _, m := range members {
			if done[m.ID] < rec.Number {
				over = false
				break
			}
		}
	}
	if !over {
		return nil
	}
	guard := &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: r.key(roundKey)}
	if rec != nil {
		guard = &api.KVTxnOp{Verb: api.KVCheckIndex, Key: r.key(roundKey), Index: idx}
	}
	ok, resp, _, err := r.kv.Txn(api.KVTxnOps{guard, {Verb: api.KVDeleteTree, Key: r.base}}, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("delete %s: %w", r.base, err)
	}
	if !ok && resp != nil && len(resp.Errors) > 0 && rec != nil {
		// The round record changed under us: someone reopened the
		// run; it is theirs now.
		return nil
	}
	return nil
}

// Purge deletes every key of a run, whatever its state. It is for an
// operator (or the driver, when a job is stopped for good): a run whose
// members all died keeps its state on purpose (see Close).
func Purge(ctx context.Context, client *api.Client, prefix, runID string) error {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if runID == "" {
		return errors.New("rendezvous: purge: empty run ID")
	}
	base := fmt.Sprintf("%s/%s/", prefix, runID)
	if _, err := client.KV().DeleteTree(base, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("rendezvous: purge %s: %w", base, err)
	}
	return nil
}
