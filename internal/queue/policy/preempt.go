package policy

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// runningGang is a running gang with what preemption needs, computed once.
type runningGang struct {
	run   *Running
	queue int // -1 when its queue is no longer configured
	rank  rank
	alloc []nodeMembers
	// atStake is the work lost if it is stopped now, in GPU-seconds.
	atStake float64
	// victim is set once this Decide gave its GPUs to a preemptor.
	victim bool
	// stopping: an earlier Decision (or a user) stops it; its GPUs are as
	// good as free to a preemptor, at no cost, and it is not preempted again.
	stopping bool
	// release is its index in decider.releases, -1 when it has none.
	release int
}

// gpuSecondsAtStake is GPUs × seconds since the gang started or last
// checkpointed, whichever is later: what preempting it now throws away.
func gpuSecondsAtStake(r *Running, now time.Time) float64 {
	since := r.StartedAt
	if r.LastCheckpoint.After(since) {
		since = r.LastCheckpoint
	}
	secs := max(now.Sub(since).Seconds(), 0)
	return float64(r.GPUs()) * secs
}

// victimChoice is one gang chosen for one preemptor, and why.
type victimChoice struct {
	gang    *runningGang
	reclaim bool // its queue borrows and the preemptor's queue reclaims
}

// preemptKey is what a failed preemption depends on. Within one Decide the
// candidates only shrink, so a gang of the same queue, shape and rank with
// as many members or more fails too.
type preemptKey struct {
	queue int
	per   Resources
	rank  rank
}

