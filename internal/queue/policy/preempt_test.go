package policy

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPreemption(t *testing.T) {
	lo := func(id string, gpus int, ago time.Duration) Running {
		nodes := slices.Repeat([]string{"n0"}, gpus)
		return running(gang(id, "", gpus, 1, 0), ago, nodes...)
	}
	checkpointed := lo("lo-old", 4, 2*time.Hour)
	checkpointed.LastCheckpoint = t0.Add(-time.Minute)
	stopping := lo("lo-stopping", 4, time.Minute)
	stopping.Stopping = true
	svc := gang("svc", "", 4, 1, 1)
	svc.Kind = KindService
	teams := Config{Queues: []QueueConfig{{Name: "team-a", GPUs: 4, Borrow: true}, {Name: "team-b", GPUs: 4, Borrow: true}}}
	tests := []struct {
		name      string
		cfg       Config
		running   []Running
		job       Job
		victims   []string
		reasonHas string
	}{
		{"fewest GPU-seconds: the younger gang", Config{},
			[]Running{lo("lo-old", 4, 2*time.Hour), lo("lo-young", 4, time.Hour)},
			withPriority(gang("hi", "", 4, 1, 1), 90), []string{"lo-young"}, "preempted by job hi (priority 90 > 50)"},
		{"a recent checkpoint makes the older gang cheaper", Config{},
			[]Running{checkpointed, lo("lo-young", 4, time.Hour)},
			withPriority(gang("hi", "", 4, 1, 1), 90), []string{"lo-old"}, "priority 90 > 50"},
		{"equal priority preempts nothing", Config{},
			[]Running{lo("lo-old", 4, 2*time.Hour), lo("lo-young", 4, time.Hour)},
			gang("same", "", 4, 1, 1), nil, ""},
		{"whole gangs, and no more than needed", Config{},
			[]Running{lo("small", 2, time.Minute), lo("big", 6, time.Hour)},
			withPriority(gang("hi", "", 6, 1, 1), 90), []string{"big"}, ""},
		{"a service outranks batch", Config{},
			[]Running{lo("lo-old", 4, 2*time.Hour), lo("lo-young", 4, time.Hour)},
			svc, []string{"lo-young"}, "preempted by service svc (service class outranks batch)"},
		{"a stopping gang's GPUs are used first, without a new victim", Config{},
			[]Running{lo("lo-old", 4, 2*time.Hour), stopping},
			withPriority(gang("hi", "", 4, 1, 1), 90), nil, ""},
		{"a queue reclaims its quota from a borrower", teams,
			[]Running{running(gang("b-1", "team-b", 4, 1, 0), time.Hour, "n0", "n0", "n0", "n0"),
				running(gang("b-2", "team-b", 4, 1, 0), 2*time.Hour, "n0", "n0", "n0", "n0")},
			gang("a-1", "team-a", 4, 1, 1), []string{"b-1"}, "queue team-a reclaims 4 GPUs lent to team-b"},
		{"nothing to reclaim from a queue within its quota", teams,
			[]Running{running(gang("a-0", "team-a", 4, 1, 0), time.Hour, "n0", "n0", "n0", "n0"),
				running(gang("b-1", "team-b", 4, 1, 0), time.Hour, "n0", "n0", "n0", "n0")},
			gang("a-1", "team-a", 4, 1, 1), nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := State{Config: tt.cfg, Nodes: gpuNodes(1, 8), Running: tt.running, Pending: []Job{tt.job}}
			d := decide(t, s)
			checkInvariants(t, s, d)
			if got := victims(d); !slices.Equal(got, tt.victims) {
				t.Fatalf("victims %v, want %v", got, tt.victims)
			}
			for _, p := range d.Preempt {
				if p.Preemptor != tt.job.ID || !strings.Contains(p.Reason, tt.reasonHas) {
					t.Fatalf("preemption %+v; want preemptor %s and %q", p, tt.job.ID, tt.reasonHas)
				}
			}
			if len(d.Admit) != 0 {
				t.Fatalf("admitted %v while its victims still run", admitted(d))
			}
			w, _ := waitingFor(d, tt.job.ID)
			wantPending := len(tt.victims) > 0 || tt.name == "a stopping gang's GPUs are used first, without a new victim"
			if (w.Cause == CausePreemptionPending) != wantPending {
				t.Fatalf("cause %v (%s)", w.Cause, w.Reason())
			}
		})
	}
}

// Preemption off: the same high-priority gang waits.
func TestPreemptionOff(t *testing.T) {
	s := State{Nodes: gpuNodes(1, 4), Running: []Running{running(gang("lo", "", 4, 1, 0), time.Hour, "n0", "n0", "n0", "n0")},
		Pending: []Job{withPriority(gang("hi", "", 4, 1, 1), 90)}}
	s.Config.Disable.Preemption = true
	if d := decide(t, s); len(d.Preempt) != 0 {
		t.Fatalf("preempted %v with preemption off", victims(d))
	}
}

// A preemptor's GPUs are booked in the same Decide: a later gang cannot
// take what its victims free, and the victims' other GPUs stay unused
// until they have stopped.
func TestPreemptorsGPUsAreBooked(t *testing.T) {
	run := []Running{running(gang("lo", "", 8, 1, 0), time.Hour, "n0", "n0", "n0", "n0", "n0", "n0", "n0", "n0")}
	pending := []Job{withPriority(gang("hi", "", 4, 1, 1), 90), withPriority(gang("hi2", "", 1, 1, 2), 90)}
	s := State{Nodes: gpuNodes(1, 8), Running: run, Pending: pending}
	d := decide(t, s)
	checkInvariants(t, s, d)
	if len(d.Admit) != 0 {
		t.Fatalf("admitted %v onto GPUs a victim still holds", admitted(d))
	}
	if got := victims(d); !slices.Equal(got, []string{"lo"}) {
		t.Fatalf("victims %v", got)
	}
	// Next round, the victim stopping and hi nominated: no new victim.
	s.Running[0].Stopping = true
	s.Pending[0].Nominated = true
	d = decide(t, s)
	if len(d.Preempt) != 0 {
		t.Fatalf("preempted again: %v", victims(d))
	}
	w, _ := waitingFor(d, "hi")
	if w.Cause != CausePreemptionPending {
		t.Fatalf("hi: %s", w.Reason())
	}
}
