package policy

import (
	"strings"
	"testing"
)

func TestQuota(t *testing.T) {
	teams := func(borrowA bool, cohortB string) Config {
		return Config{Queues: []QueueConfig{
			{Name: "team-a", GPUs: 4, Borrow: borrowA},
			{Name: "team-b", GPUs: 4, Cohort: cohortB},
		}}
	}
	fullA := []Running{running(gang("a-run", "team-a", 4, 1, 0), 0, "n0", "n0", "n0", "n0")}
	tests := []struct {
		name      string
		cfg       Config
		running   []Running
		job       Job
		admit     bool
		borrowed  int
		cause     Cause
		reasonHas string
	}{
		{"within quota", teams(false, ""), nil, gang("a1", "team-a", 1, 4, 1), true, 0, 0, ""},
		{"quota used, borrowing off", teams(false, ""), fullA, gang("a1", "team-a", 1, 2, 1), false, 0,
			CauseQueueQuota, "team-a uses 4 of its 4 GPUs and needs 2 more; borrowing off"},
		{"borrows idle quota of its cohort", teams(true, ""), fullA, gang("a1", "team-a", 1, 2, 1), true, 2, 0, ""},
		{"partly within, partly borrowed", teams(true, ""), nil, gang("a1", "team-a", 1, 6, 1), true, 2, 0, ""},
		{"another cohort lends nothing", teams(true, "other"), fullA, gang("a1", "team-a", 1, 2, 1), false, 0,
			CauseCohortFull, "cohort default has none idle to lend (uses 4 of 4)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := State{Config: tt.cfg, Nodes: gpuNodes(2, 8), Running: tt.running, Pending: []Job{tt.job}}
			d := decide(t, s)
			checkInvariants(t, s, d)
			a, ok := admission(d, tt.job.ID)
			if ok != tt.admit {
				t.Fatalf("admitted = %v, want %v; decision %+v", ok, tt.admit, d)
			}
			if ok {
				if a.BorrowedGPUs != tt.borrowed {
					t.Fatalf("borrowed %d GPUs, want %d", a.BorrowedGPUs, tt.borrowed)
				}
				return
			}
			w, _ := waitingFor(d, tt.job.ID)
			if w.Cause != tt.cause || !strings.Contains(w.Reason(), tt.reasonHas) {
				t.Fatalf("cause %v, reason %q; want cause %v and %q", w.Cause, w.Reason(), tt.cause, tt.reasonHas)
			}
		})
	}
}

// A quota lowered below current use preempts nothing; the queue's new
// admissions wait until its use falls under the new quota.
func TestLoweredQuotaPreemptsNothing(t *testing.T) {
	run := []Running{
		running(gang("a-1", "team-a", 4, 1, 0), 0, "n0", "n0", "n0", "n0"),
		running(gang("a-2", "team-a", 4, 1, 1), 0, "n1", "n1", "n1", "n1"),
	}
	lowered := Config{Queues: []QueueConfig{{Name: "team-a", GPUs: 4, Borrow: true}, {Name: "team-b", GPUs: 12}}}
	pending := []Job{gang("a-3", "team-a", 1, 1, 5), gang("b-1", "team-b", 1, 1, 6)}
	s := State{Config: lowered, Nodes: gpuNodes(4, 4), Running: run, Pending: pending}
	d := decide(t, s)
	checkInvariants(t, s, d)
	if len(d.Preempt) != 0 {
		t.Fatalf("lowering a quota preempted %v", victims(d))
	}
	// team-a (8 in use, quota 4) may still borrow the cohort's idle quota:
	// 8 + 1 ≤ 16. With borrowing off it must wait.
	lowered.Queues[0].Borrow = false
	s.Config = lowered
	d = decide(t, s)
	checkInvariants(t, s, d)
	if len(d.Preempt) != 0 {
		t.Fatalf("preempted %v", victims(d))
	}
	if _, ok := admission(d, "a-3"); ok {
		t.Fatal("team-a admitted a job while over its lowered quota")
	}
	if _, ok := admission(d, "b-1"); !ok {
		t.Fatal("team-b's job waits behind team-a's quota")
	}
	// Once team-a's use falls to the new quota minus one, it admits again.
	s.Running = []Running{running(gang("a-1", "team-a", 3, 1, 0), 0, "n0", "n0", "n0")}
	d = decide(t, s)
	if _, ok := admission(d, "a-3"); !ok {
		t.Fatalf("team-a under its quota still waits: %+v", d.Waiting)
	}
}

// A queue whose head waits for quota holds back the rest of that queue
// (FIFO inside it), not other queues.
func TestQuotaHeadHoldsItsQueueOnly(t *testing.T) {
	cfg := Config{Queues: []QueueConfig{{Name: "team-a", GPUs: 4}, {Name: "team-b", GPUs: 4}}}
	run := []Running{running(gang("a-run", "team-a", 2, 1, 0), 0, "n0", "n0")}
	pending := []Job{gang("a-big", "team-a", 1, 4, 1), gang("a-small", "team-a", 1, 1, 2), gang("b-1", "team-b", 1, 1, 3)}
	s := State{Config: cfg, Nodes: gpuNodes(2, 8), Running: run, Pending: pending}
	d := decide(t, s)
	checkInvariants(t, s, d)
	if _, ok := admission(d, "a-small"); ok {
		t.Fatal("a-small overtook a-big inside team-a")
	}
	if _, ok := admission(d, "b-1"); !ok {
		t.Fatal("team-b waits for team-a's quota")
	}
	w, _ := waitingFor(d, "a-small")
	if w.Cause != CauseBehindInQueue || !strings.Contains(w.Reason(), "behind job a-big") {
		t.Fatalf("a-small: %v %q", w.Cause, w.Reason())
	}
}
