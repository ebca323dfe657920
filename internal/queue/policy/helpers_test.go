package policy

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// gpuNodes is n nodes of g GPUs each, named n0, n1, ...
func gpuNodes(n, g int) []Node {
	out := make([]Node, n)
	for i := range out {
		out[i] = Node{Name: fmt.Sprintf("n%d", i), Capacity: Resources{GPUs: g}}
	}
	return out
}

// gang is a pending job of members × gpus, submitted `order` minutes after t0.
func gang(id, queue string, members, gpus, order int) Job {
	return Job{ID: id, Queue: queue, Members: members, PerMember: Resources{GPUs: gpus},
		SubmittedAt: t0.Add(time.Duration(order) * time.Minute)}
}

func withRuntime(j Job, d time.Duration) Job { j.MaxRuntime = d; return j }
func withPriority(j Job, p int) Job          { j.Priority = p; return j }

// running is j started `ago` before t0 on the given nodes, one member per
// entry (repeat a node for more members there).
func running(j Job, ago time.Duration, nodes ...string) Running {
	r := Running{Job: j, StartedAt: t0.Add(-ago)}
	for _, n := range nodes {
		if k := slices.IndexFunc(r.Placement, func(a NodeAlloc) bool { return a.Node == n }); k >= 0 {
			r.Placement[k].Members++
			continue
		}
		r.Placement = append(r.Placement, NodeAlloc{Node: n, Members: 1})
	}
	r.Members = len(nodes)
	return r
}

func decide(t *testing.T, s State) Decision {
	t.Helper()
	if s.Now.IsZero() {
		s.Now = t0
	}
	d, err := Decide(s)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	return d
}

func admitted(d Decision) []string {
	var out []string
	for _, a := range d.Admit {
		out = append(out, a.Job)
	}
	return out
}

func victims(d Decision) []string {
	var out []string
	for _, p := range d.Preempt {
		out = append(out, p.Victim)
	}
	slices.Sort(out)
	return out
}

func waitingFor(d Decision, id string) (Waiting, bool) {
	for _, w := range d.Waiting {
		if w.Job == id {
			return w, true
		}
	}
	return Waiting{}, false
}

func admission(d Decision, id string) (Admission, bool) {
	for _, a := range d.Admit {
		if a.Job == id {
			return a, true
		}
	}
	return Admission{}, false
}

// checkInvariants asserts what every Decision must satisfy whatever the
// rules: every pending job is accounted for exactly once, admissions fit
// the nodes' free space together, and each admission places every member.
func checkInvariants(t *testing.T, s State, d Decision) {
	t.Helper()
	seen := map[string]int{}
	for _, a := range d.Admit {
		seen[a.Job]++
	}
	for _, w := range d.Waiting {
		seen[w.Job]++
	}
	for _, r := range d.Refused {
		seen[r.Job]++
	}
	for _, j := range s.Pending {
		if seen[j.ID] != 1 {
			t.Errorf("job %s appears %d times in the decision", j.ID, seen[j.ID])
		}
	}
	free := map[string]Resources{}
	for _, n := range s.Nodes {
		free[n.Name] = n.Capacity.minus(n.Unmanaged)
	}
	stopping := map[string]bool{}
	for _, p := range d.Preempt {
		stopping[p.Victim] = true
	}
	for _, r := range s.Running {
		for _, a := range r.Placement {
			free[a.Node] = free[a.Node].minus(r.PerMember.times(a.Members))
		}
	}
	byID := map[string]Job{}
	for _, j := range s.Pending {
		byID[j.ID] = j
	}
	for _, a := range d.Admit {
		j := byID[a.Job]
		members := 0
		for _, na := range a.Placement {
			members += na.Members
			free[na.Node] = free[na.Node].minus(j.PerMember.times(na.Members))
		}
		if members != j.Members {
			t.Errorf("admission of %s places %d of %d members", a.Job, members, j.Members)
		}
	}
	for n, r := range free {
		if r.GPUs < 0 || r.CPUMHz < 0 || r.MemoryMB < 0 {
			t.Errorf("node %s overcommitted: %+v free after admissions", n, r)
		}
	}
}