// chooseVictims finds the whole gangs to stop so that p can start, with
// the fewest GPU-seconds at stake, or nil. Eligible: lower-ranked gangs of
// p's own queue; and, when p's queue would stay within its own quota,
// gangs of its cohort's queues that borrow (while they still do).
//
// It is greedy, not optimal (the exact problem is a knapsack over bins):
// cheapest first — and, among equally cheap, the larger first — until p
// fits, then it drops every chosen gang p fits without, dearest first.
func (d *decider) chooseVictims(p *pendingJob) []victimChoice {
	if d.cfg.Disable.Preemption {
		return nil
	}
	key := preemptKey{p.queue, p.job.PerMember, p.rank}
	if n, ok := d.preemptFailed[key]; ok && p.job.Members >= n {
		return nil
	}
	fail := func() []victimChoice {
		if n, ok := d.preemptFailed[key]; !ok || p.job.Members < n {
			d.preemptFailed[key] = p.job.Members
		}
		return nil
	}
	q := &d.ledger.queues[p.queue]
	gpus := p.job.GPUs()
	mayReclaim := !q.unlimited && q.used.GPUs+gpus <= q.quota
	var cands []victimChoice
	reachable := d.fit.totalFree.GPUs
	for i := range d.running {
		g := &d.running[i]
		switch {
		case g.victim:
			continue
		case g.stopping:
			cands = append(cands, victimChoice{gang: g})
		case g.queue < 0:
			continue
		case g.queue == p.queue && g.rank.compare(p.rank) < 0:
			cands = append(cands, victimChoice{gang: g})
		case mayReclaim && g.queue != p.queue && d.ledger.queues[g.queue].cohort == q.cohort &&
			d.ledger.borrowing(g.queue, 0):
			cands = append(cands, victimChoice{gang: g, reclaim: true})
		default:
			continue
		}
		reachable += g.run.GPUs()
	}
	if reachable < gpus {
		return fail()
	}
	slices.SortFunc(cands, func(a, b victimChoice) int {
		if a.gang.stopping != b.gang.stopping {
			if a.gang.stopping {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(a.gang.atStake, b.gang.atStake); c != 0 {
			return c
		}
		if c := cmp.Compare(b.gang.run.GPUs(), a.gang.run.GPUs()); c != 0 {
			return c
		}
		if c := a.gang.rank.compare(b.gang.rank); c != 0 {
			return c
		}
		return cmp.Compare(a.gang.run.ID, b.gang.run.ID)
	})

	trial := newVictimSet(d, p)
	var chosen []victimChoice
	feasible := false
	for _, c := range cands {
		if c.reclaim && !d.ledger.borrowing(c.gang.queue, trial.freedBy[c.gang.queue]) {
			continue // that queue is back within its quota: nothing left to reclaim
		}
		trial.add(c.gang, +1)
		chosen = append(chosen, c)
		if feasible = trial.feasible(); feasible {
			break
		}
	}
	if !feasible {
		return fail()
	}
	for i := len(chosen) - 1; i >= 0; i-- {
		trial.add(chosen[i].gang, -1)
		if trial.feasible() {
			chosen = slices.Delete(chosen, i, i+1)
			continue
		}
		trial.add(chosen[i].gang, +1)
	}
	return chosen
}

// victimSet is the free space and quota use as if some gangs were stopped.
type victimSet struct {
	d                       *decider
	p                       *pendingJob
	freed                   []Resources // per node, by the victims
	free                    []Resources // per node: free now + freed
	totalFree               Resources
	freedQueue, freedCohort int
	freedBy                 map[int]int // GPUs freed per queue
}

func newVictimSet(d *decider, p *pendingJob) *victimSet {
	return &victimSet{d: d, p: p, freed: make([]Resources, len(d.fit.free)),
		free: slices.Clone(d.fit.free), totalFree: d.fit.totalFree, freedBy: map[int]int{}}
}

// add adds (sign +1) or removes (-1) a gang from the set.
func (s *victimSet) add(g *runningGang, sign int) {
	for _, a := range g.alloc {
		r := g.run.PerMember.times(a.members * sign)
		s.freed[a.node] = s.freed[a.node].plus(r)
		s.free[a.node] = s.free[a.node].plus(r)
		s.totalFree = s.totalFree.plus(r)
	}
	gpus := g.run.GPUs() * sign
	if g.queue < 0 {
		return // counted in no queue's quota
	}
	s.freedBy[g.queue] += gpus
	if s.d.ledger.queues[g.queue].cohort == s.d.ledger.queues[s.p.queue].cohort {
		s.freedCohort += gpus
	}
	if g.queue == s.p.queue {
		s.freedQueue += gpus
	}
}

func (s *victimSet) feasible() bool {
	j := s.p.job
	if !s.d.ledger.checkQuota(s.p.queue, j.GPUs(), s.freedQueue, s.freedCohort).ok {
		return false
	}
	return j.PerMember.times(j.Members).countIn(s.totalFree) >= 1 &&
		countSlots(s.free, j.PerMember, j.Members) >= j.Members
}

// preempt chooses victims for p and, when there are some, books them:
// the victims leave the ledger, p takes its place out of what they free
// (and only what it needs from free space, which therefore never grows
// in a Decide), and the Decision names them. It reports whether it did.
func (d *decider) preempt(p *pendingJob) bool {
	chosen := d.chooseVictims(p)
	if chosen == nil {
		return false
	}
	trial := newVictimSet(d, p)
	prefer := make([]bool, len(trial.free))
	for _, c := range chosen {
		trial.add(c.gang, +1)
		for _, a := range c.gang.alloc {
			prefer[a.node] = true
		}
	}
	j := p.job
	alloc := bestFit(trial.free, j.PerMember, j.Members, prefer)
	d.fit.version++
	for _, a := range alloc {
		use := j.PerMember.times(a.members)
		fromFree := use.minus(use.min(trial.freed[a.node]))
		d.fit.free[a.node] = d.fit.free[a.node].minus(fromFree)
		d.fit.totalFree = d.fit.totalFree.minus(fromFree)
	}
	var names []string
	for _, c := range chosen {
		c.gang.victim = true
		if c.gang.release >= 0 {
			// Its GPUs go to p, whose own end is a release below.
			d.releases[c.gang.release] = release{}
		}
		names = append(names, c.gang.run.ID)
		if c.gang.queue >= 0 {
			d.ledger.remove(c.gang.queue, c.gang.run.PerMember.times(c.gang.run.Members))
		}
		if c.gang.stopping {
			continue // already on its way out: nothing new to stop
		}
		d.out.Preempt = append(d.out.Preempt, Preemption{
			Victim:     c.gang.run.ID,
			Preemptor:  j.ID,
			GPUSeconds: c.gang.atStake,
			Reason:     d.preemptReason(p, c),
		})
	}
	d.ledger.add(p.queue, j.PerMember.times(j.Members))
	if end, ok := endOf(d.now, j.MaxRuntime, d.now); ok {
		d.releases = append(d.releases, release{at: end, alloc: alloc, per: j.PerMember, queue: p.queue, gpus: j.GPUs()})
	}
	d.wait(p, Waiting{Cause: CausePreemptionPending, why: why{victims: names}})
	return true
}

// preemptReason says in plain words why a victim is stopped.
func (d *decider) preemptReason(p *pendingJob, c victimChoice) string {
	v := c.gang
	if c.reclaim {
		return fmt.Sprintf("queue %s reclaims %d GPUs lent to %s (for %s %s)",
			d.ledger.queues[p.queue].cfg.Name, v.run.GPUs(), d.ledger.queues[v.queue].cfg.Name, p.job.Kind, p.job.ID)
	}
	if p.rank.class != v.rank.class {
		return fmt.Sprintf("preempted by %s %s (%s class outranks %s)", p.job.Kind, p.job.ID,
			Class(p.rank.class), Class(v.rank.class))
	}
	return fmt.Sprintf("preempted by %s %s (priority %d > %d)", p.job.Kind, p.job.ID, p.rank.priority, v.rank.priority)
}
