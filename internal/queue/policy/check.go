package policy

import "fmt"

// CheckAdmissible is the submit-time check: it refuses, with the numbers,
// a job that could never start as configured — one whose queue does not
// exist, one larger than the whole (empty) cluster, one larger than its
// queue's quota with borrowing off, or than its cohort's quota with it on.
// nodes are the cluster's nodes; only their Capacity and Unmanaged count.
func CheckAdmissible(cfg Config, nodes []Node, job Job) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	var capacity Resources
	for _, n := range nodes {
		capacity = capacity.plus(n.Capacity.minus(n.Unmanaged))
	}
	l := newLedger(cfg, capacity)
	q, err := l.lookup(cfg, job.Queue)
	if err != nil {
		return err
	}
	return checkAgainst(l, emptyNodes(nodes), q, job)
}

// emptyNodes is what each node offers the queue when nothing runs.
func emptyNodes(nodes []Node) []Resources {
	empty := make([]Resources, len(nodes))
	for i, n := range nodes {
		empty[i] = n.Capacity.minus(n.Unmanaged)
	}
	return empty
}

// checkAgainst is CheckAdmissible once the queue is known.
func checkAgainst(l *ledger, empty []Resources, q int, job Job) error {
	if job.Members < 1 {
		return fmt.Errorf("job %s has %d members; want 1 or more", job.ID, job.Members)
	}
	if holds := countSlots(empty, job.PerMember, job.Members); holds < job.Members {
		largest := 0
		for _, r := range empty {
			largest = max(largest, r.GPUs)
		}
		if holds == 0 {
			return fmt.Errorf("job %s: each member needs %d GPUs, %d MHz CPU and %d MB memory on one node; no node has that (the largest has %d GPUs)",
				job.ID, job.PerMember.GPUs, job.PerMember.CPUMHz, job.PerMember.MemoryMB, largest)
		}
		return fmt.Errorf("job %s needs %d members × %d GPUs (%d GPUs); the whole cluster (%d nodes, %d GPUs) holds at most %d such members",
			job.ID, job.Members, job.PerMember.GPUs, job.GPUs(), len(empty), l.capacity.GPUs, holds)
	}
	qs := &l.queues[q]
	switch {
	case qs.unlimited:
	case !qs.cfg.Borrow && job.GPUs() > qs.quota:
		return fmt.Errorf("job %s needs %d GPUs; queue %s's quota is %d GPUs and borrowing is off",
			job.ID, job.GPUs(), qs.cfg.Name, qs.quota)
	case !qs.cohort.unlimited && job.GPUs() > qs.cohort.quota:
		return fmt.Errorf("job %s needs %d GPUs; queue %s may borrow, but its cohort %s has %d GPUs of quota in all",
			job.ID, job.GPUs(), qs.cfg.Name, qs.cohort.name, qs.cohort.quota)
	}
	return nil
}
