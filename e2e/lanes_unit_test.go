package e2e

import (
	"testing"
)

// The scheduler's rules, without clusters: a lane per running test, a
// cluster to one test at a time, the shared clusters' users first, a test
// waiting for a busy cluster holding no lane, a second claim of a running
// test needing no lane, and everything given back at the test's end.
func TestSchedulerLanesAndOrder(t *testing.T) {
	s := newScheduler(2)
	dev0, dev1 := &cluster{dir: "dev0"}, &cluster{dir: "dev1"}
	s.add(devKey(0), dev0)
	s.add("secure", nil)
	claim := func(name string, keys ...string) *claimant {
		w := &claimant{keys: keys, needLane: s.held[name] == nil, shared: keys[0] == "secure",
			granted: make(chan string, 1)}
		s.mu.Lock()
		s.waiting = append(s.waiting, w)
		s.mu.Unlock()
		return w
	}
	got := func(w *claimant) string {
		select {
		case k := <-w.granted:
			return k
		default:
			return ""
		}
	}
	hold := func(name string, w *claimant, key string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		h := s.held[name]
		if h == nil {
			h = &holding{}
			s.held[name] = h
		}
		h.lane = h.lane || w.needLane
		h.keys = append(h.keys, key)
	}
	dispatch := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.dispatchLocked()
	}

	// Arrival order: two dev tests, then two users of the shared cluster.
	a := claim("A", devKey(0), devKey(1))
	b := claim("B", devKey(0), devKey(1))
	c := claim("C", "secure")
	d := claim("D", "secure")
	dispatch()
	// C goes first (shared), then A takes the one dev cluster that is up;
	// D waits for C's cluster without taking the second lane's place, but
	// no lane is left anyway.
	if k := got(c); k != "secure" {
		t.Fatalf("C got %q, want the secure cluster", k)
	}
	hold("C", c, "secure")
	if k := got(a); k != devKey(0) {
		t.Fatalf("A got %q, want %s", k, devKey(0))
	}
	hold("A", a, devKey(0))
	if k, k2 := got(b), got(d); k != "" || k2 != "" {
		t.Fatalf("B and D got %q and %q with both lanes taken", k, k2)
	}

	// Lane 1's cluster comes up: no lane is free, so nobody gets it.
	s.add(devKey(1), dev1)
	if k := got(b); k != "" {
		t.Fatalf("B got %q without a lane", k)
	}
	// A second claim of a running test needs only the cluster: A asks for
	// the secure cluster too, and waits for it, not for a lane.
	a2 := claim("A", "secure")
	if a2.needLane {
		t.Fatal("A's second claim asks for a lane")
	}

	// C ends: its lane and cluster are free. D (shared) goes before B for
	// the lane, and before A's second claim for the cluster (it came
	// first).
	s.release("C")
	if k := got(d); k != "secure" {
		t.Fatalf("after C, D got %q, want the secure cluster", k)
	}
	hold("D", d, "secure")
	if k := got(a2); k != "" {
		t.Fatalf("A's second claim got %q while D holds it", k)
	}
	if k := got(b); k != "" {
		t.Fatalf("B got %q: D took the free lane", k)
	}

	// D ends: A gets the secure cluster (no lane needed), B the free lane
	// and dev cluster 1.
	s.release("D")
	if k := got(a2); k != "secure" {
		t.Fatalf("A's second claim got %q", k)
	}
	hold("A", a2, "secure")
	if k := got(b); k != devKey(1) {
		t.Fatalf("B got %q, want %s", k, devKey(1))
	}
	hold("B", b, devKey(1))
	// A ends: both its clusters and its lane come back.
	s.release("A")
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lanes != 1 || s.busy[devKey(0)] || s.busy["secure"] || !s.busy[devKey(1)] || len(s.waiting) != 0 {
		t.Fatalf("after A: lanes %d, busy %v, %d waiting", s.lanes, s.busy, len(s.waiting))
	}
}
