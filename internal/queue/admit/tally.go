package admit

import (
	"encoding/json"
	"fmt"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
)

// The counters (Stats) are never incremented on their own: a status write
// that records an admission, a preemption or a refusal carries, in the same
// leader-checked transaction, a check-and-set of the stats key with the
// counts it adds. What is counted is the difference between the status as
// stored and the status written, so:
//
//   - the transaction commits both or neither: a counter never moves without
//     the status change it counts;
//   - a change committed once is in the stored status the next leader reads:
//     it is not counted again after a crash, a lost answer or a new leader;
//   - a deposed leader cannot write (the leader check), and two rounds
//     cannot both add to the same stored counters (the check-and-set): the
//     loser's transaction fails whole, and its round starts over.

// tally collects what a transaction's status writes count: a copy of the
// round's stats, made at the first change.
type tally struct {
	r    *round
	next *Stats
}

// change is what a status change counts.
type change struct {
	admitted, preempted int
	refused             bool
}

// diff is what e's status change (stored → e.st) counts; ok is false when
// it counts nothing.
func diff(e *entry) (c change, ok bool) {
	st := e.st
	if st.Admissions == 0 && st.Preemptions == 0 && st.State != StateRefused {
		return c, false // nothing a difference could count
	}
	old := &Status{} // no status of this record stored: nothing counted yet
	if e.stored != nil {
		prev, err := DecodeStatus(e.stored)
		switch {
		case err != nil:
			// Unreadable (load rebuilt it from Nomad): what it counted is
			// unknown, and guessing could count twice. Not counted.
			return c, false
		case prev.RecordIndex == st.RecordIndex:
			old = prev
		}
	}
	c = change{admitted: max(st.Admissions-old.Admissions, 0), preempted: max(st.Preemptions-old.Preemptions, 0),
		refused: st.State == StateRefused && old.State != StateRefused}
	return c, c.admitted > 0 || c.preempted > 0 || c.refused
}

// counts reports whether e's status change counts anything.
func (t *tally) counts(e *entry) bool {
	_, ok := diff(e)
	return ok
}

// add counts e's status change into the copy of the round's stats (made
// at the first change, without the queues the configuration no longer
// declares).
func (t *tally) add(e *entry) {
	c, ok := diff(e)
	if !ok {
		return
	}
	r, st := t.r, e.st
	if t.next == nil {
		t.next = r.stats.Clone()
		t.next.Keep(func(q string) bool { return r.declared[q] })
	}
	q := t.next.Queue(r.statsQueue(e))
	if c.admitted > 0 && e.rec != nil {
		since := e.rec.SubmittedAt
		if st.QueuedAt != nil {
			since = *st.QueuedAt
		}
		at := r.now
		if st.AdmittedAt != nil {
			at = *st.AdmittedAt
		}
		q.Admitted(c.admitted, at.Sub(since))
	}
	q.Preemptions += uint64(c.preempted)
	if c.refused {
		q.Refusals++
	}
}

// op is the stats' check-and-set, nil when nothing was counted.
func (t *tally) op() (*api.TxnOp, error) {
	if t.next == nil {
		return nil, nil
	}
	b, err := EncodeStats(t.next)
	if err != nil {
		return nil, err
	}
	return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: t.r.c.statsKey(), Value: b, Index: t.r.statsIndex}}, nil
}

// commit makes the counted stats the round's, once their transaction
// committed with these results.
func (t *tally) commit(results api.TxnResults) {
	if t.next == nil {
		return
	}
	for _, res := range results {
		if res.KV != nil && res.KV.Key == t.r.c.statsKey() {
			t.r.stats, t.r.statsIndex = t.next, res.KV.ModifyIndex
		}
	}
	t.next = nil
}

// loadStats reads the stored counters, consistently. An unreadable
// record (written by a newer gpujob, or damaged) is logged and replaced by
// fresh counters at its next write: Prometheus takes counters that start
// over as a reset.
func (r *round) loadStats() error {
	r.stats, r.statsIndex = NewStats(), 0
	p, _, err := r.c.Consul.KV().Get(r.c.statsKey(), (&api.QueryOptions{RequireConsistent: true}).WithContext(r.ctx))
	if err != nil {
		return fmt.Errorf("reading %s: %w", r.c.statsKey(), err)
	}
	if p == nil {
		return nil
	}
	r.statsIndex = p.ModifyIndex
	s, err := DecodeStats(p.Value)
	if err != nil {
		r.c.logf("%s: %v: its counters start over at the next admission, preemption or refusal", r.c.statsKey(), err)
		return nil
	}
	r.stats = s
	return nil
}

// statsQueue is the queue e's counts go to: its record's, or
// UndeclaredQueue when the configuration does not declare it.
func (r *round) statsQueue(e *entry) string {
	if r.declared[e.queue] {
		return e.queue
	}
	return UndeclaredQueue
}

// RecordQueue is the queue of a record (rec as decoded, nil when it could
// not be; raw as stored), as the controller's counters count it: the
// default queue when it names none. An invalid record still counts in the
// queue it names, when it names a valid one, so its refusal shows there;
// one that names none readable is UndeclaredQueue's.
func RecordQueue(rec *JobRecord, raw []byte) string {
	if rec != nil {
		return orDefault(rec.Queue, policy.DefaultQueue)
	}
	var loose struct {
		Queue string `json:"queue"`
	}
	if len(raw) > MaxRecordBytes || json.Unmarshal(raw, &loose) != nil {
		return UndeclaredQueue
	}
	if loose.Queue == "" {
		return policy.DefaultQueue
	}
	if queuefile.CheckName(loose.Queue) != nil {
		return UndeclaredQueue
	}
	return loose.Queue
}
