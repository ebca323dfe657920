package admit

import (
	"strings"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
)

// A gang Nomad placed only in part after the plan (work outside gpujob
// took capacity in between) is stopped whole once the grace has passed,
// and queued again at its place: ahead of a job submitted after it.
func TestPartialGangIsStoppedAndRequeued(t *testing.T) {
	f := newFixture(t, 1, 4)
	f.c.PartialGrace = 30 * time.Second
	f.lead(f.c)
	f.nomad.short["default/gang"] = 1
	f.submit(recordOf(jobOf("default", "gang", "", 3, 1), 0, t0))
	f.reconcile(f.c)
	if st := f.status("default/gang"); st.State != StateAdmitted {
		t.Fatalf("gang: %+v", st)
	}
	f.submit(recordOf(jobOf("default", "later", "", 1, 4), 0, t0.Add(time.Second)))
	// Short: the grace starts, nothing is stopped.
	f.now = f.now.Add(time.Second)
	res := f.reconcile(f.c)
	st := f.status("default/gang")
	if len(res.Partial) != 0 || f.nomad.stops != 0 || st.State != StateAdmitted || st.ShortSince == nil || !st.ShortSince.Equal(f.now) {
		t.Fatalf("within the grace: %+v, status %+v, %d stops", res, st, f.nomad.stops)
	}
	f.now = f.now.Add(29 * time.Second)
	if res := f.reconcile(f.c); len(res.Partial) != 0 || f.nomad.stops != 0 {
		t.Fatalf("stopped before the grace ended: %+v", res)
	}
	f.now = f.now.Add(time.Second)
	res = f.reconcile(f.c)
	st = f.status("default/gang")
	if len(res.Partial) != 1 || f.nomad.stops != 1 || st.State != StatePreempted ||
		!strings.Contains(st.PreemptedWhy, "only 2 of its 3 members") || st.Preemptions != 1 {
		t.Fatalf("past the grace: %+v, status %+v", res, st)
	}
	// Its members stopped: queued again ahead of later, then readmitted
	// (the outside work gone) with a new admission.
	delete(f.nomad.short, "default/gang")
	f.now = f.now.Add(time.Second)
	res = f.reconcile(f.c)
	if len(res.Requeued) != 1 || f.status("default/gang").State != StateAdmitted || f.status("default/gang").Admissions != 2 {
		t.Fatalf("after the stop: %+v, gang %+v", res, f.status("default/gang"))
	}
	if st := f.status("default/later"); st.State != StateQueued || st.Position != 1 {
		t.Fatalf("later: %+v", st)
	}
	// Whole now: the guard keeps quiet.
	f.now = f.now.Add(time.Minute)
	if res := f.reconcile(f.c); len(res.Partial) != 0 || f.status("default/gang").ShortSince != nil {
		t.Fatalf("a whole gang: %+v", res)
	}
}

// Members of a batch gang that completed (or failed) by themselves are
// not missing; one whose node was lost is.
func TestPartialGangCountsEndedMembers(t *testing.T) {
	for _, tc := range []struct {
		name            string
		client, desired string
		stopped         bool
	}{
		{"completed", nomadapi.AllocClientStatusComplete, nomadapi.AllocDesiredStatusRun, false},
		{"failed", nomadapi.AllocClientStatusFailed, nomadapi.AllocDesiredStatusRun, false},
		{"lost", nomadapi.AllocClientStatusLost, nomadapi.AllocDesiredStatusStop, true},
		{"evicted", nomadapi.AllocClientStatusComplete, nomadapi.AllocDesiredStatusEvict, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 2, 4)
			f.lead(f.c)
			f.submit(recordOf(jobOf("default", "gang", "", 4, 2), 0, t0))
			f.reconcile(f.c)
			if f.status("default/gang").State != StateAdmitted {
				t.Fatal("not admitted")
			}
			f.nomad.end("default/gang", 2, tc.client, tc.desired)
			for range 2 {
				f.now = f.now.Add(time.Minute)
				f.reconcile(f.c)
			}
			st := f.status("default/gang")
			if stopped := f.nomad.stops == 1 && st.State == StatePreempted; stopped != tc.stopped {
				t.Fatalf("2 of 4 members %s: stopped %v (%d stops), status %+v", tc.name, stopped, f.nomad.stops, st)
			}
		})
	}
	// A whole gang is never asked about: no JobAllocations call.
	f := newFixture(t, 2, 4)
	f.lead(f.c)
	f.submit(recordOf(jobOf("default", "whole", "", 2, 4), 0, t0))
	for range 3 {
		f.reconcile(f.c)
		f.now = f.now.Add(time.Minute)
	}
	if f.nomad.jobAllocs != 0 {
		t.Errorf("%d JobAllocations calls for a whole gang", f.nomad.jobAllocs)
	}
}

// A gang stopped outside the queue (nomad job stop) loses its members
// one by one: it has ended, and is forgotten, never queued again.
func TestStoppedGangIsNotRequeuedByTheGuard(t *testing.T) {
	f := newFixture(t, 2, 4)
	f.lead(f.c)
	f.nomad.slowStop = true
	f.submit(recordOf(jobOf("default", "gang", "", 2, 4), 0, t0))
	f.reconcile(f.c)
	if err := f.nomad.Stop(ctxOf(t), "default", "gang"); err != nil {
		t.Fatal(err)
	}
	f.nomad.mu.Lock()
	j := f.nomad.jobs["default/gang"]
	j.allocs = j.allocs[:1] // one member has stopped, one still stops
	f.nomad.mu.Unlock()
	for range 3 {
		f.now = f.now.Add(time.Minute)
		if res := f.reconcile(f.c); len(res.Partial) != 0 {
			t.Fatalf("the guard stopped a job stopped outside the queue: %+v", res)
		}
	}
	f.nomad.release()
	f.now = f.now.Add(time.Minute)
	res := f.reconcile(f.c)
	if len(res.Finished) != 1 || len(res.Requeued) != 0 || f.nomad.registered("default/gang") != 1 {
		t.Fatalf("after it stopped: %+v, registered %d", res, f.nomad.registered("default/gang"))
	}
}
