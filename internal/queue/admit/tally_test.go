package admit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// stats reads the stored counters (nil when none) and their index.
func (f *fixture) stats() (*Stats, uint64) {
	f.t.Helper()
	p, _, err := f.client.KV().Get(f.c.statsKey(), nil)
	if err != nil {
		f.t.Fatal(err)
	}
	if p == nil {
		return nil, 0
	}
	s, err := DecodeStats(p.Value)
	if err != nil {
		f.t.Fatalf("stats: %v", err)
	}
	return s, p.ModifyIndex
}

// queueStats is one queue's stored counters (zero when none).
func (f *fixture) queueStats(q string) QueueStats {
	f.t.Helper()
	s, _ := f.stats()
	if s == nil || s.Queues[q] == nil {
		return QueueStats{}
	}
	return *s.Queues[q]
}

// The leader counts per queue what its statuses record: admissions with
// their latency from submission (or from the requeue after a preemption),
// preemptions of the queue's jobs, and refusals (in the queue named, or
// the undeclared one); an idle round counts and writes nothing.
func TestStatsCountWhatTheStatusesRecord(t *testing.T) {
	f := newFixture(t, 1, 4)
	f.lead(f.c)
	f.nomad.slowStop = true
	f.config(queuekv.Queue{Name: "default", Weight: 1, Priority: 50}, queuekv.Queue{Name: "team-a", GPUs: 2, Weight: 1, Priority: 50})
	f.submit(recordOf(jobOf("default", "low", "", 1, 4), 10, t0))
	f.submit(recordOf(jobOf("default", "huge", "team-a", 1, 3), 0, t0)) // over team-a's quota, no borrowing
	f.submit(recordOf(jobOf("default", "lost", "team-x", 1, 1), 0, t0)) // a queue not declared
	f.now = t0.Add(90 * time.Second)
	f.reconcile(f.c)
	if st := f.status("default/low"); st.State != StateAdmitted {
		t.Fatalf("low: %+v", st)
	}
	d := f.queueStats("default")
	if d.Admissions != 1 || d.LatencySumS != 90 || d.LatencyCounts[5] != 1 { // le 120
		t.Fatalf("default after low's admission 90 s after its submission: %+v", d)
	}
	if a := f.queueStats("team-a"); a.Refusals != 1 || a.Admissions != 0 {
		t.Errorf("team-a after refusing huge: %+v", a)
	}
	if u := f.queueStats(UndeclaredQueue); u.Refusals != 1 {
		t.Errorf("undeclared after refusing lost: %+v", u)
	}
	// Idle: nothing written, the counters stay.
	_, idx := f.stats()
	if res := f.reconcile(f.c); res.Transactions != 0 {
		t.Fatalf("an idle round wrote %d transactions", res.Transactions)
	}
	if _, again := f.stats(); again != idx {
		t.Fatalf("an idle round rewrote the stats (%d → %d)", idx, again)
	}

	// high preempts low at +150 s; low stops at +200 s and is queued
	// again; high is admitted then (50 s after its submission).
	f.now = t0.Add(150 * time.Second)
	f.submit(recordOf(jobOf("default", "high", "", 1, 4), 90, f.now))
	f.reconcile(f.c)
	if d := f.queueStats("default"); d.Preemptions != 1 || d.Admissions != 1 {
		t.Fatalf("after the preemption: %+v", d)
	}
	f.nomad.release()
	f.now = t0.Add(200 * time.Second)
	f.reconcile(f.c)
	if st := f.status("default/low"); st.State != StateQueued || st.QueuedAt == nil || !st.QueuedAt.Equal(f.now) {
		t.Fatalf("low queued again: %+v", st)
	}
	if d := f.queueStats("default"); d.Admissions != 2 || d.LatencySumS != 90+50 {
		t.Fatalf("after high's admission: %+v", d)
	}
	// high ends; low is readmitted at +500 s: 300 s after its requeue.
	f.nomad.finish("default/high")
	f.now = t0.Add(500 * time.Second)
	f.reconcile(f.c)
	if st := f.status("default/low"); st.State != StateAdmitted || st.Admissions != 2 {
		t.Fatalf("low readmitted: %+v", st)
	}
	d = f.queueStats("default")
	if d.Admissions != 3 || d.Preemptions != 1 || d.LatencySumS != 90+50+300 || d.LatencyCounts[6] != 1 { // le 300
		t.Fatalf("after low's readmission: %+v", d)
	}
	// The refusals stay as they were: the refused records are not counted
	// again round after round.
	if a, u := f.queueStats("team-a"), f.queueStats(UndeclaredQueue); a.Refusals != 1 || u.Refusals != 1 {
		t.Errorf("refusals recounted: team-a %+v, undeclared %+v", a, u)
	}
}

