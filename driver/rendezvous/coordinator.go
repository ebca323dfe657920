package rendezvous

import (
	"context"
	"time"

	"github.com/hashicorp/consul/api"
)

// coordinate runs while this member holds the coordinator lock. It is the
// only member that watches the registrations (P/m/), which change with every
// join; it turns them into round records. Every write is a check-and-set on
// the record it read, so a stale view or a second coordinator (briefly, while
// a dead one's lock is handed over) can only lose a write, never corrupt one.
func (r *Rendezvous) coordinate(ctx context.Context) {
	views := make(chan memberView, 1)
	go r.watchMembers(ctx, views)

	var (
		view      *memberView
		lcRound   int // open round whose last call is running, 0 = none
		lcTimer   *time.Timer
		lcC       <-chan time.Time
		lcDue     bool     // lcRound's last call has passed
		wrote     bool     // wroteFrom is set
		wroteFrom uint64   // round index our last successful write replaced
		rosterN   int      // round number of roster
		roster    []Member // members of the latest complete round
	)
	stopLastCall := func() {
		if lcTimer != nil {
			lcTimer.Stop()
		}
		lcRound, lcTimer, lcC, lcDue = 0, nil, nil, false
	}
	defer stopLastCall()

	for {
		s, ok, changed, _ := r.state()
		// Skip while our view still shows the record our last write
		// replaced: acting on it could only fail the CAS.
		if ok && !(wrote && s.roundIndex == wroteFrom) {
			if rec := s.round; rec != nil && rec.Status == statusComplete && rosterN != rec.Number {
				// Another coordinator completed this round: read its
				// roster once.
				if ms, err := r.getRoster(ctx, rec.Number); err == nil && ms != nil {
					rosterN, roster = rec.Number, ms
				}
			}
			var members []Member
			if s.round != nil && rosterN == s.round.Number {
				members = roster
			}
			next, lastCall := r.decide(s, view, members, lcRound, lcDue)
			switch {
			case lastCall > 0 && lastCall != lcRound:
				stopLastCall()
				lcRound = lastCall
				lcTimer = time.NewTimer(r.cfg.LastCall)
				lcC = lcTimer.C
			case lastCall == 0 && lcRound != 0:
				// The round completed, ended, or fell below Min.
				stopLastCall()
			}
			if next != nil {
				var written bool
				var err error
				if next.rec.Status == statusComplete {
					written, err = r.completeRound(ctx, next.rec, next.members, s.roundIndex)
					if err == nil && written {
						rosterN, roster = next.rec.Number, next.members
					}
				} else {
					written, err = r.casRound(ctx, next.rec, s.roundIndex)
				}
				if err == nil && written {
					wrote, wroteFrom = true, s.roundIndex
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case v := <-views:
			view = &v
		case <-changed:
		case <-lcC:
			lcC, lcDue = nil, true
		}
	}
}

// transition is a round record to write, with the roster when it completes
// a round.
type transition struct {
	rec     *roundRecord
	members []Member
}

// decide returns the record that should replace s.round, or nil; and the
// number of an open round whose last call should start now (0: none).
// members is the roster of s.round when it is complete (nil if unknown).
func (r *Rendezvous) decide(s snapshot, view *memberView, members []Member, lcRound int, lastCallDue bool) (*transition, int) {
	rec := s.round
	if rec == nil {
		return &transition{rec: &roundRecord{Number: 1, Status: statusJoining, MaxRestarts: r.cfg.MaxRestarts, Min: r.cfg.Min, Max: r.cfg.Max}}, 0
	}
	if view == nil || rec.terminal() {
		return nil, 0
	}
	minN, maxN := rec.Min, rec.Max
	if maxN == 0 {
		minN, maxN = r.cfg.Min, r.cfg.Max
	}
	switch rec.Status {
	case statusJoining:
		cands := view.candidates(rec.Number)
		complete := func(ms []Member) *transition {
			next := *rec
			next.Status, next.Size = statusComplete, len(ms)
			return &transition{rec: &next, members: ms}
		}
		if len(cands) >= maxN {
			return complete(cands[:maxN]), 0
		}
		if len(cands) >= minN {
			if lcRound == rec.Number && lastCallDue {
				return complete(cands), rec.Number
			}
			return nil, rec.Number
		}
	case statusComplete:
		if members == nil {
			return nil, 0
		}
		inRound := make(map[string]bool, len(members))
		for _, m := range members {
			inRound[m.ID] = true
			if _, alive := view.live[m.ID]; alive {
				continue
			}
			if view.done[m.ID] >= rec.Number {
				continue // finished and left: not a failure
			}
			return &transition{rec: endRound(rec, failureRecord{
				Failure:  Failure{Member: m.Name, Reason: "left the round without finishing: its Consul session was invalidated (allocation lost, node down, or TTL missed)"},
				MemberID: m.ID,
			}, true)}, 0
		}
		if len(members) < maxN {
			// Elastic: a member registered for a later round wants in;
			// start a new round that includes it, as torchrun does.
			// A membership change costs no restart.
			for _, c := range view.candidates(rec.Number + 1) {
				if !inRound[c.ID] {
					return &transition{rec: endRound(rec, failureRecord{
						Failure:  Failure{Member: c.Name, Reason: "new member wants to join: starting a new round"},
						MemberID: c.ID,
					}, false)}, 0
				}
			}
		}
	}
	return nil, 0
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
