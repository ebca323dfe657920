package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/consul/api"
)

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
// round numbers and restart count. Use Purge to drop such a run for good;
// the next submission of the same RunGroup also deletes it (see Open).
//
// Consul errors are retried with backoff until ctx ends: give Close the time
// the member can afford before it is killed (Nomad's kill_timeout less the
// time to stop the ranks). When ctx ends first, Close returns the error;
// the session then expires on its own (2×SessionTTL) and with it the
// registration, but the run's keys stay until the next submission of its
// RunGroup or a Purge. Close after a failed Open, and a second Close, do
// nothing and return nil.
func (r *Rendezvous) Close(ctx context.Context) error {
	r.mu.Lock()
	if !r.opened || r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	close(r.closedCh)
	cancel := r.cancel
	r.mu.Unlock()
	if cancel == nil {
		return nil // Open failed (or is still failing): nothing to undo
	}
	cancel()
	r.wg.Wait()
	// The background is stopped: the session no longer changes.
	r.mu.Lock()
	sess := r.sess
	r.mu.Unlock()
	if sess != nil {
		if err := sess.Close(ctx); err != nil {
			return fmt.Errorf("rendezvous %s: leave as %s: %w", r.cfg.RunID, r.self.Name, err)
		}
	}
	if err := r.cleanup(ctx); err != nil {
		return fmt.Errorf("rendezvous %s: cleanup: %w", r.cfg.RunID, err)
	}
	return nil
}

// Stop is Close for a member that was stopped on purpose (its job is being
// stopped): if it is the last member out, the run is over and its state is
// deleted, where Close would keep it for replacements of dead members. It
// retries like Close, within ctx.
func (r *Rendezvous) Stop(ctx context.Context) error {
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	return r.Close(ctx)
}

