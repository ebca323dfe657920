package top

import (
	"fmt"
	"strings"

	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/internal/queue/admit"
)

// queuesSection is the QUEUES section: one row per queue of the applied
// queue configuration (quota, GPUs used and borrowed, jobs and GPUs
// waiting for admission, the oldest wait), and ok false when the cluster
// has no queue configuration (or it could not be read): no section then.
func (m *Model) queuesSection() (sec section, ok bool) {
	s := m.snap
	if len(s.Queues) == 0 {
		return sec, false
	}
	jobs := 0
	names := make([]string, 0, len(s.Queues))
	for _, q := range s.Queues {
		jobs += q.WaitingJobs
		names = append(names, queueName(q))
	}
	sec.title = fmt.Sprintf("QUEUES  %d, %d jobs waiting for admission", len(s.Queues), jobs)
	nw := nameWidth(names)
	for i, q := range s.Queues {
		quota := "no quota"
		switch {
		case !q.Declared:
			quota = "-"
		case q.QuotaGPUs > 0:
			quota = fmt.Sprintf("quota %d", q.QuotaGPUs)
		}
		used := fmt.Sprintf("used %d", q.UsedGPUs)
		if q.BorrowedGPUs > 0 {
			used += fmt.Sprintf(" (%d borrowed)", q.BorrowedGPUs)
		}
		row := fmt.Sprintf("  %s  %-9s  %-20s  waiting %d jobs / %d GPUs", pad(names[i], nw), quota, used, q.WaitingJobs, q.WaitingGPUs)
		if q.OldestWaitSince != nil {
			row += "  oldest " + duration(s.Taken.Sub(*q.OldestWaitSince))
		}
		var extra []string
		if q.PreemptedJobs > 0 {
			extra = append(extra, fmt.Sprintf("%d preempted", q.PreemptedJobs))
		}
		if q.RefusedJobs > 0 {
			extra = append(extra, fmt.Sprintf("%d refused", q.RefusedJobs))
		}
		if len(extra) > 0 {
			row += "  " + strings.Join(extra, ", ")
		}
		sec.rows = append(sec.rows, row)
	}
	return sec, true
}

// queueName is how a queue is named in its row.
func queueName(q observe.QueueSummary) string {
	if q.Name == admit.UndeclaredQueue {
		return "(not declared)"
	}
	return q.Name
}
