package admit

import (
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// A queue file that lowers a quota below what the queue's running jobs
// hold takes effect without stopping anything: the running gang keeps its
// GPUs, and the queue's next job waits, saying why, until the queue is
// under its new quota.
func TestLoweredQuotaStopsNothingAndHoldsNewAdmissions(t *testing.T) {
	f := newFixture(t, 1, 8)
	f.lead(f.c)
	f.config(queuekv.Queue{Name: "team-a", GPUs: 4, Weight: 1, Priority: 50})
	f.submit(recordOf(jobOf("default", "big", "team-a", 2, 2), 0, t0))
	f.reconcile(f.c)
	if st := f.status("default/big"); st == nil || st.State != StateAdmitted {
		t.Fatalf("big: %+v", st)
	}

	f.config(queuekv.Queue{Name: "team-a", GPUs: 2, Weight: 1, Priority: 50})
	f.now = f.now.Add(time.Minute)
	f.submit(recordOf(jobOf("default", "next", "team-a", 1, 1), 0, t0.Add(time.Minute)))
	for range 3 {
		res := f.reconcile(f.c)
		if len(res.Preempted) != 0 || len(res.Partial) != 0 {
			t.Fatalf("lowering the quota stopped %v %v", res.Preempted, res.Partial)
		}
	}
	if j := f.nomad.jobs["default/big"]; j == nil || j.stop || len(j.allocs) != 2 {
		t.Fatalf("the running gang lost its allocations after the quota was lowered: %+v", j)
	}
	st := f.status("default/next")
	if st == nil || st.State != StateQueued || !strings.Contains(st.Reason, "team-a") {
		t.Fatalf("next, in a queue over its lowered quota: %+v, want queued with a reason naming its queue", st)
	}
	t.Logf("next waits: %s", st.Reason)

	// Once the running gang ends, the queue is under its quota again.
	f.nomad.finish("default/big")
	f.now = f.now.Add(time.Minute)
	f.reconcile(f.c)
	if st := f.status("default/next"); st.State != StateAdmitted {
		t.Fatalf("next after big ended: %+v", st)
	}
}
