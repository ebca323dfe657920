package sim

import (
	"container/heap"
	"fmt"
	"slices"
	"time"

	"github.com/gpujob/gpujob/internal/queue/policy"
)

// Policy is one way of running the queue.
type Policy struct {
	Name string
	// Gangs false places members one at a time, in strict FIFO order, as
	// a scheduler that knows no gangs would: a partly placed gang holds
	// its GPUs idle until its last member is placed.
	Gangs   bool
	Disable policy.Features
}

// Policies are the policies compared, from the plainest to the full one.
func Policies() []Policy {
	return []Policy{
		{Name: "fifo, no gangs", Gangs: false, Disable: policy.Features{Backfill: true, FairShare: true, Preemption: true}},
		{Name: "gang fifo", Gangs: true, Disable: policy.Features{Backfill: true, FairShare: true, Preemption: true}},
		{Name: "gang + backfill", Gangs: true, Disable: policy.Features{FairShare: true, Preemption: true}},
		{Name: "gang + backfill + fair share", Gangs: true, Disable: policy.Features{Preemption: true}},
	}
}

// Result is what one policy did with one trace.
type Result struct {
	Policy string
	Jobs   int
	// Utilisation is useful GPU-seconds (GPUs × run time of each job) over
	// the cluster's GPU-seconds until the last job ends.
	Utilisation      float64
	MeanJCT, P95JCT  time.Duration // completion − submission
	Makespan         time.Duration // first submission to last completion
	IdleHeldGPUHours float64       // held by partly placed gangs, doing nothing
	// BackloggedUtilisation is the same while some job waits: the part of
	// the run a policy is responsible for (a long last job drags the whole-
	// run figure down for every policy alike).
	BackloggedUtilisation float64
	// TeamShare is each team's part of the GPUs in use while every team
	// has a job waiting (when fair share has something to divide);
	// TeamWeight its weight's part of all weights, for comparison.
	TeamShare, TeamWeight map[string]float64
	Decisions             int
	Preemptions           int
}

// unit is what the simulator hands the policy: a whole gang, or with
// Gangs false one member of one.
type unit struct {
	id       string
	job      int // index in the trace
	running  bool
	startGen int // bumps at each start, so a stale completion is ignored
	placedAt time.Time
	place    []policy.NodeAlloc
}

// Run simulates the trace under one policy. Deterministic.
func Run(tr Trace, teams []Team, p Policy) (Result, error) {
	base := time.Unix(0, 0).UTC()
	cfg := policy.Config{Disable: p.Disable}
	var weights float64
	for _, t := range teams {
		cfg.Queues = append(cfg.Queues, policy.QueueConfig{Name: t.Name, Weight: t.Weight})
		weights += t.Weight
	}
	nodes := make([]policy.Node, tr.Nodes)
	for i := range nodes {
		nodes[i] = policy.Node{Name: fmt.Sprintf("node-%03d", i), Capacity: policy.Resources{GPUs: tr.GPUsPerNode}}
	}
	e := &engine{base: base, tr: tr, p: p, units: map[string]*unit{}, placed: make([]int, len(tr.Jobs)),
		done: make([]time.Time, len(tr.Jobs)), started: make([]bool, len(tr.Jobs)), share: map[string]float64{},
		teamBusy: map[string]int{}, teamPending: map[string]int{}, contendedUse: map[string]float64{}}
	state := policy.State{Config: cfg, Nodes: nodes}
	next := 0
	e.last = base
	for next < len(tr.Jobs) || e.completions.Len() > 0 {
		now := base.Add(1<<62 - 1)
		if next < len(tr.Jobs) {
			now = base.Add(tr.Jobs[next].Submit)
		}
		if e.completions.Len() > 0 && e.completions[0].at.Before(now) {
			now = e.completions[0].at
		}
		e.account(now, teams)
		for e.completions.Len() > 0 && !e.completions[0].at.After(now) {
			e.complete(heap.Pop(&e.completions).(completion))
		}
		for ; next < len(tr.Jobs) && !base.Add(tr.Jobs[next].Submit).After(now); next++ {
			e.submit(next)
		}
		// Decide until no preemption is asked for: a victim stops at once
		// here, so its preemptor is decided again at the same instant.
		for range 10 {
			state.Now, state.Pending, state.Running = now, e.pending, e.runningState()
			d, err := policy.Decide(state)
			if err != nil {
				return Result{}, err
			}
			e.decisions++
			if len(d.Refused) > 0 {
				return Result{}, fmt.Errorf("%s: refused %s: %v", p.Name, d.Refused[0].Job, d.Refused[0].Err)
			}
			e.apply(d, now)
			if len(d.Preempt) == 0 {
				break
			}
		}
	}
	return e.result(tr, teams, weights, base), nil
}

