package policy

import "time"

// Resources is what one gang member needs on one node, or what a node has.
// GPUs are the resource the policy is about; CPU and memory are counted
// so that a gang is not admitted onto GPUs it could not use.
type Resources struct {
	GPUs     int
	CPUMHz   int
	MemoryMB int
}

func (r Resources) plus(o Resources) Resources {
	return Resources{r.GPUs + o.GPUs, r.CPUMHz + o.CPUMHz, r.MemoryMB + o.MemoryMB}
}

func (r Resources) minus(o Resources) Resources {
	return Resources{r.GPUs - o.GPUs, r.CPUMHz - o.CPUMHz, r.MemoryMB - o.MemoryMB}
}

func (r Resources) times(n int) Resources {
	return Resources{r.GPUs * n, r.CPUMHz * n, r.MemoryMB * n}
}

func (r Resources) min(o Resources) Resources {
	return Resources{min(r.GPUs, o.GPUs), min(r.CPUMHz, o.CPUMHz), min(r.MemoryMB, o.MemoryMB)}
}

// countIn is how many r fit into free. A zero component asks for nothing
// of that resource, so it does not limit the count.
func (r Resources) countIn(free Resources) int {
	n := maxMembers
	limit := func(need, have int) {
		if need > 0 {
			n = min(n, max(have, 0)/need)
		}
	}
	limit(r.GPUs, free.GPUs)
	limit(r.CPUMHz, free.CPUMHz)
	limit(r.MemoryMB, free.MemoryMB)
	return n
}

// maxMembers bounds countIn for a member that asks for nothing.
const maxMembers = 1 << 30

// Kind is what a job runs; it sets the default class.
type Kind int

const (
	KindTrain Kind = iota
	KindTrial
	KindService
)

func (k Kind) String() string {
	switch k {
	case KindTrial:
		return "trial"
	case KindService:
		return "service"
	}
	return "job"
}

// Class ranks above priority: every gang of a higher class goes before
// (and may preempt, inside its queue) every gang of a lower one.
type Class int

const (
	// ClassFromKind (the zero value) means: services are ClassService,
	// everything else ClassBatch.
	ClassFromKind Class = iota
	ClassBatch
	ClassService
)

func (c Class) String() string {
	if c == ClassService {
		return "service"
	}
	return "batch"
}

// DefaultPriority is a job's priority when neither it nor its queue sets
// one; it matches the spec's default.
const DefaultPriority = 50

// DefaultQueue is the queue that exists when the configuration declares
// none, and the queue of a job that names none.
const DefaultQueue = "default"

// QueueConfig is one `queue "NAME" { ... }` block.
type QueueConfig struct {
	Name string
	// GPUs is the queue's quota; 0 means no quota (the whole cluster).
	GPUs int
	// Weight is the queue's fair-share weight; 0 means 1.
	Weight float64
	// Borrow lets the queue use quota its cohort's other queues leave idle
	// (which they reclaim, by preemption, when they need it).
	Borrow bool
	// Priority is the priority of the queue's jobs that set none; 0 means
	// DefaultPriority.
	Priority int
	// Cohort groups queues that lend each other idle quota; queues that
	// name none share one cohort.
	Cohort string
}

// Features turns parts of the policy off, for comparisons (the simulator)
// and for operators who want plain FIFO. The zero value is the full policy.
type Features struct {
	Backfill, FairShare, Preemption bool
}

// Config is the queue configuration.
type Config struct {
	Queues  []QueueConfig
	Disable Features
}

// Node is one client node.
type Node struct {
	Name     string
	Capacity Resources
	// Unmanaged is what allocations the queue does not manage use on the
	// node (other Nomad jobs); it is never free to the queue.
	Unmanaged Resources
}

// Job is a gang: Members identical members, each needing PerMember on one
// node, all placed at once or not at all.
type Job struct {
	ID    string
	Queue string // "" means DefaultQueue
	Kind  Kind
	Class Class
	// Priority: 0 means the queue's priority.
	Priority    int
	Members     int
	PerMember   Resources
	SubmittedAt time.Time
	// MaxRuntime bounds the run; 0 means unknown (no estimate of its end).
	MaxRuntime time.Duration
	// Nominated marks a job whose victims an earlier Decision named and the
	// controller is stopping; it goes first, so the GPUs it preempted for
	// reach it and not a job that happens to sort ahead.
	Nominated bool
}

// GPUs is the gang's total GPU count.
func (j Job) GPUs() int { return j.PerMember.GPUs * j.Members }

// NodeAlloc is how many members of a gang are (or go) on one node.
type NodeAlloc struct {
	Node    string
	Members int
}

// Running is an admitted gang that holds resources.
type Running struct {
	Job
	StartedAt time.Time
	// LastCheckpoint is when the gang last saved a checkpoint it can resume
	// from; zero when unknown (then all work since StartedAt is at stake).
	LastCheckpoint time.Time
	Placement      []NodeAlloc
	// Stopping marks a gang being stopped (preempted, cancelled): it still
	// holds its resources, is not chosen as a victim again, and is assumed
	// to release them now when start times are estimated.
	Stopping bool
}

// State is everything Decide looks at.
type State struct {
	Config  Config
	Nodes   []Node
	Running []Running
	Pending []Job
	Now     time.Time
}

// Decision is what the caller should do, and why the rest waits.
type Decision struct {
	// Admit lists the gangs to start now, in order.
	Admit []Admission
	// Preempt lists the gangs to stop (whole gangs) so that a preemptor can
	// start; the preemptor waits (Cause PreemptionPending) and should be
	// marked Nominated in the next State.
	Preempt []Preemption
	// Waiting lists every other pending job, in queue order.
	Waiting []Waiting
	// Refused lists pending jobs that can never start as configured.
	Refused []Refusal
}

// Admission is a gang to start.
type Admission struct {
	Job string
	// Placement is where the policy counted the members; advice for the
	// scheduler, which may place them elsewhere on equal terms.
	Placement []NodeAlloc
	// BorrowedGPUs is how many of its GPUs exceed its queue's quota.
	BorrowedGPUs int
	// Backfilled is true when it starts ahead of a waiting head.
	Backfilled bool
}

// Preemption is one gang to stop, for one preemptor.
type Preemption struct {
	Victim     string
	Preemptor  string
	GPUSeconds float64 // work lost: GPUs × seconds since start or checkpoint
	Reason     string
}

// Refusal is a pending job that can never start, with why.
type Refusal struct {
	Job string
	Err error
}
