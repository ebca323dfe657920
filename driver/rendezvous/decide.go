package rendezvous

// This file is the coordinator's judgement, kept apart from Consul: decide
// is a pure function of what the coordinator sees, so every rule of the
// round life cycle is table-tested without an agent (decide_test.go).

// policy is what a run was configured with; a round record carries its own
// Min/Max, which win over these.
type policy struct {
	Min, Max    int
	MaxRestarts int
}

// transition is a round record to write, with the roster when it completes
// a round.
type transition struct {
	rec     *roundRecord
	members []Member
}

// lastCall is the state of the last-call timer of an elastic round.
type lastCall struct {
	Round int  // open round whose last call is running, 0 = none
	Due   bool // Round's last call has passed
}

// decision is what the coordinator should do now.
type decision struct {
	// Next replaces the current round record (compare-and-set), or nil.
	Next *transition
	// LastCall is the open round whose last call should be running now
	// (0: none, stop any timer).
	LastCall int
}

// decide returns what should follow rec (nil: no round yet) given the
// registrations in view (nil: not known yet), members (the roster of rec
// when it is complete; nil if not known) and the last-call timer.
//
//   - No round: create round 1 with the full restart budget.
//   - Open round with Max registrations: complete it with the first Max in
//     rank order. With at least Min (Min<Max): run the last call, then
//     complete it with everyone registered.
//   - Complete round: a member neither live nor done for this round ends it
//     as a failure, consuming one restart (or exhausting the budget). With
//     room left (fewer than Max members), a new member registered for the
//     next round ends it as a membership change, which consumes none.
//   - A terminal round (timed out, exhausted) is left alone.
func decide(p policy, rec *roundRecord, view *memberView, members []Member, lc lastCall) decision {
	if rec == nil {
		return decision{Next: &transition{rec: &roundRecord{Number: 1, Status: statusJoining, MaxRestarts: p.MaxRestarts, Min: p.Min, Max: p.Max}}}
	}
	if view == nil || rec.terminal() {
		return decision{}
	}
	minN, maxN := rec.Min, rec.Max
	if maxN == 0 {
		minN, maxN = p.Min, p.Max
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
			return decision{Next: complete(cands[:maxN])}
		}
		if len(cands) >= minN {
			if lc.Round == rec.Number && lc.Due {
				return decision{Next: complete(cands), LastCall: rec.Number}
			}
			return decision{LastCall: rec.Number}
		}
	case statusComplete:
		if members == nil {
			return decision{}
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
			return decision{Next: &transition{rec: endRound(rec, failureRecord{
				Failure:  Failure{Member: m.Name, Reason: "left the round without finishing: its Consul session was invalidated (allocation lost, node down, or TTL missed)"},
				MemberID: m.ID,
			}, true)}}
		}
		if len(members) < maxN {
			// Elastic: a member registered for a later round wants in;
			// start a new round that includes it, as torchrun does.
			for _, c := range view.candidates(rec.Number + 1) {
				if !inRound[c.ID] {
					return decision{Next: &transition{rec: endRound(rec, failureRecord{
						Failure:  Failure{Member: c.Name, Reason: "new member wants to join: starting a new round"},
						MemberID: c.ID,
					}, false)}}
				}
			}
		}
	}
	return decision{}
}

// endRound is the record that follows rec when failure f ends it. consume
// says whether f spends a restart (failures do; membership changes don't).
// With the budget spent, rec becomes terminal ("exhausted") instead.
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
