package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
)

// collectQueues exports each queue's summary under the label queue. The
// names come from Consul's queue configuration, checked there already;
// one that is not a queue name (nor admit.UndeclaredQueue) is still left
// out, so nothing odd ever becomes a label value.
func collectQueues(ch chan<- prometheus.Metric, queues []observe.QueueSummary, now time.Time) {
	for _, q := range queues {
		if q.Name != admit.UndeclaredQueue && queuefile.CheckName(q.Name) != nil {
			continue
		}
		n := q.Name
		ch <- gauge(queueQuota, float64(q.QuotaGPUs), n)
		ch <- gauge(queueUsed, float64(q.UsedGPUs), n)
		ch <- gauge(queueBorrowed, float64(q.BorrowedGPUs), n)
		ch <- gauge(queueWaitingJobs, float64(q.WaitingJobs), n)
		ch <- gauge(queueWaitingGPUs, float64(q.WaitingGPUs), n)
		wait := 0.0
		if q.OldestWaitSince != nil {
			wait = max(now.Sub(*q.OldestWaitSince).Seconds(), 0)
		}
		ch <- gauge(queueOldestWait, wait, n)
		ch <- gauge(queuePreempted, float64(q.PreemptedJobs), n)
		ch <- gauge(queueRefused, float64(q.RefusedJobs), n)
		if c := q.Counters; c != nil {
			ch <- counter(queueAdmissions, float64(c.Admissions), n)
			ch <- counter(queuePreemptions, float64(c.Preemptions), n)
			ch <- counter(queueRefusals, float64(c.Refusals), n)
			ch <- prometheus.MustNewConstHistogram(queueLatency, c.Admissions, c.LatencySumS, c.Cumulative(), n)
		}
	}
}
