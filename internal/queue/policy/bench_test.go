package policy

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// benchState is 250 nodes × 8 GPUs, about 90 % of them held by running
// gangs with max runtimes, and 10,000 pending jobs of Philly-like sizes in
// three weighted queues.
func benchState() State {
	rng := rand.New(rand.NewPCG(25, 25))
	nodes := gpuNodes(250, 8)
	cfg := Config{Queues: []QueueConfig{
		{Name: "team-a", GPUs: 1000, Weight: 2, Borrow: true},
		{Name: "team-b", GPUs: 600, Weight: 1, Borrow: true},
		{Name: "team-c", GPUs: 400, Weight: 1, Borrow: false},
	}}
	queues := []string{"team-a", "team-b", "team-c"}
	size := func() (members, per int) {
		switch u := rng.Float64(); {
		case u < 0.7:
			return 1, 1
		case u < 0.8:
			return 2, 1
		case u < 0.9:
			return 1, 4
		case u < 0.97:
			return 1, 8
		case u < 0.99:
			return 2, 8
		default:
			return 4, 8
		}
	}
	var run []Running
	free := make([]int, len(nodes))
	for i := range free {
		free[i] = 8
	}
	for n := range nodes {
		for free[n] > 1 {
			per := min(1<<rng.IntN(4), free[n]-1)
			if per < 1 {
				break
			}
			free[n] -= per
			j := withRuntime(Job{ID: fmt.Sprintf("r%d-%d", n, free[n]), Queue: queues[rng.IntN(3)], Members: 1,
				PerMember: Resources{GPUs: per}}, time.Duration(1+rng.IntN(48))*time.Hour)
			r := Running{Job: j, StartedAt: t0.Add(-time.Duration(rng.IntN(3600)) * time.Second),
				Placement: []NodeAlloc{{Node: nodes[n].Name, Members: 1}}}
			run = append(run, r)
		}
	}
	var pending []Job
	for i := range 10000 {
		m, per := size()
		j := gang(fmt.Sprintf("p%05d", i), queues[rng.IntN(3)], m, per, i)
		if rng.IntN(10) > 0 {
			j.MaxRuntime = time.Duration(1+rng.IntN(24*60)) * time.Minute
		}
		pending = append(pending, j)
	}
	return State{Config: cfg, Nodes: nodes, Running: run, Pending: pending, Now: t0}
}

// BenchmarkDecide10kPending2kGPUs times one Decide; it reports the median,
// min and max of the b.N calls it makes (run with -benchtime=Nx, N ≥ 5),
// since ReportMetric keeps only one value per metric.
func BenchmarkDecide10kPending2kGPUs(b *testing.B) {
	s := benchState()
	var times []time.Duration
	var admitted, waiting int
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		d, err := Decide(s)
		times = append(times, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		admitted, waiting = len(d.Admit), len(d.Waiting)
	}
	b.StopTimer()
	slices.Sort(times)
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	b.ReportMetric(ms(times[len(times)/2]), "median-ms")
	b.ReportMetric(ms(times[0]), "min-ms")
	b.ReportMetric(ms(times[len(times)-1]), "max-ms")
	b.ReportMetric(float64(len(times)), "runs")
	b.ReportMetric(float64(admitted), "admitted")
	b.ReportMetric(float64(waiting), "waiting")
}
