package admit

import (
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// serviceRecordOf is job's queue record as a service's.
func serviceRecordOf(ns, id string, replicas, gpus int, submitted time.Time) *JobRecord {
	r := recordOf(jobOf(ns, id, "", replicas, gpus), 0, submitted)
	r.Kind = KindService
	return r
}

// A service the queue admitted scales up (its scaling block, through
// Nomad) beyond what is free: the replicas Nomad cannot place are a demand
// of the service's class, which preempts a batch gang of its queue for
// them; while the victim stops nothing else takes its GPUs, and once the
// replica is placed the victim waits in its queue, told who preempted it.
func TestServiceScaleUpPreemptsABatchGang(t *testing.T) {
	f := newFixture(t, 1, 4)
	f.lead(f.c)
	f.nomad.slowStop = true
	f.config(queuekv.Queue{Name: "default", Weight: 1, Priority: 50})
	f.submit(serviceRecordOf("default", "svc", 1, 2, t0))
	f.submit(recordOf(jobOf("default", "train", "", 1, 2), 0, t0.Add(time.Second)))
	f.reconcile(f.c)
	for _, n := range []string{"default/svc", "default/train"} {
		if st := f.status(n); st.State != StateAdmitted {
			t.Fatalf("%s: %+v", n, st)
		}
	}
	// Nothing to scale: nothing preempted, round after round.
	if res := f.reconcile(f.c); len(res.Preempted) != 0 {
		t.Fatalf("preempted %v with no scale-up", res.Preempted)
	}

	f.now = f.now.Add(time.Minute)
	f.nomad.scale("default/svc", 1) // the autoscaler: 2 replicas; no room for the second
	res := f.reconcile(f.c)
	if len(res.Preempted) != 1 || res.Preempted[0] != "default/train" {
		t.Fatalf("after the scale-up: preempted %v, want the training gang", res.Preempted)
	}
	st := f.status("default/train")
	if st.State != StatePreempted || st.PreemptedBy != "default/svc"+ScaleUpSuffix || !strings.Contains(st.PreemptedWhy, "service class outranks batch") {
		t.Fatalf("train: %+v", st)
	}
	if !f.status("default/svc").Nominated {
		t.Error("the service's scale-up is not nominated while its victim stops")
	}
	// Stopping: the scale-up waits for it, nothing else is preempted.
	if res := f.reconcile(f.c); len(res.Preempted) != 0 || len(res.Admitted) != 0 {
		t.Fatalf("while train stops: %+v", res)
	}
	f.nomad.release()
	f.now = f.now.Add(time.Minute)
	res = f.reconcile(f.c)
	if n, _ := f.nomad.Unplaced(ctxOf(t), "default", "svc"); n != 0 {
		t.Fatalf("%d replicas still unplaced after the victim stopped", n)
	}
	if len(f.nomad.jobs["default/svc"].allocs) != 2 {
		t.Fatalf("the service holds %d replicas, want 2", len(f.nomad.jobs["default/svc"].allocs))
	}
	train := f.status("default/train")
	if train.State != StateQueued || train.Preemptions != 1 || len(res.Admitted) != 0 {
		t.Fatalf("after the scale-up was placed: train %+v, admitted %v", train, res.Admitted)
	}
	if f.status("default/svc").Nominated {
		t.Error("the service's nomination outlived its scale-up")
	}
}

// A scale-up that fits needs nobody stopped: Nomad places it.
func TestServiceScaleUpThatFitsPreemptsNothing(t *testing.T) {
	f := newFixture(t, 1, 4)
	f.lead(f.c)
	f.submit(serviceRecordOf("default", "svc", 1, 1, t0))
	f.submit(recordOf(jobOf("default", "train", "", 1, 2), 0, t0.Add(time.Second)))
	f.reconcile(f.c)
	f.nomad.scale("default/svc", 1)
	if res := f.reconcile(f.c); len(res.Preempted) != 0 {
		t.Fatalf("a scale-up that fits preempted %v", res.Preempted)
	}
	if len(f.nomad.jobs["default/svc"].allocs) != 2 || f.status("default/train").State != StateAdmitted {
		t.Fatalf("svc holds %d replicas, train %+v", len(f.nomad.jobs["default/svc"].allocs), f.status("default/train"))
	}
}
