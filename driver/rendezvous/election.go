package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/consul"
)

// The coordinator election: a Consul lock on P/ctl/leader held with the
// member's session. Unlike etcd's Election it has no watch of its own: the
// lock key lives under P/ctl/, which every member watches anyway, so the
// election costs no request while the lock is held.

// campaignSpread bounds the random wait before a member tries for a free
// coordinator lock. Every member sees the lock free at the same moment when
// a run starts or its coordinator dies, and every try is a Raft write, won
// or lost: with each member waiting a random part of the spread, the first
// tries after about spread/members (2 ms) and most of the others see its
// hold before their turn comes. At a thousand members, trying at once cost
// as many writes as the registrations themselves.
func campaignSpread(members int) time.Duration {
	return min(time.Duration(members)*2*time.Millisecond, 2*time.Second)
}

// campaign acquires the coordinator lock whenever it is free and runs the
// coordinator while this member holds it. It follows session replacement:
// a lost session loses the lock (Behavior=delete), and the new one
// campaigns again.
func (r *Rendezvous) campaign(ctx context.Context) {
	bo := newBackoff()
	var tryAt time.Time // when to try for the lock we saw free; zero: not drawn yet
	for ctx.Err() == nil {
		st := r.state()
		if st.fatal != nil {
			return
		}
		if st.ok && st.sess != nil && st.sess.Err() == nil && st.snap.leader == st.sess.ID() {
			// We hold the lock though we did not hear so: the answer
			// to our acquire was lost (or the step-down was for a
			// stale view). Lead.
			r.lead(ctx, st.sess, false)
			continue
		}
		if st.ok && st.snap.leader != "" {
			tryAt = time.Time{} // held: draw anew when it is free again
		}
		if !st.ok || st.snap.leader != "" || st.sess == nil {
			select {
			case <-ctx.Done():
				return
			case <-st.changed:
			}
			continue
		}
		if tryAt.IsZero() {
			tryAt = time.Now().Add(rand.N(r.campaignSpread(r.cfg.Max)) + 1)
		}
		if wait := time.Until(tryAt); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-st.changed:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		sess := st.sess
		// Round 1 is created with the lock when there is none yet: the
		// members' watches then wake once for both.
		created := st.snap.round == nil && st.snap.roundIndex == 0
		var (
			got bool
			err error
		)
		if created {
			got, err = r.acquireCreatingRound1(ctx, sess.ID())
		} else {
			got, _, err = r.kv.Acquire(&api.KVPair{Key: r.key(leaderKey), Value: []byte(r.self.ID), Session: sess.ID()}, (&api.WriteOptions{}).WithContext(ctx))
		}
		if err != nil || !got {
			// Lost the race (the watch will show the winner), the
			// lock-delay of a dead holder is still running, or Consul
			// failed: for the last two nothing changes in Consul, so
			// retry after a wait.
			wait := lockDelay + 50*time.Millisecond
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				r.logf("acquire the coordinator lock: %v (retrying)", err)
				if consul.IsInvalidSession(err) {
					sess.Check()
				}
				wait = bo.Next()
			}
			select {
			case <-ctx.Done():
				return
			case <-st.changed:
			case <-time.After(wait):
			}
			continue
		}
		bo.Reset()
		r.lead(ctx, sess, created)
	}
}

// acquireCreatingRound1 takes the coordinator lock and creates round 1 in
// one transaction. It reports false, without error, if the lock is held or
// a round record exists: the watch will show which.
func (r *Rendezvous) acquireCreatingRound1(ctx context.Context, sid string) (bool, error) {
	rec := decide(r.policy(), nil, nil, nil, lastCall{}).Next.rec
	val, err := json.Marshal(rec)
	if err != nil {
		return false, permanent(fmt.Errorf("rendezvous %s: encode round %d: %w", r.cfg.RunID, rec.Number, err))
	}
	ok, resp, _, err := r.kv.Txn(api.KVTxnOps{
		{Verb: api.KVLock, Key: r.key(leaderKey), Value: []byte(r.self.ID), Session: sid},
		{Verb: api.KVCAS, Key: r.key(roundKey), Value: val, Index: 0},
	}, (&api.QueryOptions{}).WithContext(ctx))
	if err == nil && !ok && resp != nil {
		// A rolled-back transaction says why in its errors; an invalid
		// session is news to pass on, as a plain acquire's error would.
		for _, e := range resp.Errors {
			if strings.Contains(e.What, "invalid session") {
				err = fmt.Errorf("%s", e.What)
			}
		}
	}
	if err != nil {
		return false, fmt.Errorf("rendezvous %s: acquire the coordinator lock and open round 1: %w", r.cfg.RunID, err)
	}
	return ok, nil
}

// lead runs the coordinator until this member no longer holds the lock:
// the published holder is someone else or nobody (the key was deleted), or
// the session that holds it is lost. created says that the lock was taken
// together with round 1.
func (r *Rendezvous) lead(ctx context.Context, sess *consul.Session, created bool) {
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.coordinate(lctx, created) }()
	// Until the watch has shown our own hold, an empty holder is just a
	// stale view.
	confirmed := false
	for {
		st := r.state()
		if st.fatal != nil {
			break
		}
		if st.ok && st.snap.leader == sess.ID() {
			confirmed = true
		} else if st.ok && (confirmed || st.snap.leader != "") {
			break
		}
		select {
		case <-ctx.Done():
		case <-sess.Done():
		case <-st.changed:
			continue
		}
		break
	}
	cancel()
	<-done
}
