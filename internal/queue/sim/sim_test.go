package sim

import (
	"flag"
	"reflect"
	"testing"
	"time"
)

var full = flag.Bool("sim.full", false, "simulate the full-scale trace (250 × 8 GPUs, 10,000 jobs) and print the table")

func teams() []Team {
	return []Team{{Name: "team-a", Weight: 2, Part: 0.3}, {Name: "team-b", Weight: 1, Part: 0.5}, {Name: "team-c", Weight: 1, Part: 0.2}}
}

// The small trace: contended enough that the policies differ.
func smallTrace() Trace { return PhillyLike(7, 600, 16, 8, 1.5, teams()) }

func TestTraceIsDeterministicAndShaped(t *testing.T) {
	a, b := smallTrace(), smallTrace()
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed, different traces")
	}
	big := PhillyLike(1, 10000, 250, 8, 0.9, teams())
	ones, tail := 0, 0
	for _, j := range big.Jobs {
		switch {
		case j.GPUs() == 1:
			ones++
		case j.GPUs() >= 16:
			tail++
		}
		if j.MaxRuntime < j.Duration || j.Duration < time.Minute || j.Duration > 7*24*time.Hour {
			t.Fatalf("job %+v breaks the trace's bounds", j)
		}
	}
	if ones < 6500 || ones > 7500 || tail < 200 || tail > 400 {
		t.Fatalf("%d one-GPU jobs and %d of 16+ in 10,000; want about 7,000 and 300", ones, tail)
	}
}

func TestPoliciesOnOneTrace(t *testing.T) {
	tr := smallTrace()
	var results []Result
	for _, p := range Policies() {
		r, err := Run(tr, teams(), p)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, r)
		if r.Utilisation <= 0 || r.Utilisation > 1 {
			t.Errorf("%s: utilisation %v", p.Name, r.Utilisation)
		}
		if p.Gangs && r.IdleHeldGPUHours != 0 {
			t.Errorf("%s: gangs held %v GPU-hours idle", p.Name, r.IdleHeldGPUHours)
		}
		if !p.Gangs && r.IdleHeldGPUHours <= 0 {
			t.Errorf("%s: members placed one by one held no GPU idle on a contended trace", p.Name)
		}
		if r.Preemptions != 0 {
			t.Errorf("%s: %d preemptions with preemption off", p.Name, r.Preemptions)
		}
	}
	again, _ := Run(tr, teams(), Policies()[3])
	if !reflect.DeepEqual(again, results[3]) {
		t.Error("same trace and policy, different results")
	}
	// Backfill only starts jobs that fit and cannot delay the head, so it
	// should not finish later than plain gang FIFO on this trace.
	if results[2].Makespan > results[1].Makespan+time.Hour {
		t.Errorf("backfill makespan %v > gang fifo %v", results[2].Makespan, results[1].Makespan)
	}
	t.Logf("\n%s\n%s", tr.Description, Table(results, teams()))
}

// TestFullScale prints the comparison at the scale:
//
//	go test ./internal/queue/sim -run TestFullScale -v -timeout 30m -args -sim.full
func TestFullScale(t *testing.T) {
	if !*full {
		t.Skip("run with -sim.full")
	}
	tr := PhillyLike(2019, 10000, 250, 8, 1.5, teams())
	var results []Result
	for _, p := range Policies() {
		start := time.Now()
		r, err := Run(tr, teams(), p)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, r)
		t.Logf("%s: %d decisions in %v", p.Name, r.Decisions, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("\n%s\n%s", tr.Description, Table(results, teams()))
}
