package policy

import (
	"cmp"
	"slices"
)

// rank orders gangs by importance: class first, then priority.
type rank struct{ class, priority int }

func (r rank) compare(o rank) int {
	if c := cmp.Compare(r.class, o.class); c != 0 {
		return c
	}
	return cmp.Compare(r.priority, o.priority)
}

// rankOf is a job's effective class and priority: a service is in the
// service class unless it says otherwise; a job without a priority takes
// its queue's, and then DefaultPriority.
func rankOf(j Job, q QueueConfig) rank {
	class := j.Class
	if class == ClassFromKind {
		class = ClassBatch
		if j.Kind == KindService {
			class = ClassService
		}
	}
	p := j.Priority
	if p == 0 {
		p = q.Priority
	}
	if p == 0 {
		p = DefaultPriority
	}
	return rank{int(class), p}
}

// pendingJob is a pending job with what ordering needs, computed once.
type pendingJob struct {
	job   *Job
	queue int
	rank  rank
}

// before is the order inside one queue: nominated first, then rank, then
// FIFO (ID breaks ties so the order is total and repeatable).
func (a *pendingJob) before(b *pendingJob) int {
	if a.job.Nominated != b.job.Nominated {
		if a.job.Nominated {
			return -1
		}
		return 1
	}
	if c := b.rank.compare(a.rank); c != 0 {
		return c
	}
	if c := a.job.SubmittedAt.Compare(b.job.SubmittedAt); c != 0 {
		return c
	}
	return cmp.Compare(a.job.ID, b.job.ID)
}

// queueLine is one queue's pending jobs in order, and how far Decide got.
type queueLine struct {
	jobs []*pendingJob
	next int
	// heldBy is the job at this queue's head that waits for quota; while
	// set, the rest of the queue waits behind it.
	heldBy *pendingJob
}

// picker merges the queues' lines: each step takes the best head, so only
// the queues' heads are compared (O(queues) per step) and nothing is
// re-sorted as admissions change the queues' shares.
type picker struct {
	lines     []queueLine
	ledger    *ledger
	fairShare bool
}

func newPicker(l *ledger, jobs []*pendingJob, fairShare bool) *picker {
	p := &picker{lines: make([]queueLine, len(l.queues)), ledger: l, fairShare: fairShare}
	for _, j := range jobs {
		p.lines[j.queue].jobs = append(p.lines[j.queue].jobs, j)
	}
	for i := range p.lines {
		slices.SortFunc(p.lines[i].jobs, (*pendingJob).before)
	}
	return p
}

// next returns the next job in the merged order, and its line.
func (p *picker) next() (*pendingJob, *queueLine) {
	best := -1
	for i := range p.lines {
		if p.lines[i].next >= len(p.lines[i].jobs) {
			continue
		}
		if best < 0 || p.ahead(i, best) {
			best = i
		}
	}
	if best < 0 {
		return nil, nil
	}
	line := &p.lines[best]
	j := line.jobs[line.next]
	line.next++
	return j, line
}

// ahead is whether line a's head goes before line b's. Between equal
// ranks the queue with the smaller weighted share goes first (fair share);
// with fair share off, or equal shares, the older submission.
func (p *picker) ahead(a, b int) bool {
	ja, jb := p.lines[a].jobs[p.lines[a].next], p.lines[b].jobs[p.lines[b].next]
	if ja.job.Nominated != jb.job.Nominated {
		return ja.job.Nominated
	}
	if c := ja.rank.compare(jb.rank); c != 0 {
		return c > 0
	}
	if p.fairShare {
		if sa, sb := p.ledger.share(a), p.ledger.share(b); sa != sb {
			return sa < sb
		}
	}
	return ja.before(jb) < 0
}
