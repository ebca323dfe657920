package policy

import (
	"fmt"
	"strings"
	"time"
)

// Cause is the kind of thing a pending job waits for.
type Cause int

const (
	// CauseCapacity: its queue may have the GPUs, but no set of nodes has
	// room for every member now.
	CauseCapacity Cause = iota + 1
	// CauseQueueQuota: its queue uses its quota and may not borrow.
	CauseQueueQuota
	// CauseCohortFull: its queue uses its quota and its cohort has no idle
	// quota to lend.
	CauseCohortFull
	// CauseBehindInQueue: an earlier job of its queue waits for quota.
	CauseBehindInQueue
	// CauseBehindHead: it fits, but starting it could delay the first job
	// waiting for capacity (or backfill is off).
	CauseBehindHead
	// CausePreemptionPending: its victims are being stopped; it starts when
	// they have.
	CausePreemptionPending
)

// Waiting is a pending job that does not start now.
type Waiting struct {
	Job   string
	Queue string
	// Position is its place among waiting jobs, from 1, in the order they
	// were considered.
	Position int
	Cause    Cause
	// EstimatedStart is zero when it cannot be estimated (gangs it waits
	// for have no MaxRuntime). The estimate replays the queue in order,
	// assuming every gang runs its full MaxRuntime and nothing overtakes
	// (no backfill); it counts GPUs, not the nodes they are on, except for
	// the first job waiting for capacity, whose reservation is per node.
	EstimatedStart time.Time
	why            why
}

// why is what the Reason sentence is made of, captured when the job was
// considered so that Reason costs nothing unless it is asked for.
type why struct {
	now                     time.Time
	gpus, members, perGPU   int
	queueUsed, queueQuota   int
	borrow                  bool
	cohort                  string
	cohortUsed, cohortQuota int
	freeGPUs                int
	blocker                 string
	head                    *reservation
	noMaxRuntime            bool
	backfillOff             bool
	victims                 []string
}

// Reason says in plain words why the job waits, e.g. "3 jobs ahead;
// team-a uses 8 of its 8 GPUs; borrowing off".
func (w Waiting) Reason() string {
	y := w.why
	var b strings.Builder
	switch w.Position {
	case 0, 1:
		b.WriteString("first in line; ")
	case 2:
		b.WriteString("1 job ahead; ")
	default:
		fmt.Fprintf(&b, "%d jobs ahead; ", w.Position-1)
	}
	switch w.Cause {
	case CauseCapacity:
		fmt.Fprintf(&b, "needs %d × %d GPUs, each on one node, and they do not fit now (%d GPUs free)",
			y.members, y.perGPU, y.freeGPUs)
		if y.head != nil && y.head.head.job.ID == w.Job {
			if y.head.known {
				fmt.Fprintf(&b, "; GPUs reserved for it %s", inTime(y.now, y.head.start))
			} else {
				b.WriteString("; its start cannot be estimated (the GPUs it needs are held by jobs without max_runtime)")
			}
		}
	case CauseQueueQuota:
		fmt.Fprintf(&b, "%s uses %d of its %d GPUs and needs %d more; borrowing off", w.Queue, y.queueUsed, y.queueQuota, y.gpus)
	case CauseCohortFull:
		fmt.Fprintf(&b, "%s uses %d of its %d GPUs and needs %d more; cohort %s has none idle to lend (uses %d of %d)",
			w.Queue, y.queueUsed, y.queueQuota, y.gpus, y.cohort, y.cohortUsed, y.cohortQuota)
	case CauseBehindInQueue:
		fmt.Fprintf(&b, "behind job %s, which waits for queue %s's quota", y.blocker, w.Queue)
	case CauseBehindHead:
		head := y.head.head.job.ID
		switch {
		case y.backfillOff:
			fmt.Fprintf(&b, "behind job %s, which waits for GPUs (backfill off)", head)
		case !y.head.known:
			fmt.Fprintf(&b, "behind job %s, whose start cannot be estimated, so nothing starts ahead of it", head)
		case y.noMaxRuntime:
			fmt.Fprintf(&b, "has no max_runtime, so it does not start ahead of job %s, which waits for GPUs (reserved %s)",
				head, inTime(y.now, y.head.start))
		default:
			fmt.Fprintf(&b, "would delay job %s, which waits for GPUs (reserved %s)", head, inTime(y.now, y.head.start))
		}
	case CausePreemptionPending:
		fmt.Fprintf(&b, "starts when the jobs it preempts have stopped: %s", strings.Join(y.victims, ", "))
	}
	return b.String()
}

func inTime(now, at time.Time) string {
	if !at.After(now) {
		return "now"
	}
	return "in " + at.Sub(now).Round(time.Minute).String()
}

