package policy

import (
	"slices"
	"testing"
)

// With one free slot, the job that goes first is the one admitted.
func TestOrder(t *testing.T) {
	svc := gang("svc", "", 1, 1, 5)
	svc.Kind = KindService
	classless := svc
	classless.ID, classless.Class = "svc-batch", ClassBatch
	nominated := gang("nominated", "", 1, 1, 9)
	nominated.Nominated = true
	twoQueues := Config{Queues: []QueueConfig{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}}
	weighted := Config{Queues: []QueueConfig{{Name: "a", Weight: 3}, {Name: "b", Weight: 1}}}
	noFair := twoQueues
	noFair.Disable.FairShare = true
	tests := []struct {
		name    string
		cfg     Config
		running []Running
		pending []Job
		first   string
	}{
		{"FIFO inside a priority", Config{}, nil,
			[]Job{gang("late", "", 1, 1, 2), gang("early", "", 1, 1, 1)}, "early"},
		{"higher priority first", Config{}, nil,
			[]Job{gang("early", "", 1, 1, 1), withPriority(gang("urgent", "", 1, 1, 2), 90)}, "urgent"},
		{"services are a higher class than any priority", Config{}, nil,
			[]Job{withPriority(gang("train", "", 1, 1, 1), 100), svc}, "svc"},
		{"a service set to the batch class is ordered by priority", Config{}, nil,
			[]Job{withPriority(gang("train", "", 1, 1, 1), 100), classless}, "train"},
		{"queue priority is its jobs' default", Config{Queues: []QueueConfig{{Name: "lo"}, {Name: "hi", Priority: 80}}}, nil,
			[]Job{gang("lo1", "lo", 1, 1, 1), gang("hi1", "hi", 1, 1, 2)}, "hi1"},
		{"nominated first", Config{}, nil,
			[]Job{withPriority(gang("urgent", "", 1, 1, 1), 99), nominated}, "nominated"},
		{"fair share: the queue using less goes first", twoQueues,
			[]Running{running(gang("ra", "a", 1, 1, 0), 0, "n0")},
			[]Job{gang("a1", "a", 1, 1, 1), gang("b1", "b", 1, 1, 2)}, "b1"},
		{"fair share is weighted: 1 GPU of weight 3 is less than 1 of weight 1", weighted,
			[]Running{running(gang("ra", "a", 1, 1, 0), 0, "n0"), running(gang("rb", "b", 1, 1, 0), 0, "n1")},
			[]Job{gang("b1", "b", 1, 1, 1), gang("a1", "a", 1, 1, 2)}, "a1"},
		{"fair share off: FIFO across queues", noFair,
			[]Running{running(gang("ra", "a", 1, 1, 0), 0, "n0")},
			[]Job{gang("a1", "a", 1, 1, 1), gang("b1", "b", 1, 1, 2)}, "a1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// One free GPU beyond what runs.
			s := State{Config: tt.cfg, Nodes: gpuNodes(len(tt.running)+1, 1), Running: tt.running, Pending: tt.pending}
			s.Config.Disable.Preemption = true
			s.Config.Disable.Backfill = true
			d := decide(t, s)
			checkInvariants(t, s, d)
			if got := admitted(d); !slices.Equal(got, []string{tt.first}) {
				t.Fatalf("admitted %v, want [%s]", got, tt.first)
			}
		})
	}
}

// Fair share follows admissions made in the same Decide: with equal
// weights and an empty cluster, two queues alternate.
func TestFairShareAlternatesWithinOneDecide(t *testing.T) {
	cfg := Config{Queues: []QueueConfig{{Name: "a"}, {Name: "b"}}}
	var pending []Job
	for i := range 4 {
		pending = append(pending, gang("a"+string(rune('0'+i)), "a", 1, 1, i))
	}
	for i := range 4 {
		pending = append(pending, gang("b"+string(rune('0'+i)), "b", 1, 1, 10+i))
	}
	s := State{Config: cfg, Nodes: gpuNodes(1, 4), Pending: pending}
	d := decide(t, s)
	checkInvariants(t, s, d)
	perQueue := map[byte]int{}
	for _, id := range admitted(d) {
		perQueue[id[0]]++
	}
	if perQueue['a'] != 2 || perQueue['b'] != 2 {
		t.Fatalf("admitted %v; want 2 of each queue", admitted(d))
	}
}
