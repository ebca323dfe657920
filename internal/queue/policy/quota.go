package policy

import (
	"fmt"
	"slices"
	"strings"
)

// UnknownQueueError is a job naming a queue the configuration lacks.
type UnknownQueueError struct {
	Queue  string
	Queues []string
}

func (e *UnknownQueueError) Error() string {
	return fmt.Sprintf("unknown queue %q (queues: %s)", e.Queue, strings.Join(e.Queues, ", "))
}

// Validate reports a configuration Decide cannot use.
func (c Config) Validate() error {
	seen := map[string]bool{}
	for _, q := range c.Queues {
		switch {
		case q.Name == "":
			return fmt.Errorf("a queue has no name")
		case seen[q.Name]:
			return fmt.Errorf("queue %q is declared twice", q.Name)
		case q.GPUs < 0:
			return fmt.Errorf("queue %q: gpus = %d; want 0 (no quota) or more", q.Name, q.GPUs)
		case q.Weight < 0:
			return fmt.Errorf("queue %q: weight = %g; want more than 0", q.Name, q.Weight)
		case q.Priority < 0:
			return fmt.Errorf("queue %q: priority = %d; want 0 (default) or more", q.Name, q.Priority)
		}
		seen[q.Name] = true
	}
	return nil
}

// queues is the declared queues, or the default queue when none is.
func (c Config) queues() []QueueConfig {
	if len(c.Queues) == 0 {
		return []QueueConfig{{Name: DefaultQueue, Borrow: true}}
	}
	return c.Queues
}

// QueueNames lists the queues jobs may name, sorted.
func (c Config) QueueNames() []string {
	var names []string
	for _, q := range c.queues() {
		names = append(names, q.Name)
	}
	slices.Sort(names)
	return names
}

// queueState is one queue's configuration and what it uses now.
type queueState struct {
	cfg   QueueConfig
	quota int // GPUs
	// unlimited: the config says 0, no quota; only capacity limits it.
	unlimited bool
	weight    float64
	used      Resources
	cohort    *cohortState
}

type cohortState struct {
	name        string
	quota, used int  // GPUs
	unlimited   bool // a queue in it has no quota
}

// ledger tracks queue and cohort use while Decide admits and preempts.
type ledger struct {
	queues   []queueState
	index    map[string]int
	capacity Resources // all nodes, less unmanaged use
}

func newLedger(cfg Config, capacity Resources) *ledger {
	l := &ledger{index: map[string]int{}, capacity: capacity}
	cohorts := map[string]*cohortState{}
	for _, qc := range cfg.queues() {
		q := queueState{cfg: qc, quota: qc.GPUs, unlimited: qc.GPUs == 0, weight: qc.Weight}
		if q.weight == 0 {
			q.weight = 1
		}
		co := cohorts[qc.Cohort]
		if co == nil {
			co = &cohortState{name: qc.Cohort}
			if co.name == "" {
				co.name = "default"
			}
			cohorts[qc.Cohort] = co
		}
		co.quota += q.quota
		co.unlimited = co.unlimited || q.unlimited
		q.cohort = co
		l.index[qc.Name] = len(l.queues)
		l.queues = append(l.queues, q)
	}
	return l
}

// lookup finds a job's queue.
func (l *ledger) lookup(cfg Config, name string) (int, error) {
	if name == "" {
		name = DefaultQueue
	}
	if i, ok := l.index[name]; ok {
		return i, nil
	}
	return 0, &UnknownQueueError{Queue: name, Queues: cfg.QueueNames()}
}

func (l *ledger) add(q int, r Resources) {
	l.queues[q].used = l.queues[q].used.plus(r)
	l.queues[q].cohort.used += r.GPUs
}

func (l *ledger) remove(q int, r Resources) { l.add(q, Resources{}.minus(r)) }

// quotaVerdict is whether a gang of some GPUs fits its queue's quota.
type quotaVerdict struct {
	ok       bool
	borrowed int // GPUs beyond the queue's own quota
	// cohortFull: borrowing is on but the cohort has nothing to lend.
	cohortFull bool
}

// checkQuota applies the quota rule with the queue's and cohort's use
// lowered by freedQueue and freedCohort GPUs (what preemption would free).
// Within its own quota a queue always may; beyond it, only with borrow on
// and only out of the cohort's idle quota. A queue over its quota (its
// quota was lowered) may not admit until its use falls back.
func (l *ledger) checkQuota(q, gpus, freedQueue, freedCohort int) quotaVerdict {
	qs := &l.queues[q]
	used := qs.used.GPUs - freedQueue
	if qs.unlimited || used+gpus <= qs.quota {
		return quotaVerdict{ok: true}
	}
	if !qs.cfg.Borrow {
		return quotaVerdict{}
	}
	if !qs.cohort.unlimited && qs.cohort.used-freedCohort+gpus > qs.cohort.quota {
		return quotaVerdict{cohortFull: true}
	}
	return quotaVerdict{ok: true, borrowed: min(gpus, used+gpus-qs.quota)}
}

// borrowing is true when a queue that may borrow uses more than its quota:
// the excess is on loan from the cohort, and reclaimable.
func (l *ledger) borrowing(q int, freed int) bool {
	qs := &l.queues[q]
	return qs.cfg.Borrow && !qs.unlimited && qs.used.GPUs-freed > qs.quota
}

// share is the queue's weighted dominant share: the largest fraction of
// any resource it uses, over its weight (DRF).
func (l *ledger) share(q int) float64 {
	qs := &l.queues[q]
	frac := func(used, capacity int) float64 {
		if capacity <= 0 {
			return 0
		}
		return float64(used) / float64(capacity)
	}
	s := max(frac(qs.used.GPUs, l.capacity.GPUs), frac(qs.used.CPUMHz, l.capacity.CPUMHz),
		frac(qs.used.MemoryMB, l.capacity.MemoryMB))
	return s / qs.weight
}
