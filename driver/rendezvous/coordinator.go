package rendezvous

import (
	"context"
	"time"

	"github.com/hashicorp/consul/api"
)

// coordinate runs while this member holds the coordinator lock. It is the
// only member that watches the registrations (P/m/), which change with every
// join; it turns them into round records through decide. Every write is a
// check-and-set on the record it read, so a stale view or a second
// coordinator (briefly, while a dead one's lock is handed over) can only
// lose a write, never corrupt one. A write or read that fails is retried
// with backoff on a timer of its own: nothing may change in Consul after a
// failed write, so waiting for a change could wait for ever.
//
// created says that this coordinator created round 1 as it took the lock:
// until the watch shows that record, there is nothing to decide.
func (r *Rendezvous) coordinate(ctx context.Context, created bool) {
	views := make(chan memberView, 1)
	ctx, cancel := context.WithCancel(ctx)
	watching := make(chan struct{})
	go func() { defer close(watching); r.watchMembers(ctx, views) }()
	defer func() { cancel(); <-watching }()

	p := r.policy()
	var (
		view      *memberView
		lc        lastCall
		lcTimer   *time.Timer
		lcC       <-chan time.Time
		wrote     = created // wroteFrom is set
		wroteFrom uint64    // round index our last successful write replaced (0: none was there)
		rosterN   int       // round number of roster
		roster    []Member  // members of the latest complete round
		bo        = newBackoff()
	)
	stopLastCall := func() {
		if lcTimer != nil {
			lcTimer.Stop()
		}
		lc, lcTimer, lcC = lastCall{}, nil, nil
	}
	defer stopLastCall()

	for {
		st := r.state()
		var failed error
		// Skip while our view still shows the record our last write
		// replaced: acting on it could only fail the CAS.
		if st.ok && !(wrote && st.snap.roundIndex == wroteFrom) {
			rec := st.snap.round
			if rec != nil && rec.Status == statusComplete && rosterN != rec.Number {
				// Another coordinator completed this round: its roster
				// came with the record.
				ms, err := r.snapRoster(st.snap, rec.Number)
				if err != nil {
					failed = err
				} else if ms != nil {
					rosterN, roster = rec.Number, ms
				}
			}
			var members []Member
			if rec != nil && rosterN == rec.Number {
				members = roster
			}
			d := decide(p, rec, view, members, lc)
			switch {
			case d.LastCall > 0 && d.LastCall != lc.Round:
				stopLastCall()
				lc.Round = d.LastCall
				lcTimer = time.NewTimer(r.cfg.LastCall)
				lcC = lcTimer.C
			case d.LastCall == 0 && lc.Round != 0:
				// The round completed, ended, or fell below Min.
				stopLastCall()
			}
			if d.Next != nil {
				written, err := r.writeTransition(ctx, d.Next, st.snap.roundIndex)
				switch {
				case err != nil:
					failed = err
				case written:
					wrote, wroteFrom = true, st.snap.roundIndex
					if d.Next.rec.Status == statusComplete {
						rosterN, roster = d.Next.rec.Number, d.Next.members
					}
				}
			}
		}
		var retryC <-chan time.Time
		if failed != nil {
			if ctx.Err() != nil {
				return
			}
			r.logf("coordinator: %v (retrying)", failed)
			retryC = time.After(bo.Next())
		} else {
			bo.Reset()
		}
		select {
		case <-ctx.Done():
			return
		case v := <-views:
			view = &v
		case <-st.changed:
		case <-lcC:
			lcC, lc.Due = nil, true
		case <-retryC:
		}
	}
}

// policy is what this member's run was configured with.
func (r *Rendezvous) policy() policy {
	return policy{Min: r.cfg.Min, Max: r.cfg.Max, MaxRestarts: r.cfg.MaxRestarts}
}

// writeTransition writes t over the round record with ModifyIndex idx.
func (r *Rendezvous) writeTransition(ctx context.Context, t *transition, idx uint64) (bool, error) {
	if t.rec.Status == statusComplete {
		return r.completeRound(ctx, t.rec, t.members, idx)
	}
	return r.casRound(ctx, t.rec, idx)
}

// watchMembers long-polls P/m/ and hands the latest view to the coordinator,
// dropping views it has not consumed yet (only the newest matters).
func (r *Rendezvous) watchMembers(ctx context.Context, out chan memberView) {
	r.watchPrefix(ctx, memberPfx, func(pairs api.KVPairs) bool {
		v := parseMembers(r.base, pairs)
		select {
		case <-out:
		default:
		}
		out <- v
		return true
	})
}