// cleanup deletes the run's keys if this member is the last one out and the
// run is over (see Close). Each request is retried on its own, so that a
// flaky Consul does not have to answer the whole sequence in one go.
func (r *Rendezvous) cleanup(ctx context.Context) error {
	var pairs api.KVPairs
	err := r.retry(ctx, "list members", func(ctx context.Context) (err error) {
		pairs, _, err = r.kv.List(r.key(memberPfx), r.readOptions(ctx))
		return err
	})
	if err != nil {
		return err
	}
	view := parseMembers(r.base, pairs)
	var rec *roundRecord
	var idx uint64
	err = r.retry(ctx, "read round record", func(ctx context.Context) (err error) {
		rec, idx, err = r.getRound(ctx)
		return err
	})
	if err != nil {
		return err
	}
	// The roster is read at most once, and only when needed: to tell a dead
	// member's lingering registration from a running one, or to see
	// whether everyone finished.
	var roster []Member
	haveRoster := false
	readRoster := func() ([]Member, error) {
		if haveRoster || rec == nil || rec.Status != statusComplete {
			return roster, nil
		}
		err := r.retry(ctx, "read roster", func(ctx context.Context) (err error) {
			roster, err = r.getRoster(ctx, rec.Number)
			return err
		})
		haveRoster = err == nil
		return roster, err
	}
	last, err := lastOut(view, rec, readRoster)
	if err != nil || !last {
		return err
	}
	if r.cfg.RunGroup != "" {
		// Open collected the runs that were dead then; a submission whose
		// members died shortly before this one opened still had live
		// sessions (they expire within 2×TTL). The last one out of this
		// run collects them.
		defer func() {
			if err := r.collectDeadRuns(ctx); err != nil {
				r.logf("deleting dead runs of %s: %v", r.cfg.RunGroup, err)
			}
		}()
	}
	r.mu.Lock()
	over := r.stopping || rec == nil || rec.terminal()
	r.mu.Unlock()
	if !over && rec.Status == statusComplete {
		roster, err := readRoster()
		if err != nil {
			return err
		}
		over = roster != nil
		for _, m := range roster {
			if view.done[m.ID] < rec.Number {
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
	// A failed guard (ok false, no error) means someone reopened the run
	// since we looked: it is theirs now.
	return r.retry(ctx, "delete "+r.base, func(ctx context.Context) error {
		_, _, _, err := r.kv.Txn(api.KVTxnOps{guard, {Verb: api.KVDeleteTree, Key: r.base}}, (&api.QueryOptions{}).WithContext(ctx))
		return err
	})
}

// lastOut reports whether no live registration that still matters is left
// once this member's is gone. In a complete round, a registration for it or
// an earlier round by a member that is not in its roster matters no more:
// that member died and was replaced, and its session merely outlives it (by
// up to 2×TTL, longer when a leader election re-arms the timers). Counting it
// would leave the run's keys behind with no one to delete them. A member
// that finished the round and has yet to close still counts: it will be out
// in a moment, and one member out of many doing the cleanup is enough.
// roster is called only when a registration cannot be judged without it.
func lastOut(view memberView, rec *roundRecord, roster func() ([]Member, error)) (bool, error) {
	var unsure []string // not done, registered for this round or an earlier one
	for id, lr := range view.live {
		if rec == nil || rec.Status != statusComplete || lr.Gen > rec.Number || view.done[id] >= rec.Number {
			return false, nil
		}
		unsure = append(unsure, id)
	}
	if len(unsure) == 0 {
		return true, nil
	}
	ms, err := roster()
	if err != nil {
		return false, err
	}
	for _, m := range ms {
		if slices.Contains(unsure, m.ID) {
			return false, nil // a running member of the round
		}
	}
	return true, nil
}

// retry is retry with this member's logger.
func (r *Rendezvous) retry(ctx context.Context, what string, op func(context.Context) error) error {
	return retry(ctx, r.logfFunc(), what, op)
}

// isLayoutName says whether name is a key of the run layout (P/ctl/,
// P/m/, P/roster): such a name cannot be a run of a group, as run IDs
// from before RunGroup used the group's path itself.
func isLayoutName(name string) bool {
	return name == "ctl" || name == "m" || name == "roster"
}

// deadRun is what collectDeadRuns knows of a sibling run.
type deadRun struct {
	alive       bool
	roundIndex  uint64 // ModifyIndex of its round record; 0: none
	leaderIndex uint64 // ModifyIndex of a sessionless leader key; 0: none
}

// collectDeadRuns deletes every other run of r's RunGroup whose members are
// all gone: no registration and no coordinator lock held by a session.
// Each deletion is one transaction guarded by the run's round record and
// lock key, so a run that someone reopened meanwhile (took the lock,
// changed the round) is left alone. A member that reopened a dead run and
// only registered, in the instant between our read and the delete, would
// see the run vanish and start it over at round 1; runs are per
// submission, so only a member of a submission that was replaced can do
// that.
func (r *Rendezvous) collectDeadRuns(ctx context.Context) error {
	groupBase := r.cfg.Prefix + "/" + r.cfg.RunGroup + "/"
	self := strings.TrimPrefix(r.cfg.RunID, r.cfg.RunGroup+"/")
	var pairs api.KVPairs
	err := retry(ctx, r.logfFunc(), "list runs of "+r.cfg.RunGroup, func(ctx context.Context) error {
		var err error
		pairs, _, err = r.kv.List(groupBase, r.readOptions(ctx))
		return err
	})
	if err != nil {
		return err
	}
	runs := map[string]*deadRun{}
	for _, p := range pairs {
		sub, rest, ok := strings.Cut(strings.TrimPrefix(p.Key, groupBase), "/")
		if !ok || sub == self || isLayoutName(sub) {
			continue
		}
		run := runs[sub]
		if run == nil {
			run = &deadRun{}
			runs[sub] = run
		}
		switch {
		case rest == roundKey:
			run.roundIndex = p.ModifyIndex
		case rest == leaderKey:
			if p.Session != "" {
				run.alive = true
			} else {
				run.leaderIndex = p.ModifyIndex
			}
		case strings.HasPrefix(rest, livePrefix) && p.Session != "":
			run.alive = true
		}
	}
	var errs []error
	for sub, run := range runs {
		if run.alive {
			continue
		}
		base := groupBase + sub + "/"
		ops := api.KVTxnOps{
			guardIndex(base+roundKey, run.roundIndex),
			guardIndex(base+leaderKey, run.leaderIndex),
			{Verb: api.KVDeleteTree, Key: base},
		}
		err := retry(ctx, r.logfFunc(), "delete dead run "+base, func(ctx context.Context) error {
			_, _, _, err := r.kv.Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("delete dead run %s: %w", base, err))
			continue
		}
		r.logf("deleted dead run %s", base)
	}
	return errors.Join(errs...)
}

// guardIndex is a transaction check that key still has ModifyIndex idx, or
// with idx 0, that it still does not exist.
func guardIndex(key string, idx uint64) *api.KVTxnOp {
	if idx == 0 {
		return &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: key}
	}
	return &api.KVTxnOp{Verb: api.KVCheckIndex, Key: key, Index: idx}
}

// Purge deletes every key of a run, whatever its state, retrying Consul
// errors until ctx ends. It is for an operator (or the driver, when a job is
// stopped for good): a run whose members all died keeps its state on
// purpose (see Close).
func Purge(ctx context.Context, client *api.Client, prefix, runID string) error {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if runID == "" {
		return errors.New("rendezvous: purge: empty run ID")
	}
	base := fmt.Sprintf("%s/%s/", strings.Trim(prefix, "/"), runID)
	err := retry(ctx, nil, "purge "+base, func(ctx context.Context) error {
		_, err := client.KV().DeleteTree(base, (&api.WriteOptions{}).WithContext(ctx))
		return err
	})
	if err != nil {
		return fmt.Errorf("rendezvous: purge %s: %w", base, err)
	}
	return nil
}
