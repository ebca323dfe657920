package policy

import (
	"slices"
	"time"
)

// release is what a gang frees when it ends.
type release struct {
	at    time.Time
	alloc []nodeMembers
	per   Resources
	queue int // -1 when the queue is not configured
	gpus  int
}

// reservation is the head's claim in EASY backfill: the first gang that
// waits for capacity (not quota) is promised the earliest time enough
// running gangs end for it to fit, assuming each runs its MaxRuntime; a
// gang behind it may start now only if that promise still holds.
type reservation struct {
	head  *pendingJob
	known bool // false: the GPUs it needs are held by gangs with no MaxRuntime
	start time.Time
	// extra is, per node, what stays free at start once the head has its
	// members: a gang confined to it delays the head whenever it ends.
	extra     []Resources
	noFitSide map[gangShape]int // the fitter's cache, for extra
	// limit is min(free now, extra) per node, as of the fitter's
	// limitVersion (-1: not computed): it changes only with an
	// admission, and thousands of gangs behind the head ask of it.
	limit        []Resources
	limitVersion int
}

// reserve computes the head's reservation from the free space now and the
// releases to come. O(releases × nodes) at worst, once per Decide.
func reserve(head *pendingJob, free []Resources, releases []release) *reservation {
	r := &reservation{head: head, noFitSide: map[gangShape]int{}, limitVersion: -1}
	sorted := slices.Clone(releases)
	slices.SortFunc(sorted, func(a, b release) int { return a.at.Compare(b.at) })
	projected := slices.Clone(free)
	var total Resources
	for _, f := range projected {
		total = total.plus(f)
	}
	per, members := head.job.PerMember, head.job.Members
	for i := 0; i < len(sorted); {
		at := sorted[i].at
		for ; i < len(sorted) && sorted[i].at.Equal(at); i++ {
			for _, a := range sorted[i].alloc {
				projected[a.node] = projected[a.node].plus(sorted[i].per.times(a.members))
				total = total.plus(sorted[i].per.times(a.members))
			}
		}
		if per.times(members).countIn(total) < 1 || countSlots(projected, per, members) < members {
			continue
		}
		for _, a := range bestFit(projected, per, members, nil) {
			projected[a.node] = projected[a.node].minus(per.times(a.members))
		}
		r.known, r.start, r.extra = true, at, projected
		return r
	}
	return r
}

// endsInTime is whether a gang started now surely ends before the head's
// reserved start.
func (r *reservation) endsInTime(j *Job, now time.Time) bool {
	return r.known && j.MaxRuntime > 0 && !now.Add(j.MaxRuntime).After(r.start)
}

// fitBeside places a gang on what is free now and stays free at the head's
// start (so it cannot delay the head however long it runs), or returns nil.
func (r *reservation) fitBeside(f *fitter, per Resources, members int) []nodeMembers {
	if !r.known {
		return nil
	}
	key := gangShape{per}
	if n, ok := r.noFitSide[key]; ok && members >= n {
		return nil
	}
	if r.limitVersion != f.version || len(r.limit) != len(f.free) {
		if len(r.limit) != len(f.free) {
			r.limit = make([]Resources, len(f.free))
		}
		for i := range r.limit {
			r.limit[i] = f.free[i].min(r.extra[i])
		}
		r.limitVersion = f.version
	}
	var alloc []nodeMembers
	if countSlots(r.limit, per, members) >= members {
		alloc = bestFit(r.limit, per, members, nil)
	}
	if alloc == nil {
		if n, ok := r.noFitSide[key]; !ok || members < n {
			r.noFitSide[key] = members
		}
		return nil
	}
	for _, a := range alloc {
		r.extra[a.node] = r.extra[a.node].minus(per.times(a.members))
	}
	r.limitVersion = -1 // extra changed
	return alloc
}

// endOf is when a gang that starts at start ends, if it says.
func endOf(start time.Time, maxRuntime time.Duration, now time.Time) (time.Time, bool) {
	if maxRuntime <= 0 {
		return time.Time{}, false
	}
	// A gang past its MaxRuntime is about to be stopped: count it as ending now.
	return maxTime(start.Add(maxRuntime), now), true
}

func maxTime(a, b time.Time) time.Time {
	if !a.Before(b) {
		return a
	}
	return b
}
