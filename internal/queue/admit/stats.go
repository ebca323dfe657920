package admit

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/gpujob/gpujob/internal/queue/queuefile"
)

// StatsFormat is the layout of the Stats record this package writes and
// reads; it fixes the latency buckets (LatencyBounds).
const StatsFormat = 1

// UndeclaredQueue is the Stats entry of the jobs whose queue the
// configuration does not declare (removed since they were submitted, or
// never declared) and of records too broken to name one. It is not a
// valid queue name, so it never clashes with a queue's.
const UndeclaredQueue = "_undeclared"

// MaxLatency bounds one observed admission latency: a record's
// submitted_at may lie far in the past, and one such record must not
// push the sum beyond what every reader can check.
const MaxLatency = 366 * 24 * time.Hour

// LatencyBounds are the upper bounds, in seconds, of the admission latency
// histogram's buckets (a last bucket, +Inf, follows): from a second to a
// day, as a queue's waits go.
func LatencyBounds() []float64 {
	return []float64{1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400}
}

// Stats is the admission controller's counters, per queue, at
// <state prefix>/stats (contract.QueueStatsKey). The leader writes it in
// the same transaction as the status changes it counts, so each change is
// counted exactly once across crashes and leader changes (tally.go). Only
// the controller's token writes there; readers (the exporter) still decode
// it strictly (DecodeStats).
type Stats struct {
	Format int `json:"format"`
	// Queues are the counters by queue name (or UndeclaredQueue).
	Queues map[string]*QueueStats `json:"queues"`
}

// QueueStats is one queue's counters since its first counted event.
type QueueStats struct {
	// Admissions counts registrations of the queue's jobs (a job
	// readmitted after a preemption counts again).
	Admissions uint64 `json:"admissions"`
	// Preemptions counts the queue's jobs stopped as victims: by a
	// preemptor, or by the partial-gang guard.
	Preemptions uint64 `json:"preemptions"`
	// Refusals counts the times one of the queue's jobs was refused.
	Refusals uint64 `json:"refusals"`
	// LatencyCounts counts admissions by latency bucket (LatencyBounds,
	// then +Inf; not cumulative): the seconds from a job's submission, or
	// from its requeue after a preemption, to its registration. They add
	// up to Admissions. LatencySumS is those latencies' sum in seconds.
	LatencyCounts []uint64 `json:"latency_counts"`
	LatencySumS   float64  `json:"latency_sum_s"`
}

// NewStats is an empty record.
func NewStats() *Stats { return &Stats{Format: StatsFormat, Queues: map[string]*QueueStats{}} }

// Queue is name's counters, added when absent.
func (s *Stats) Queue(name string) *QueueStats {
	q := s.Queues[name]
	if q == nil {
		q = &QueueStats{LatencyCounts: make([]uint64, len(LatencyBounds())+1)}
		s.Queues[name] = q
	}
	return q
}

// Clone is a deep copy.
func (s *Stats) Clone() *Stats {
	out := &Stats{Format: s.Format, Queues: make(map[string]*QueueStats, len(s.Queues))}
	for name, q := range s.Queues {
		cp := *q
		cp.LatencyCounts = slices.Clone(q.LatencyCounts)
		out.Queues[name] = &cp
	}
	return out
}

// Keep drops the queues that keep does not accept (a queue removed from
// the configuration), UndeclaredQueue excepted.
func (s *Stats) Keep(keep func(queue string) bool) {
	maps.DeleteFunc(s.Queues, func(name string, _ *QueueStats) bool { return name != UndeclaredQueue && !keep(name) })
}

// Admitted counts n (≥ 0) admissions, each after latency d (clamped to 0
// and MaxLatency).
func (q *QueueStats) Admitted(n int, d time.Duration) {
	if n <= 0 {
		return
	}
	d = min(max(d, 0), MaxLatency)
	sec := d.Seconds()
	bounds := LatencyBounds()
	i, _ := slices.BinarySearch(bounds, sec) // the first bound ≥ sec: Prometheus' le
	q.Admissions += uint64(n)
	q.LatencyCounts[i] += uint64(n)
	q.LatencySumS += float64(n) * sec
}

// Cumulative is the histogram as Prometheus counts it: for each bound of
// LatencyBounds, the admissions at most that long.
func (q *QueueStats) Cumulative() map[float64]uint64 {
	out := map[float64]uint64{}
	var n uint64
	for i, b := range LatencyBounds() {
		n += q.LatencyCounts[i]
		out[b] = n
	}
	return out
}

// Check reports a record that may not be believed.
func (s *Stats) Check() error {
	if s.Format != StatsFormat {
		return fmt.Errorf("format %d; this gpujob reads format %d", s.Format, StatsFormat)
	}
	if s.Queues == nil {
		return errors.New("no queues")
	}
	if len(s.Queues) > queuefile.MaxQueues+1 {
		return fmt.Errorf("%d queues; at most %d and %s", len(s.Queues), queuefile.MaxQueues, UndeclaredQueue)
	}
	for _, name := range slices.Sorted(maps.Keys(s.Queues)) {
		if name != UndeclaredQueue {
			if err := queuefile.CheckName(name); err != nil {
				return err
			}
		}
		if err := s.Queues[name].check(); err != nil {
			return fmt.Errorf("queue %s: %w", name, err)
		}
	}
	return nil
}

func (q *QueueStats) check() error {
	if q == nil {
		return errors.New("null")
	}
	if want := len(LatencyBounds()) + 1; len(q.LatencyCounts) != want {
		return fmt.Errorf("%d latency buckets; format %d has %d", len(q.LatencyCounts), StatsFormat, want)
	}
	var n uint64
	for _, c := range q.LatencyCounts {
		if n+c < n {
			return errors.New("latency counts overflow")
		}
		n += c
	}
	if n != q.Admissions {
		return fmt.Errorf("latency counts add up to %d, admissions are %d", n, q.Admissions)
	}
	if math.IsNaN(q.LatencySumS) || q.LatencySumS < 0 || q.LatencySumS > float64(q.Admissions)*MaxLatency.Seconds() {
		return fmt.Errorf("latency sum %g s: want 0 to %s per admission", q.LatencySumS, MaxLatency)
	}
	return nil
}

// EncodeStats is the record's stored form; it refuses a record Check
// refuses.
func EncodeStats(s *Stats) ([]byte, error) {
	if err := s.Check(); err != nil {
		return nil, fmt.Errorf("queue stats: %w", err)
	}
	return encode(s)
}

// DecodeStats reads a stored Stats record as strictly as a job record: at
// most MaxRecordBytes, one JSON object of exactly Stats' fields, values
// that pass Check.
func DecodeStats(b []byte) (*Stats, error) {
	var s Stats
	if err := decodeStrict(b, &s); err != nil {
		return nil, fmt.Errorf("not a queue stats record: %w", err)
	}
	if err := s.Check(); err != nil {
		return nil, fmt.Errorf("queue stats: %w", err)
	}
	return &s, nil
}