// A crash between the registration and the admission's status write, and
// a new leader: the admission is counted once, by the status write that
// records it — not by the crashed round, not twice by later rounds.
func TestStatsCountAnAdmissionOnceAcrossACrash(t *testing.T) {
	f := newFixture(t, 2, 4)
	s1 := f.lead(f.c)
	f.submit(recordOf(jobOf("default", "gang", "", 2, 4), 0, t0))
	ctx, crash := context.WithCancel(ctxOf(t))
	f.nomad.onRegister = func(string) { crash() }
	if _, err := f.c.Reconcile(ctx); err == nil {
		t.Fatal("the crashed round succeeded")
	}
	f.nomad.onRegister = nil
	if s, _ := f.stats(); s != nil && s.Queues["default"] != nil && s.Queues["default"].Admissions != 0 {
		t.Fatalf("the crashed round counted an admission it did not record: %+v", s.Queues["default"])
	}
	s1.StopRenewing()
	_ = s1.Close(context.Background())
	c2 := f.controller("c2")
	f.lead(c2)
	for range 3 {
		f.reconcile(c2)
	}
	if st := f.status("default/gang"); st.State != StateAdmitted || st.Admissions != 1 {
		t.Fatalf("status %+v", st)
	}
	if d := f.queueStats("default"); d.Admissions != 1 {
		t.Fatalf("admissions %d after one admission, a crash and three rounds of a new leader", d.Admissions)
	}
}

// The counts and the status they count commit together: when the stats
// key changed behind the round (a check-and-set that fails), the status
// write fails with it — the admission is neither recorded nor counted —
// and the next round records and counts it once, on top of what it finds.
func TestStatsAndStatusCommitTogether(t *testing.T) {
	f := newFixture(t, 1, 4)
	f.lead(f.c)
	f.submit(recordOf(jobOf("default", "a", "", 1, 1), 0, t0))
	f.nomad.onRegister = func(string) {
		s := NewStats()
		s.Queue("default").Admitted(7, time.Second)
		b, err := EncodeStats(s)
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := f.client.KV().Put(&api.KVPair{Key: f.c.statsKey(), Value: b}, nil); err != nil {
			t.Error(err)
		}
	}
	if _, err := f.c.Reconcile(ctxOf(t)); err == nil || !strings.Contains(err.Error(), "changed since read") {
		t.Fatalf("a round whose stats changed behind it: %v", err)
	}
	f.nomad.onRegister = nil
	if st := f.status("default/a"); st.State == StateAdmitted {
		t.Fatalf("the admission was recorded without its count: %+v", st)
	}
	if d := f.queueStats("default"); d.Admissions != 7 {
		t.Fatalf("admissions %d, want the 7 written behind the round", d.Admissions)
	}
	f.reconcile(f.c)
	f.reconcile(f.c)
	if st := f.status("default/a"); st.State != StateAdmitted {
		t.Fatalf("a: %+v", st)
	}
	if d := f.queueStats("default"); d.Admissions != 8 {
		t.Fatalf("admissions %d, want 8", d.Admissions)
	}
}