// wait records p as waiting, with the numbers its reason needs. It fills
// the entry in place: on a long queue this runs for nearly every job.
func (d *decider) wait(p *pendingJob, w Waiting) {
	d.out.Waiting = append(d.out.Waiting, w)
	d.waitingJobs = append(d.waitingJobs, p)
	out := &d.out.Waiting[len(d.out.Waiting)-1]
	j := p.job
	q := &d.ledger.queues[p.queue]
	out.Job, out.Queue, out.Position = j.ID, q.cfg.Name, len(d.out.Waiting)
	y := &out.why
	y.now, y.gpus, y.members, y.perGPU = d.now, j.GPUs(), j.Members, j.PerMember.GPUs
	y.freeGPUs, y.head = d.fit.totalFree.GPUs, d.head
	if w.Cause == CauseQueueQuota || w.Cause == CauseCohortFull {
		y.queueUsed, y.queueQuota, y.borrow = q.used.GPUs, q.quota, q.cfg.Borrow
		y.cohort, y.cohortUsed, y.cohortQuota = q.cohort.name, q.cohort.used, q.cohort.quota
	}
}

// estimate fills in EstimatedStart: it replays the waiting jobs in order
// against the releases to come (O(waiting × log releases)). A job starts
// at the first time enough GPUs are free in the cluster, and in its queue
// when it may not borrow; its own end is a release for the jobs behind it.
// When the releases to come can never free enough, the start is unknown.
func (d *decider) estimate() {
	nq := len(d.ledger.queues)
	free := d.fit.totalFree.GPUs
	queueFree := make([]int, nq)
	for i, q := range d.ledger.queues {
		queueFree[i] = q.quota - q.used.GPUs
	}
	pendingRelease, pendingReleaseBy := 0, make([]int, nq)
	h := make(releaseHeap, 0, len(d.releases))
	for _, r := range d.releases {
		if r.gpus == 0 {
			continue
		}
		h = append(h, releaseAt{at: r.at, queue: r.queue, gpus: r.gpus})
		pendingRelease += r.gpus
		if r.queue >= 0 {
			pendingReleaseBy[r.queue] += r.gpus
		}
	}
	h.init()
	clock := d.now
	for i := range d.out.Waiting {
		w := &d.out.Waiting[i]
		p := d.waitingJobs[i]
		if w.Cause == CausePreemptionPending {
			w.EstimatedStart = d.now // its GPUs are booked; it waits only for the victims to stop
			continue
		}
		gpus, q := p.job.GPUs(), p.queue
		capped := !d.ledger.queues[q].cfg.Borrow && !d.ledger.queues[q].unlimited
		if free+pendingRelease < gpus || (capped && queueFree[q]+pendingReleaseBy[q] < gpus) {
			continue // unknown
		}
		for free < gpus || (capped && queueFree[q] < gpus) {
			r := h.pop()
			clock = maxTime(clock, r.at)
			free += r.gpus
			pendingRelease -= r.gpus
			if r.queue >= 0 {
				queueFree[r.queue] += r.gpus
				pendingReleaseBy[r.queue] -= r.gpus
			}
		}
		start := clock
		if d.head != nil && d.head.head == p && d.head.known {
			start = maxTime(start, d.head.start)
		}
		w.EstimatedStart = start
		free -= gpus
		queueFree[q] -= gpus
		if end, ok := endOf(start, p.job.MaxRuntime, start); ok {
			h.push(releaseAt{at: end, queue: q, gpus: gpus})
			pendingRelease += gpus
			pendingReleaseBy[q] += gpus
		}
	}
}

// releaseAt is what estimate needs of a release: small, so that the heap
// moves little.
type releaseAt struct {
	at          time.Time
	queue, gpus int
}

// releaseHeap orders releases by time, earliest first. It is
// container/heap's algorithm, step for step (releases at the same time
// leave in the same order), on a typed slice: no interface boxing per
// push and pop, which dominated estimate over 10,000 waiting jobs.
type releaseHeap []releaseAt

func (h releaseHeap) less(i, k int) bool { return h[i].at.Before(h[k].at) }

func (h releaseHeap) init() {
	n := len(h)
	for i := n/2 - 1; i >= 0; i-- {
		h.down(i, n)
	}
}

func (h *releaseHeap) push(r releaseAt) {
	*h = append(*h, r)
	h.up(len(*h) - 1)
}

func (h *releaseHeap) pop() releaseAt {
	old := *h
	n := len(old) - 1
	old[0], old[n] = old[n], old[0]
	old.down(0, n)
	r := old[n]
	*h = old[:n]
	return r
}

func (h releaseHeap) up(j int) {
	for {
		i := (j - 1) / 2 // parent
		if i == j || !h.less(j, i) {
			break
		}
		h[i], h[j] = h[j], h[i]
		j = i
	}
}

func (h releaseHeap) down(i, n int) {
	for {
		j1 := 2*i + 1
		if j1 >= n || j1 < 0 { // j1 < 0 after int overflow
			break
		}
		j := j1 // left child
		if j2 := j1 + 1; j2 < n && h.less(j2, j1) {
			j = j2 // right child
		}
		if !h.less(j, i) {
			break
		}
		h[i], h[j] = h[j], h[i]
		i = j
	}
}