type engine struct {
	base        time.Time
	tr          Trace
	p           Policy
	units       map[string]*unit
	pending     []policy.Job
	running     []*unit
	placed      []int // members placed, per job
	started     []bool
	done        []time.Time
	completions completionHeap
	idleHeld    float64 // GPU-seconds
	share       map[string]float64
	useful      float64
	decisions   int
	preemptions int
	// For the backlogged figures: the last event, GPUs each team holds
	// with a started job, and pending units per team.
	last             time.Time
	teamBusy         map[string]int
	teamPending      map[string]int
	backloggedSecs   float64
	backloggedUseful float64
	contendedUse     map[string]float64
}

// account adds the interval since the last event to the backlogged figures.
func (e *engine) account(now time.Time, teams []Team) {
	dt := now.Sub(e.last).Seconds()
	e.last = now
	if dt <= 0 || len(e.pending) == 0 {
		return
	}
	busy := 0
	for _, g := range e.teamBusy {
		busy += g
	}
	e.backloggedSecs += dt
	e.backloggedUseful += float64(busy) * dt
	for _, t := range teams {
		if e.teamPending[t.Name] == 0 {
			return
		}
	}
	for _, t := range teams {
		e.contendedUse[t.Name] += float64(e.teamBusy[t.Name]) * dt
	}
}

func (e *engine) submit(i int) {
	tj := e.tr.Jobs[i]
	j := policy.Job{Queue: tj.Team, Members: tj.Members, PerMember: policy.Resources{GPUs: tj.PerMemberGPUs},
		SubmittedAt: e.base.Add(tj.Submit), MaxRuntime: tj.MaxRuntime}
	if e.p.Gangs {
		j.ID = tj.ID
		e.units[j.ID] = &unit{id: j.ID, job: i}
		e.pending = append(e.pending, j)
		e.teamPending[tj.Team]++
		return
	}
	j.Members = 1
	for m := range tj.Members {
		j.ID = fmt.Sprintf("%s#%d", tj.ID, m)
		e.units[j.ID] = &unit{id: j.ID, job: i}
		e.pending = append(e.pending, j)
		e.teamPending[tj.Team]++
	}
}

func (e *engine) runningState() []policy.Running {
	out := make([]policy.Running, 0, len(e.running))
	for _, u := range e.running {
		tj := e.tr.Jobs[u.job]
		members := tj.Members
		if !e.p.Gangs {
			members = 1
		}
		out = append(out, policy.Running{
			Job: policy.Job{ID: u.id, Queue: tj.Team, Members: members,
				PerMember: policy.Resources{GPUs: tj.PerMemberGPUs}, MaxRuntime: tj.MaxRuntime},
			StartedAt: u.placedAt, Placement: u.place})
	}
	return out
}

func (e *engine) apply(d policy.Decision, now time.Time) {
	admitted := map[string]bool{}
	for _, p := range d.Preempt {
		e.preemptions++
		e.stop(e.units[p.Victim])
		// Back in the queue as submitted, its work lost (no checkpoints here).
		tj := e.tr.Jobs[e.units[p.Victim].job]
		e.teamPending[tj.Team]++
		e.pending = append(e.pending, policy.Job{ID: p.Victim, Queue: tj.Team, Members: tj.Members,
			PerMember: policy.Resources{GPUs: tj.PerMemberGPUs}, SubmittedAt: e.base.Add(tj.Submit), MaxRuntime: tj.MaxRuntime})
	}
	nominated := map[string]bool{}
	for _, p := range d.Preempt {
		nominated[p.Preemptor] = true
	}
	for _, a := range d.Admit {
		admitted[a.Job] = true
		u := e.units[a.Job]
		e.teamPending[e.tr.Jobs[u.job].Team]--
		u.running, u.placedAt, u.place = true, now, a.Placement
		u.startGen++
		e.running = append(e.running, u)
		e.placed[u.job]++
		tj := e.tr.Jobs[u.job]
		if e.p.Gangs || e.placed[u.job] == tj.Members {
			e.startJob(u.job, now)
		}
	}
	kept := e.pending[:0]
	for _, j := range e.pending {
		if !admitted[j.ID] {
			j.Nominated = j.Nominated || nominated[j.ID]
			kept = append(kept, j)
		}
	}
	e.pending = kept
}

