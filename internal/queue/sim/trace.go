// Package sim is a discrete-event simulator of a GPU cluster that drives
// the queue policy (internal/queue/policy) on a synthetic trace, to compare
// policies (FIFO without gangs, gang FIFO, backfill, fair share) on the
// same jobs. It is deterministic for a seed and reads no clock.
package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// TraceJob is one job of a trace.
type TraceJob struct {
	ID     string
	Team   string
	Submit time.Duration // since the trace's start
	// Members × PerMemberGPUs GPUs, each member on one node.
	Members, PerMemberGPUs int
	// Duration is how long it really runs; MaxRuntime what it declares.
	Duration, MaxRuntime time.Duration
}

// GPUs is the job's total GPU count.
func (j TraceJob) GPUs() int { return j.Members * j.PerMemberGPUs }

// Trace is a cluster and the jobs submitted to it.
type Trace struct {
	Nodes, GPUsPerNode int
	Jobs               []TraceJob
	Description        string
}

// Team is a tenant: its queue's fair-share weight and its part of the jobs.
type Team struct {
	Name   string
	Weight float64
	Part   float64 // fraction of the jobs it submits
}

// PhillyShapeDescription says what PhillyLike draws from. The shapes follow
// what Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for
// DNN Training Workloads" (USENIX ATC 2019), report for Microsoft's Philly
// cluster: most jobs use one GPU with a tail of 2/4/8/16+ GPU jobs, and run
// times are heavy-tailed from minutes to days. The parameters below are
// ours, fitted by hand to that published shape — not fitted to, sampled
// from or checked against the raw trace.
const PhillyShapeDescription = "synthetic, Philly-shaped (Jeon et al., ATC 2019), parameters fitted by hand to the paper's reported shape, not the raw trace: " +
	"GPUs per job 1 (70%), 2 (10%), 4 (10%), 8 (7%), 16 (2%), 32 (1%); " +
	"jobs of up to 8 GPUs are one member holding all of them (half) or one member per GPU (half), larger jobs are members of 8 GPUs; " +
	"run time log-normal with median 30 min and sigma 1.8, clipped to [1 min, 7 days]; " +
	"declared max_runtime = run time × U(1, 3); Poisson arrivals at the rate that offers the given load"

// PhillyLike draws n jobs for a cluster of nodes × gpusPerNode GPUs at the
// given offered load (GPU-seconds asked per GPU-second available), split
// among teams by their Part. Same arguments, same trace.
func PhillyLike(seed uint64, n, nodes, gpusPerNode int, load float64, teams []Team) Trace {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	// GPUs per job, cumulative.
	gpuSizes := []struct {
		gpus int
		cum  float64
	}{{1, 0.70}, {2, 0.80}, {4, 0.90}, {8, 0.97}, {16, 0.99}, {32, 1.0}}
	jobs := make([]TraceJob, n)
	var work float64 // GPU-seconds
	for i := range jobs {
		u := rng.Float64()
		size := gpuSizes[len(gpuSizes)-1].gpus
		for _, s := range gpuSizes {
			if u < s.cum {
				size = s.gpus
				break
			}
		}
		members, per := 1, size
		switch {
		case size > 8:
			members, per = size/8, 8
		case size > 1 && rng.Float64() < 0.5:
			members, per = size, 1
		}
		secs := math.Exp(math.Log(30*60) + 1.8*rng.NormFloat64())
		secs = min(max(secs, 60), 7*24*3600)
		dur := time.Duration(secs) * time.Second
		maxRuntime := time.Duration(float64(dur) * (1 + 2*rng.Float64())).Round(time.Second)
		team := teams[len(teams)-1].Name
		v, acc := rng.Float64(), 0.0
		for _, t := range teams {
			if acc += t.Part; v < acc {
				team = t.Name
				break
			}
		}
		jobs[i] = TraceJob{ID: fmt.Sprintf("j%05d", i), Team: team, Members: members, PerMemberGPUs: per,
			Duration: dur, MaxRuntime: max(maxRuntime, dur)}
		work += float64(size) * dur.Seconds()
	}
	// Arrivals: Poisson, at the rate that makes the offered load `load`.
	rate := load * float64(nodes*gpusPerNode) / (work / float64(n)) // jobs per second
	var at float64
	for i := range jobs {
		at += rng.ExpFloat64() / rate
		jobs[i].Submit = time.Duration(at * float64(time.Second)).Round(time.Second)
	}
	return Trace{Nodes: nodes, GPUsPerNode: gpusPerNode, Jobs: jobs,
		Description: fmt.Sprintf("%s; seed %d, %d jobs, %d × %d GPUs, offered load %.2f", PhillyShapeDescription, seed, n, nodes, gpusPerNode, load)}
}
