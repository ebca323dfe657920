package policy

import (
	"time"
)

// decider is one Decide's working state.
type decider struct {
	cfg       Config
	now       time.Time
	nodeNames []string
	ledger    *ledger
	fit       *fitter
	running   []runningGang
	// releases are the ends of running and just-admitted gangs that have
	// a MaxRuntime; the head's reservation and the estimates use them.
	releases      []release
	preemptFailed map[preemptKey]int
	head          *reservation
	out           Decision
	waitingJobs   []*pendingJob // parallel to out.Waiting
}

// Decide admits what can start now, preempts what must stop for it, and
// explains why the rest waits. It costs O(pending × queues) to order,
// O(nodes) per gang it tries to fit (a cache answers repeats of a shape
// that did not fit in O(1)), and O(nodes log nodes) per admission.
//
// It fails only on a configuration Validate rejects; a pending job that can
// never start is put in Decision.Refused.
func Decide(s State) (Decision, error) {
	if err := s.Config.Validate(); err != nil {
		return Decision{}, err
	}
	d := newDecider(s)
	empty := emptyNodes(s.Nodes)
	pending := make([]*pendingJob, 0, len(s.Pending))
	jobs := make([]pendingJob, len(s.Pending))
	for i := range s.Pending {
		j := &s.Pending[i]
		q, err := d.ledger.lookup(s.Config, j.Queue)
		if err == nil {
			err = checkAgainst(d.ledger, empty, q, *j)
		}
		if err != nil {
			d.out.Refused = append(d.out.Refused, Refusal{Job: j.ID, Err: err})
			continue
		}
		jobs[i] = pendingJob{job: j, queue: q, rank: rankOf(*j, d.ledger.queues[q].cfg)}
		pending = append(pending, &jobs[i])
	}
	// Most of a long queue waits: size the lists once.
	d.out.Waiting = make([]Waiting, 0, len(pending))
	d.waitingJobs = make([]*pendingJob, 0, len(pending))
	pick := newPicker(d.ledger, pending, !s.Config.Disable.FairShare)
	for {
		p, line := pick.next()
		if p == nil {
			break
		}
		d.consider(p, line)
	}
	d.estimate()
	return d.out, nil
}

func newDecider(s State) *decider {
	d := &decider{cfg: s.Config, now: s.Now, preemptFailed: map[preemptKey]int{}}
	index := make(map[string]int, len(s.Nodes))
	free := make([]Resources, len(s.Nodes))
	var capacity Resources
	for i, n := range s.Nodes {
		index[n.Name] = i
		d.nodeNames = append(d.nodeNames, n.Name)
		free[i] = n.Capacity.minus(n.Unmanaged)
		capacity = capacity.plus(free[i])
	}
	d.ledger = newLedger(s.Config, capacity)
	d.running = make([]runningGang, len(s.Running))
	for i := range s.Running {
		r := &s.Running[i]
		g := runningGang{run: r, queue: -1, stopping: r.Stopping, atStake: gpuSecondsAtStake(r, s.Now)}
		if q, err := d.ledger.lookup(s.Config, r.Queue); err == nil {
			g.queue = q
			g.rank = rankOf(r.Job, d.ledger.queues[q].cfg)
			// A gang of a queue since removed still holds its nodes (counted
			// below) but no queue's quota.
			d.ledger.add(q, r.PerMember.times(r.Members))
		}
		for _, a := range r.Placement {
			n, ok := index[a.Node]
			if !ok {
				continue // its node left the cluster; it holds nothing we could give
			}
			g.alloc = append(g.alloc, nodeMembers{n, a.Members})
			free[n] = free[n].minus(r.PerMember.times(a.Members))
		}
		end, ok := endOf(r.StartedAt, r.MaxRuntime, s.Now)
		if r.Stopping {
			end, ok = s.Now, true
		}
		g.release = -1
		if ok {
			g.release = len(d.releases)
			d.releases = append(d.releases, release{at: end, alloc: g.alloc, per: r.PerMember, queue: g.queue, gpus: r.GPUs()})
		}
		d.running[i] = g
	}
	d.fit = newFitter(free)
	return d
}

// consider decides one pending job, in queue order.
func (d *decider) consider(p *pendingJob, line *queueLine) {
	j := p.job
	if line.heldBy != nil {
		d.wait(p, Waiting{Cause: CauseBehindInQueue, why: why{blocker: line.heldBy.job.ID}})
		return
	}
	if v := d.ledger.checkQuota(p.queue, j.GPUs(), 0, 0); !v.ok {
		if d.preempt(p) {
			return
		}
		// FIFO inside the queue: nothing of it overtakes a head that waits
		// for the queue's own quota, or large jobs would starve.
		line.heldBy = p
		cause := CauseQueueQuota
		if v.cohortFull {
			cause = CauseCohortFull
		}
		d.wait(p, Waiting{Cause: cause})
		return
	}
	if !d.fit.fits(j.PerMember, j.Members) {
		if d.preempt(p) {
			return
		}
		if d.head == nil {
			d.head = reserve(p, d.fit.free, d.releases)
		}
		d.wait(p, Waiting{Cause: CauseCapacity})
		return
	}
	if d.head == nil {
		d.admit(p, d.fit.take(j.PerMember, j.Members), false)
		return
	}
	// A head waits: only a gang that cannot delay it may start (backfill).
	if d.cfg.Disable.Backfill {
		d.wait(p, Waiting{Cause: CauseBehindHead, why: why{backfillOff: true}})
		return
	}
	if d.head.endsInTime(j, d.now) {
		d.admit(p, d.fit.take(j.PerMember, j.Members), true)
		return
	}
	if alloc := d.head.fitBeside(d.fit, j.PerMember, j.Members); alloc != nil {
		d.fit.consume(alloc, j.PerMember)
		d.admit(p, alloc, true)
		return
	}
	d.wait(p, Waiting{Cause: CauseBehindHead, why: why{noMaxRuntime: j.MaxRuntime <= 0}})
}

func (d *decider) admit(p *pendingJob, alloc []nodeMembers, backfilled bool) {
	j := p.job
	v := d.ledger.checkQuota(p.queue, j.GPUs(), 0, 0)
	d.ledger.add(p.queue, j.PerMember.times(j.Members))
	d.out.Admit = append(d.out.Admit, Admission{
		Job:          j.ID,
		Placement:    placement(alloc, d.nodeNames),
		BorrowedGPUs: v.borrowed,
		Backfilled:   backfilled,
	})
	if end, ok := endOf(d.now, j.MaxRuntime, d.now); ok {
		d.releases = append(d.releases, release{at: end, alloc: alloc, per: j.PerMember, queue: p.queue, gpus: j.GPUs()})
	}
}
