package policy

import (
	"strings"
	"testing"
	"time"
)

func TestReasonAndPosition(t *testing.T) {
	cfg := Config{Queues: []QueueConfig{{Name: "team-a", GPUs: 8}, {Name: "team-b", GPUs: 8}}}
	full := running(gang("a-run", "team-a", 8, 1, 0), time.Hour, "n0", "n0", "n0", "n0", "n0", "n0", "n0", "n0")
	pending := []Job{gang("b-1", "team-b", 1, 8, 1), gang("b-2", "team-b", 1, 8, 2), gang("b-3", "team-b", 1, 8, 3),
		gang("a-1", "team-a", 1, 1, 4)}
	s := State{Config: cfg, Nodes: gpuNodes(1, 8), Running: []Running{full}, Pending: pending}
	s.Config.Disable.Preemption = true
	d := decide(t, s)
	checkInvariants(t, s, d)
	w, _ := waitingFor(d, "a-1")
	if w.Position != 4 {
		t.Fatalf("a-1 at position %d, want 4", w.Position)
	}
	if want := "3 jobs ahead; team-a uses 8 of its 8 GPUs and needs 1 more; borrowing off"; w.Reason() != want {
		t.Fatalf("reason %q, want %q", w.Reason(), want)
	}
}

func TestEstimatedStart(t *testing.T) {
	tests := []struct {
		name    string
		runtime time.Duration // of the running gang; 0: unknown
		want    map[string]time.Duration
	}{
		{"from running max runtimes, in order", 2 * time.Hour,
			map[string]time.Duration{"j1": time.Hour, "j2": 90 * time.Minute, "j3": 90 * time.Minute}},
		{"unknown when what it waits for has no max runtime", 0,
			map[string]time.Duration{"j1": -1, "j2": -1, "j3": -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := running(withRuntime(gang("r", "", 4, 1, 0), tt.runtime), time.Hour, "n0", "n0", "n0", "n0")
			pending := []Job{
				withRuntime(gang("j1", "", 1, 4, 1), 30*time.Minute),
				withRuntime(gang("j2", "", 1, 2, 2), time.Hour),
				withRuntime(gang("j3", "", 1, 2, 3), time.Hour),
			}
			s := State{Nodes: gpuNodes(1, 4), Running: []Running{r}, Pending: pending}
			s.Config.Disable.Backfill = true
			d := decide(t, s)
			for id, after := range tt.want {
				w, _ := waitingFor(d, id)
				if after < 0 {
					if !w.EstimatedStart.IsZero() {
						t.Errorf("%s: estimated %v, want unknown", id, w.EstimatedStart)
					}
					continue
				}
				if want := t0.Add(after); !w.EstimatedStart.Equal(want) {
					t.Errorf("%s: estimated %v, want %v", id, w.EstimatedStart.Sub(t0), after)
				}
			}
			head, _ := waitingFor(d, "j1")
			if tt.runtime == 0 && !strings.Contains(head.Reason(), "cannot be estimated") {
				t.Errorf("head reason %q", head.Reason())
			}
			if tt.runtime != 0 && !strings.Contains(head.Reason(), "reserved for it in 1h0m0s") {
				t.Errorf("head reason %q", head.Reason())
			}
		})
	}
}