// startJob starts a job once all its members are placed.
func (e *engine) startJob(i int, now time.Time) {
	tj := e.tr.Jobs[i]
	e.started[i] = true
	e.teamBusy[tj.Team] += tj.GPUs()
	if !e.p.Gangs {
		for m := range tj.Members {
			u := e.units[fmt.Sprintf("%s#%d", tj.ID, m)]
			e.idleHeld += now.Sub(u.placedAt).Seconds() * float64(tj.PerMemberGPUs)
		}
	}
	heap.Push(&e.completions, completion{at: now.Add(tj.Duration), job: i, gen: e.gen(i)})
}

// gen is the start generation of a job's first unit: a completion of an
// earlier start (before a preemption) no longer matches it.
func (e *engine) gen(i int) int {
	id := e.tr.Jobs[i].ID
	if !e.p.Gangs {
		id += "#0"
	}
	return e.units[id].startGen
}

func (e *engine) stop(u *unit) {
	if tj := e.tr.Jobs[u.job]; e.started[u.job] {
		e.teamBusy[tj.Team] -= tj.GPUs()
	}
	u.running = false
	e.placed[u.job]--
	e.started[u.job] = false
	e.running = slices.DeleteFunc(e.running, func(r *unit) bool { return r == u })
}

func (e *engine) complete(c completion) {
	if !e.started[c.job] || e.gen(c.job) != c.gen {
		return // preempted since
	}
	tj := e.tr.Jobs[c.job]
	ids := []string{tj.ID}
	if !e.p.Gangs {
		ids = ids[:0]
		for m := range tj.Members {
			ids = append(ids, fmt.Sprintf("%s#%d", tj.ID, m))
		}
	}
	gone := map[*unit]bool{}
	for _, id := range ids {
		u := e.units[id]
		u.running = false
		gone[u] = true
	}
	e.running = slices.DeleteFunc(e.running, func(r *unit) bool { return gone[r] })
	e.done[c.job] = c.at
	e.teamBusy[tj.Team] -= tj.GPUs()
	work := float64(tj.GPUs()) * tj.Duration.Seconds()
	e.useful += work
	e.share[tj.Team] += work
}

func (e *engine) result(tr Trace, teams []Team, weights float64, base time.Time) Result {
	r := Result{Policy: e.p.Name, Jobs: len(tr.Jobs), IdleHeldGPUHours: e.idleHeld / 3600,
		TeamShare: map[string]float64{}, TeamWeight: map[string]float64{}, Decisions: e.decisions, Preemptions: e.preemptions}
	var jcts []time.Duration
	var sum time.Duration
	var last time.Time
	for i, tj := range tr.Jobs {
		jct := e.done[i].Sub(base.Add(tj.Submit))
		jcts = append(jcts, jct)
		sum += jct
		if e.done[i].After(last) {
			last = e.done[i]
		}
	}
	slices.Sort(jcts)
	if len(jcts) > 0 {
		r.MeanJCT = sum / time.Duration(len(jcts))
		r.P95JCT = jcts[(len(jcts)*95+99)/100-1]
		r.Makespan = last.Sub(base.Add(tr.Jobs[0].Submit))
		r.Utilisation = e.useful / (float64(tr.Nodes*tr.GPUsPerNode) * last.Sub(base).Seconds())
	}
	if e.backloggedSecs > 0 {
		r.BackloggedUtilisation = e.backloggedUseful / (float64(tr.Nodes*tr.GPUsPerNode) * e.backloggedSecs)
	}
	var contended float64
	for _, u := range e.contendedUse {
		contended += u
	}
	for _, t := range teams {
		if contended > 0 {
			r.TeamShare[t.Name] = e.contendedUse[t.Name] / contended
		}
		r.TeamWeight[t.Name] = t.Weight / weights
	}
	return r
}

type completion struct {
	at  time.Time
	job int
	gen int
}

type completionHeap []completion

func (h completionHeap) Len() int { return len(h) }
func (h completionHeap) Less(i, k int) bool {
	if !h[i].at.Equal(h[k].at) {
		return h[i].at.Before(h[k].at)
	}
	return h[i].job < h[k].job
}
func (h completionHeap) Swap(i, k int) { h[i], h[k] = h[k], h[i] }
func (h *completionHeap) Push(x any)   { *h = append(*h, x.(completion)) }
func (h *completionHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}
