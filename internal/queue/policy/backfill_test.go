package policy

import (
	"strings"
	"testing"
	"time"
)

func TestBackfill(t *testing.T) {
	// Two 8-GPU nodes; a gang of 8 on n0 ends in 1h (started 1h ago, 2h
	// max). The head needs 2 × 6 GPUs: it starts in 1h, on both nodes,
	// leaving 2 GPUs of each node free then.
	runningWith := func(maxRuntime time.Duration) []Running {
		return []Running{running(withRuntime(gang("r", "", 1, 8, 0), maxRuntime), time.Hour, "n0")}
	}
	head := withRuntime(gang("head", "", 2, 6, 1), time.Hour)
	tests := []struct {
		name      string
		running   []Running
		disable   bool
		candidate Job
		admit     bool
		reasonHas string
	}{
		{"ends before the head's start", runningWith(2 * time.Hour), false,
			withRuntime(gang("short", "", 1, 4, 2), 30*time.Minute), true, ""},
		{"would run past the head's start", runningWith(2 * time.Hour), false,
			withRuntime(gang("long", "", 1, 4, 2), 3*time.Hour), false, "would delay job head"},
		{"no max_runtime: not ahead of a waiting head", runningWith(2 * time.Hour), false,
			gang("unbounded", "", 1, 4, 2), false, "has no max_runtime"},
		{"no max_runtime, but fits in what the head leaves", runningWith(2 * time.Hour), false,
			gang("beside", "", 1, 2, 2), true, ""},
		{"head's start unknown: nothing ahead of it", runningWith(0), false,
			withRuntime(gang("short", "", 1, 4, 2), time.Minute), false, "cannot be estimated"},
		{"backfill off", runningWith(2 * time.Hour), true,
			withRuntime(gang("short", "", 1, 4, 2), time.Minute), false, "backfill off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := State{Nodes: gpuNodes(2, 8), Running: tt.running, Pending: []Job{head, tt.candidate}}
			s.Config.Disable.Backfill = tt.disable
			d := decide(t, s)
			checkInvariants(t, s, d)
			if _, ok := admission(d, "head"); ok {
				t.Fatal("the head fits now; the case is wrong")
			}
			a, ok := admission(d, tt.candidate.ID)
			if ok != tt.admit {
				w, _ := waitingFor(d, tt.candidate.ID)
				t.Fatalf("admitted = %v, want %v (%s)", ok, tt.admit, w.Reason())
			}
			if ok && !a.Backfilled {
				t.Fatal("admission ahead of a waiting head not marked Backfilled")
			}
			if !ok {
				if w, _ := waitingFor(d, tt.candidate.ID); !strings.Contains(w.Reason(), tt.reasonHas) {
					t.Fatalf("reason %q, want %q in it", w.Reason(), tt.reasonHas)
				}
			}
		})
	}
}

// Whatever is backfilled, the head's reservation still holds: replaying
// the releases after the admissions gives the same start.
func TestBackfillNeverDelaysHead(t *testing.T) {
	run := []Running{
		running(withRuntime(gang("r1", "", 1, 8, 0), 2*time.Hour), time.Hour, "n0"),
		running(withRuntime(gang("r2", "", 1, 4, 0), 3*time.Hour), time.Hour, "n1"),
	}
	pending := []Job{withRuntime(gang("head", "", 3, 6, 1), time.Hour)}
	for i, rt := range []time.Duration{10 * time.Minute, 0, 5 * time.Hour, 50 * time.Minute, 0, 3 * time.Hour} {
		pending = append(pending, withRuntime(gang(string(rune('a'+i)), "", 1, 1+i%3, 2+i), rt))
	}
	s := State{Nodes: gpuNodes(3, 8), Running: run, Pending: pending}
	d := decide(t, s)
	checkInvariants(t, s, d)
	before, _ := waitingFor(d, "head")
	if before.EstimatedStart.IsZero() {
		t.Fatal("head has no estimate")
	}
	// Start the backfilled jobs and decide again at once: the head's
	// estimated start must not move.
	for _, a := range d.Admit {
		var j Job
		for _, p := range pending {
			if p.ID == a.Job {
				j = p
			}
		}
		s.Running = append(s.Running, Running{Job: j, StartedAt: t0, Placement: a.Placement})
	}
	s.Pending = pending[:1]
	d2 := decide(t, s)
	after, _ := waitingFor(d2, "head")
	if len(d.Admit) == 0 {
		t.Fatal("nothing was backfilled; the case is wrong")
	}
	if !after.EstimatedStart.Equal(before.EstimatedStart) {
		t.Fatalf("backfill moved the head's start from %v to %v", before.EstimatedStart, after.EstimatedStart)
	}
}