// A deposed leader's round counts nothing: the leader check fails the
// whole transaction.
func TestStatsADeposedLeaderCountsNothing(t *testing.T) {
	f := newFixture(t, 1, 4)
	s := f.lead(f.c)
	f.submit(recordOf(jobOf("default", "a", "team-x", 1, 1), 0, t0)) // refused: would count
	c2 := f.controller("c2")
	c2.lead(s.ID()+"x", make(chan struct{}))
	if _, err := c2.Reconcile(ctxOf(t)); err == nil {
		t.Fatal("a deposed leader's round succeeded")
	}
	if st, _ := f.stats(); st != nil {
		t.Fatalf("a deposed leader wrote the stats: %+v", st)
	}
}

// Stats that cannot be read (damaged, a newer format) start over at the
// next counted change, which overwrites them with a check-and-set.
func TestStatsUnreadableStartOver(t *testing.T) {
	f := newFixture(t, 1, 4)
	f.lead(f.c)
	f.put(f.c.statsKey(), []byte(`{"format":9,"queues":{}}`))
	f.submit(recordOf(jobOf("default", "a", "", 1, 1), 0, t0))
	f.reconcile(f.c)
	if d := f.queueStats("default"); d.Admissions != 1 {
		t.Fatalf("admissions %d, want 1", d.Admissions)
	}
}

// A round that refuses many jobs writes their statuses in batches that
// also carry the stats: no transaction goes over maxTxnOps operations,
// and every refusal is counted once.
func TestStatsBatchedWithTheStatuses(t *testing.T) {
	const n = 200
	f := newFixture(t, 1, 4)
	f.lead(f.c)
	f.config(queuekv.Queue{Name: "default", Weight: 1, Priority: 50}, queuekv.Queue{Name: "small", GPUs: 1, Weight: 1, Priority: 50})
	f.submit(recordOf(jobOf("default", "big", "", 1, 4), 0, t0))
	// Waiting jobs (no count) and refused ones (a count each), by name:
	// 62 waiting first, so that the first refusal finds one operation
	// left in its batch and needs two; then both, alternately.
	refuse := func(i int) bool { return i >= maxTxnOps-2 && i%2 == 0 }
	refused := 0
	for i := range n {
		queue, gpus := "", 1
		if refuse(i) {
			queue, gpus = "small", 2
			refused++
		}
		f.submit(recordOf(jobOf("default", fmt.Sprintf("j%03d", i), queue, 1, gpus), 0, t0.Add(time.Duration(i+1)*time.Millisecond)))
	}
	res := f.reconcile(f.c)
	if len(res.Refused) != refused {
		t.Fatalf("refused %d, want %d", len(res.Refused), refused)
	}
	if res.LargestTransaction > maxTxnOps {
		t.Fatalf("a transaction of %d operations", res.LargestTransaction)
	}
	if s := f.queueStats("small"); s.Refusals != uint64(refused) {
		t.Fatalf("refusals %d, want %d", s.Refusals, refused)
	}
	if d := f.queueStats("default"); d.Admissions != 1 {
		t.Fatalf("admissions %d, want 1 (big)", d.Admissions)
	}
}

// A queue removed from the configuration leaves the stats at their next
// write; the undeclared entry stays.
func TestStatsDropRemovedQueues(t *testing.T) {
	f := newFixture(t, 1, 4)
	f.lead(f.c)
	f.config(queuekv.Queue{Name: "default", Weight: 1, Priority: 50}, queuekv.Queue{Name: "old", Weight: 1, Priority: 50})
	f.submit(recordOf(jobOf("default", "a", "old", 1, 1), 0, t0))
	f.reconcile(f.c)
	if f.queueStats("old").Admissions != 1 {
		t.Fatal("old's admission not counted")
	}
	f.config(queuekv.Queue{Name: "default", Weight: 1, Priority: 50})
	f.submit(recordOf(jobOf("default", "b", "", 1, 1), 0, t0))
	f.reconcile(f.c)
	s, _ := f.stats()
	if _, ok := s.Queues["old"]; ok || s.Queues["default"].Admissions != 1 {
		t.Fatalf("stats after old was removed: %+v", s.Queues)
	}
}
