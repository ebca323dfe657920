package rendezvous

import (
	"context"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// The coordinator election: a Consul lock on P/ctl/leader held with the
// member's session. Unlike etcd's Election it has no watch of its own: the
// lock key lives under P/ctl/, which every member watches anyway, so the
// election costs no request while the lock is held.

// campaign acquires the coordinator lock whenever it is free and runs the
// coordinator while this member holds it. It follows session replacement:
// a lost session loses the lock (Behavior=delete), and the new one
// campaigns again.
func (r *Rendezvous) campaign(ctx context.Context) {
	bo := newBackoff()
	for ctx.Err() == nil {
		st := r.state()
		if st.fatal != nil {
			return
		}
		if st.ok && st.sess != nil && st.sess.Err() == nil && st.snap.leader == st.sess.ID() {
			// We hold the lock though we did not hear so: the answer
			// to our acquire was lost (or the step-down was for a
			// stale view). Lead.
			r.lead(ctx, st.sess)
			continue
		}
		if !st.ok || st.snap.leader != "" || st.sess == nil {
			select {
			case <-ctx.Done():
				return
			case <-st.changed:
			}
			continue
		}
		sess := st.sess
		got, _, err := r.kv.Acquire(&api.KVPair{Key: r.key(leaderKey), Value: []byte(r.self.ID), Session: sess.ID()}, (&api.WriteOptions{}).WithContext(ctx))
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
				if strings.Contains(err.Error(), "invalid session") {
					sess.Check()
				}
				wait = bo.next()
			}
			select {
			case <-ctx.Done():
				return
			case <-st.changed:
			case <-time.After(wait):
			}
			continue
		}
		bo.reset()
		r.lead(ctx, sess)
	}
}

// lead runs the coordinator until this member no longer holds the lock:
// the published holder is someone else or nobody (the key was deleted), or
// the session that holds it is lost.
func (r *Rendezvous) lead(ctx context.Context, sess *Session) {
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.coordinate(lctx) }()
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
