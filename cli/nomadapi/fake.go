package nomadapi

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"
)

// Fake is an in-memory API for unit tests: jobs, allocations, nodes, node
// stats and task logs are set by the test, and the fake answers like Nomad
// (404 errors worded as the real client's; job meta in job list stubs only
// when asked with Params["meta"] = "true", node resources in node list
// stubs only with Params["resources"] = "true"; allocation list stubs
// without AllocatedResources).
//
// Every change bumps a Raft-like index. A blocking query (WaitIndex set and
// not below the current index) first calls OnBlock, if set, which may change
// the state (a scripted scenario, deterministic and without goroutines); if
// the index still has not moved it waits for a change from another goroutine,
// for at most WaitTime when one is given.
//
// What the fake returns is a deep copy, so a test may change the state while
// a command runs. The zero value is not usable: call NewFake.
type Fake struct {
	mu      sync.Mutex
	changed *sync.Cond
	index   uint64

	addr   string
	jobs   map[string]*api.Job // by ID
	allocs map[string]*api.Allocation
	nodes  map[string]*api.Node
	stats  map[string]*api.HostStats
	evals  map[string]*api.Evaluation
	logs   map[logKey]*fakeLog
	errs   map[string]error
	evalNo int

	// ACLs: whether enabled (SetACLEnabled), and what the ACL and
	// variable calls made (fake_admin.go).
	aclEnabled bool
	policies   map[string]*api.ACLPolicy
	tokens     map[string]*api.ACLToken // by accessor ID
	vars       map[string]*api.Variable // by path
	tokenNo    int

	// Services (fake_service.go): every registered version of a job,
	// oldest first, and the deployments SetDeployment gave.
	history     map[string][]*api.Job
	deployments map[string]*api.Deployment

	// OnBlock, when set, is called (without the fake's lock held) when a
	// blocking query would block; query is the method's name and index the
	// current index. It may change the fake's state.
	OnBlock func(f *Fake, query string, index uint64)
	// OnDeregister, when set, is called after a job is deregistered
	// (without the lock held), e.g. to move its allocations to complete.
	OnDeregister func(f *Fake, jobID string, purge bool)

	// ParseHCLFunc, ValidateFunc and PlanFunc answer those calls; unset,
	// ParseHCL fails and Validate and Plan return empty responses.
	ParseHCLFunc func(jobHCL, vars string) (*api.Job, error)
	ValidateFunc func(job *api.Job) (*api.JobValidateResponse, error)
	PlanFunc     func(job *api.Job) (*api.JobPlanResponse, error)

	// Calls made, for assertions.
	Registered     []*api.Job
	Deregistered   []Deregistration
	BlockingQuerys []string // method names of the queries that blocked
}

// Deregistration is one recorded Deregister call.
type Deregistration struct {
	JobID string
	Purge bool
}

type logKey struct{ alloc, task, stream string }

type fakeLog struct {
	chunks  []string
	closed  bool // a follower's stream ends once it has read every chunk
	err     error
	changed chan struct{}
}

// NewFake returns an empty fake whose Address is http://127.0.0.1:4646.
func NewFake() *Fake {
	f := &Fake{
		addr:   "http://127.0.0.1:4646",
		index:  1,
		jobs:   map[string]*api.Job{},
		allocs: map[string]*api.Allocation{},
		nodes:  map[string]*api.Node{},
		stats:  map[string]*api.HostStats{},
		evals:  map[string]*api.Evaluation{},
		logs:   map[logKey]*fakeLog{},
		errs:   map[string]error{},

		policies: map[string]*api.ACLPolicy{},
		tokens:   map[string]*api.ACLToken{},
		vars:     map[string]*api.Variable{},
	}
	f.changed = sync.NewCond(&f.mu)
	return f
}

var _ API = (*Fake)(nil)

// --- setting the state -----------------------------------------------------

// SetAddress sets what Address returns.
func (f *Fake) SetAddress(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addr = addr
}

// Fail makes every call of method (e.g. "Job", "Nodes") return err; nil
// clears it.
func (f *Fake) Fail(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.errs, method)
		return
	}
	f.errs[method] = err
}

// SetJob adds or replaces a job (by ID; Name defaults to the ID).
func (f *Fake) SetJob(job *api.Job) {
	j := clone(job)
	if j.ID == nil {
		panic("fake: SetJob needs a job ID")
	}
	if j.Name == nil {
		j.Name = j.ID
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.jobs[*j.ID] = j
	f.bumpLocked()
}

// RemoveJob removes a job (as a purge does), leaving its allocations.
func (f *Fake) RemoveJob(jobID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.jobs, jobID)
	f.bumpLocked()
}

// SetAlloc adds or replaces an allocation (by ID).
func (f *Fake) SetAlloc(a *api.Allocation) {
	c := clone(a)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	if c.CreateIndex == 0 {
		c.CreateIndex = f.index
	}
	c.ModifyIndex = f.index
	f.allocs[c.ID] = c
	f.changed.Broadcast()
}

// UpdateAlloc changes a stored allocation in place and bumps the index.
func (f *Fake) UpdateAlloc(id string, change func(a *api.Allocation)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.allocs[id]
	if !ok {
		panic("fake: UpdateAlloc of unknown allocation " + id)
	}
	change(a)
	f.index++
	a.ModifyIndex = f.index
	f.changed.Broadcast()
}

// SetNode adds or replaces a node (by ID).
func (f *Fake) SetNode(n *api.Node) {
	c := clone(n)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes[c.ID] = c
	f.bumpLocked()
}

// SetNodeStats sets what NodeStats answers for a node.
func (f *Fake) SetNodeStats(nodeID string, s *api.HostStats) {
	c := clone(s)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stats[nodeID] = c
}

// SetEvaluation adds or replaces an evaluation (by ID).
func (f *Fake) SetEvaluation(e *api.Evaluation) {
	c := clone(e)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.evals[c.ID] = c
	f.bumpLocked()
}

// SetLog replaces a task's log stream ("stdout" or "stderr") with one chunk
// per argument (a chunk may end mid-line; each becomes one frame).
func (f *Fake) SetLog(allocID, task, stream string, chunks ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.logLocked(allocID, task, stream)
	l.chunks = append([]string(nil), chunks...)
	l.notifyLocked()
}

// AppendLog adds chunks to a task's log; followers receive them.
func (f *Fake) AppendLog(allocID, task, stream string, chunks ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.logLocked(allocID, task, stream)
	l.chunks = append(l.chunks, chunks...)
	l.notifyLocked()
}

// CloseLog ends a task's log: followers get what is left, then the end.
func (f *Fake) CloseLog(allocID, task, stream string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.logLocked(allocID, task, stream)
	l.closed = true
	l.notifyLocked()
}

// SetLogError makes Logs for that task and stream fail with err (as Nomad
// does for a task that has not started).
func (f *Fake) SetLogError(allocID, task, stream string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.logLocked(allocID, task, stream)
	l.err = err
	l.notifyLocked()
}

func (f *Fake) logLocked(allocID, task, stream string) *fakeLog {
	k := logKey{allocID, task, stream}
	l, ok := f.logs[k]
	if !ok {
		l = &fakeLog{changed: make(chan struct{})}
		f.logs[k] = l
	}
	return l
}

func (l *fakeLog) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Index is the fake's current index.
func (f *Fake) Index() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.index
}

// Bump advances the index without a change (wakes blocking queries).
func (f *Fake) Bump() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bumpLocked()
}

func (f *Fake) bumpLocked() {
	f.index++
	f.changed.Broadcast()
}

// --- the API ---------------------------------------------------------------

func (f *Fake) Address() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addr
}

func (f *Fake) errLocked(method string) error { return f.errs[method] }

func (f *Fake) ParseHCL(jobHCL, vars string) (*api.Job, error) {
	f.mu.Lock()
	err, fn := f.errLocked("ParseHCL"), f.ParseHCLFunc
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, fmt.Errorf("parsing the jobspec: fake: ParseHCLFunc not set")
	}
	return fn(jobHCL, vars)
}

func (f *Fake) Validate(job *api.Job) (*api.JobValidateResponse, error) {
	f.mu.Lock()
	err, fn := f.errLocked("Validate"), f.ValidateFunc
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if fn == nil {
		return &api.JobValidateResponse{}, nil
	}
	return fn(job)
}

func (f *Fake) Plan(job *api.Job) (*api.JobPlanResponse, error) {
	f.mu.Lock()
	err, fn := f.errLocked("Plan"), f.PlanFunc
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if fn == nil {
		return &api.JobPlanResponse{}, nil
	}
	return fn(job)
}

func (f *Fake) Register(job *api.Job) (*api.JobRegisterResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("Register"); err != nil {
		return nil, err
	}
	j := clone(job)
	if j.ID == nil {
		return nil, fmt.Errorf("registering the job: Unexpected response code: 400 (missing job ID)")
	}
	if j.Name == nil {
		j.Name = j.ID
	}
	if old, ok := f.jobs[*j.ID]; ok && old.Version != nil {
		v := *old.Version + 1
		j.Version = &v
	} else if j.Version == nil {
		v := uint64(0)
		j.Version = &v
	}
	if j.Status == nil {
		s := "pending"
		j.Status = &s
	}
	f.Registered = append(f.Registered, clone(job))
	f.jobs[*j.ID] = j
	if f.history == nil {
		f.history = map[string][]*api.Job{}
	}
	f.history[*j.ID] = append(f.history[*j.ID], clone(j))
	f.bumpLocked()
	return &api.JobRegisterResponse{EvalID: f.newEvalLocked(*j.ID), JobModifyIndex: f.index}, nil
}

func (f *Fake) RegisterNew(job *api.Job) (*api.JobRegisterResponse, error) {
	f.mu.Lock()
	exists := job.ID != nil && f.jobs[*job.ID] != nil
	f.mu.Unlock()
	if exists {
		return nil, fmt.Errorf("registering job %s: %w", *job.ID, ErrJobExists)
	}
	return f.Register(job)
}

func (f *Fake) newEvalLocked(jobID string) string {
	f.evalNo++
	id := fmt.Sprintf("%08d-0000-0000-0000-000000000000", f.evalNo)
	f.evals[id] = &api.Evaluation{ID: id, JobID: jobID, Status: "complete"}
	return id
}

func (f *Fake) Deregister(jobID string, purge bool) (string, error) {
	f.mu.Lock()
	if err := f.errLocked("Deregister"); err != nil {
		f.mu.Unlock()
		return "", err
	}
	j, ok := f.jobs[jobID]
	if !ok {
		f.mu.Unlock()
		return "", notFound("stopping job "+jobID, "job not found")
	}
	f.Deregistered = append(f.Deregistered, Deregistration{JobID: jobID, Purge: purge})
	if purge {
		delete(f.jobs, jobID)
	} else {
		stop, dead := true, "dead"
		j.Stop, j.Status = &stop, &dead
	}
	for _, a := range f.allocs {
		if a.JobID == jobID {
			a.DesiredStatus = "stop"
			a.DesiredDescription = "alloc is being stopped due to job being stopped"
		}
	}
	id := f.newEvalLocked(jobID)
	f.bumpLocked()
	hook := f.OnDeregister
	f.mu.Unlock()
	if hook != nil {
		hook(f, jobID, purge)
	}
	return id, nil
}

func (f *Fake) Job(jobID string) (*api.Job, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("Job"); err != nil {
		return nil, err
	}
	j, ok := f.jobs[jobID]
	if !ok {
		return nil, notFound("reading job "+jobID, "job not found")
	}
	return clone(j), nil
}

func (f *Fake) Jobs(q *api.QueryOptions) ([]*api.JobListStub, *api.QueryMeta, error) {
	if err := f.block("Jobs", q); err != nil {
		return nil, nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("Jobs"); err != nil {
		return nil, nil, err
	}
	withMeta := q != nil && q.Params["meta"] == "true"
	var out []*api.JobListStub
	for _, j := range f.jobs {
		if q != nil && q.Prefix != "" && !strings.HasPrefix(*j.ID, q.Prefix) {
			continue
		}
		s := &api.JobListStub{
			ID:          *j.ID,
			Name:        deref(j.Name),
			Namespace:   deref(j.Namespace),
			Datacenters: j.Datacenters,
			Type:        deref(j.Type),
			Stop:        j.Stop != nil && *j.Stop,
			Status:      deref(j.Status),
			JobSummary:  f.summaryLocked(*j.ID),
			SubmitTime:  derefInt64(j.SubmitTime),
		}
		if j.Priority != nil {
			s.Priority = *j.Priority
		}
		if withMeta {
			s.Meta = copyMap(j.Meta)
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, k int) bool { return out[i].ID < out[k].ID })
	return out, &api.QueryMeta{LastIndex: f.index}, nil
}

func (f *Fake) JobSummary(jobID string) (*api.JobSummary, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("JobSummary"); err != nil {
		return nil, err
	}
	if _, ok := f.jobs[jobID]; !ok {
		return nil, notFound("reading the summary of job "+jobID, "job not found")
	}
	return f.summaryLocked(jobID), nil
}

// summaryLocked counts the job's allocations by client status per group.
func (f *Fake) summaryLocked(jobID string) *api.JobSummary {
	s := &api.JobSummary{JobID: jobID, Summary: map[string]api.TaskGroupSummary{}}
	if j, ok := f.jobs[jobID]; ok {
		for _, tg := range j.TaskGroups {
			if tg.Name != nil {
				s.Summary[*tg.Name] = api.TaskGroupSummary{}
			}
		}
	}
	for _, a := range f.allocs {
		if a.JobID != jobID {
			continue
		}
		g := s.Summary[a.TaskGroup]
		switch a.ClientStatus {
		case "pending":
			g.Starting++
		case "running":
			g.Running++
		case "complete":
			g.Complete++
		case "failed":
			g.Failed++
		case "lost":
			g.Lost++
		case "unknown":
			g.Unknown++
		}
		s.Summary[a.TaskGroup] = g
	}
	return s
}

func (f *Fake) JobAllocations(jobID string, q *api.QueryOptions) ([]*api.AllocationListStub, *api.QueryMeta, error) {
	if err := f.block("JobAllocations", q); err != nil {
		return nil, nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("JobAllocations"); err != nil {
		return nil, nil, err
	}
	var out []*api.AllocationListStub
	for _, a := range f.sortedAllocsLocked() {
		if a.JobID == jobID {
			out = append(out, stub(a))
		}
	}
	return out, &api.QueryMeta{LastIndex: f.index}, nil
}

// Allocations lists every allocation (the fake has one namespace's view:
// q.Namespace is not filtered), with the reserved resources when asked.
func (f *Fake) Allocations(q *api.QueryOptions) ([]*api.AllocationListStub, *api.QueryMeta, error) {
	if err := f.block("Allocations", q); err != nil {
		return nil, nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("Allocations"); err != nil {
		return nil, nil, err
	}
	withResources := q != nil && q.Params["resources"] == "true"
	out := []*api.AllocationListStub{}
	for _, a := range f.sortedAllocsLocked() {
		s := stub(a)
		if withResources {
			s.AllocatedResources = clone(a.AllocatedResources)
		}
		out = append(out, s)
	}
	return out, &api.QueryMeta{LastIndex: f.index}, nil
}

func (f *Fake) Evaluation(evalID string, q *api.QueryOptions) (*api.Evaluation, *api.QueryMeta, error) {
	if err := f.block("Evaluation", q); err != nil {
		return nil, nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("Evaluation"); err != nil {
		return nil, nil, err
	}
	e, ok := f.evals[evalID]
	if !ok {
		return nil, nil, notFound("reading evaluation "+evalID, "eval not found")
	}
	return clone(e), &api.QueryMeta{LastIndex: f.index}, nil
}

func (f *Fake) Allocation(allocID string) (*api.Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("Allocation"); err != nil {
		return nil, err
	}
	a, ok := f.allocs[allocID]
	if !ok {
		return nil, notFound("reading allocation "+allocID, "alloc not found")
	}
	return clone(a), nil
}

// Logs sends the stored chunks as frames. Without follow the stream ends
// after the chunks there are now; with follow it ends once CloseLog was
// called and every chunk was sent, or when cancel closes. An unknown task or
// stream reads as an empty log.
func (f *Fake) Logs(alloc *api.Allocation, task, stream string, follow bool, cancel <-chan struct{}) (<-chan *api.StreamFrame, <-chan error) {
	errCh := make(chan error, 1)
	f.mu.Lock()
	if err := f.errLocked("Logs"); err != nil {
		f.mu.Unlock()
		errCh <- err
		return nil, errCh
	}
	l := f.logLocked(alloc.ID, task, stream)
	if l.err != nil {
		err := l.err
		f.mu.Unlock()
		errCh <- err
		return nil, errCh
	}
	f.mu.Unlock()

	frames := make(chan *api.StreamFrame)
	go func() {
		defer close(frames)
		sent, offset := 0, int64(0)
		for {
			f.mu.Lock()
			pending := append([]string(nil), l.chunks[min(sent, len(l.chunks)):]...)
			closed, changed := l.closed, l.changed
			f.mu.Unlock()
			for _, c := range pending {
				fr := &api.StreamFrame{Offset: offset, Data: []byte(c), File: "alloc/logs/" + task + "." + stream + ".0"}
				select {
				case frames <- fr:
				case <-cancel:
					return
				}
				offset += int64(len(c))
				sent++
			}
			if !follow || closed {
				return
			}
			select {
			case <-changed:
			case <-cancel:
				return
			}
		}
	}()
	return frames, errCh
}

func (f *Fake) Nodes(q *api.QueryOptions) ([]*api.NodeListStub, *api.QueryMeta, error) {
	if err := f.block("Nodes", q); err != nil {
		return nil, nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("Nodes"); err != nil {
		return nil, nil, err
	}
	withResources := q != nil && q.Params["resources"] == "true"
	var out []*api.NodeListStub
	for _, n := range f.nodes {
		c := clone(n)
		s := &api.NodeListStub{
			ID: n.ID, Name: n.Name, Datacenter: n.Datacenter, NodeClass: n.NodeClass, NodePool: n.NodePool,
			Drain: n.Drain, SchedulingEligibility: n.SchedulingEligibility, Status: n.Status, Drivers: c.Drivers,
			StatusDescription: n.StatusDescription, Address: n.HTTPAddr,
			CreateIndex: n.CreateIndex, ModifyIndex: n.ModifyIndex,
		}
		if withResources {
			s.NodeResources, s.ReservedResources = c.NodeResources, c.ReservedResources
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, k int) bool { return out[i].ID < out[k].ID })
	return out, &api.QueryMeta{LastIndex: f.index}, nil
}

func (f *Fake) Node(nodeID string) (*api.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("Node"); err != nil {
		return nil, err
	}
	n, ok := f.nodes[nodeID]
	if !ok {
		return nil, notFound("reading node "+nodeID, "node not found")
	}
	return clone(n), nil
}

func (f *Fake) NodeAllocations(nodeID string) ([]*api.Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("NodeAllocations"); err != nil {
		return nil, err
	}
	var out []*api.Allocation
	for _, a := range f.sortedAllocsLocked() {
		if a.NodeID == nodeID {
			out = append(out, clone(a))
		}
	}
	return out, nil
}

func (f *Fake) NodeStats(nodeID string) (*api.HostStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errLocked("NodeStats"); err != nil {
		return nil, err
	}
	s, ok := f.stats[nodeID]
	if !ok {
		return nil, notFound("reading the stats of node "+nodeID, "Unknown node")
	}
	return clone(s), nil
}

// --- helpers ---------------------------------------------------------------

// block implements a blocking query's wait.
func (f *Fake) block(query string, q *api.QueryOptions) error {
	if q == nil || q.WaitIndex == 0 {
		return nil
	}
	f.mu.Lock()
	if f.index > q.WaitIndex {
		f.mu.Unlock()
		return nil
	}
	f.BlockingQuerys = append(f.BlockingQuerys, query)
	hook, idx := f.OnBlock, f.index
	f.mu.Unlock()
	if hook != nil {
		hook(f, query, idx)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// A query's context ends its wait, as it ends the real client's.
	ctx := q.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	stop := context.AfterFunc(ctx, func() {
		f.mu.Lock()
		f.changed.Broadcast()
		f.mu.Unlock()
	})
	defer stop()
	if q.WaitTime > 0 {
		deadline := time.Now().Add(q.WaitTime)
		t := time.AfterFunc(q.WaitTime, func() {
			f.mu.Lock()
			f.changed.Broadcast()
			f.mu.Unlock()
		})
		defer t.Stop()
		for f.index <= q.WaitIndex && time.Now().Before(deadline) && ctx.Err() == nil {
			f.changed.Wait()
		}
		return ctx.Err()
	}
	for f.index <= q.WaitIndex && ctx.Err() == nil {
		f.changed.Wait()
	}
	return ctx.Err()
}

func (f *Fake) sortedAllocsLocked() []*api.Allocation {
	out := make([]*api.Allocation, 0, len(f.allocs))
	for _, a := range f.allocs {
		out = append(out, a)
	}
	sort.Slice(out, func(i, k int) bool {
		if out[i].CreateIndex != out[k].CreateIndex {
			return out[i].CreateIndex < out[k].CreateIndex
		}
		return out[i].ID < out[k].ID
	})
	return out
}

// stub is the list form of an allocation, as /v1/job/:id/allocations gives
// it: no AllocatedResources.
func stub(a *api.Allocation) *api.AllocationListStub {
	c := clone(a)
	return &api.AllocationListStub{
		ID: c.ID, EvalID: c.EvalID, Name: c.Name, Namespace: c.Namespace, NodeID: c.NodeID, NodeName: c.NodeName,
		JobID: c.JobID, JobVersion: derefUint64(jobVersion(c)), TaskGroup: c.TaskGroup,
		DesiredStatus: c.DesiredStatus, DesiredDescription: c.DesiredDescription,
		ClientStatus: c.ClientStatus, ClientDescription: c.ClientDescription, TaskStates: c.TaskStates,
		DeploymentStatus: c.DeploymentStatus, FollowupEvalID: c.FollowupEvalID, NextAllocation: c.NextAllocation,
		RescheduleTracker: c.RescheduleTracker, PreemptedAllocations: c.PreemptedAllocations,
		PreemptedByAllocation: c.PreemptedByAllocation, CreateIndex: c.CreateIndex, ModifyIndex: c.ModifyIndex,
		CreateTime: c.CreateTime, ModifyTime: c.ModifyTime,
	}
}

func jobVersion(a *api.Allocation) *uint64 {
	if a.Job == nil {
		return nil
	}
	return a.Job.Version
}

// notFound words a 404 as the real client does.
func notFound(what, text string) error {
	return fmt.Errorf("%s: Unexpected response code: 404 (%s)", what, text)
}

// clone deep-copies through JSON (what Nomad's HTTP API does too).
func clone[T any](v *T) *T {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("fake: copying %T: %v", v, err))
	}
	out := new(T)
	if err := json.Unmarshal(b, out); err != nil {
		panic(fmt.Sprintf("fake: copying %T: %v", v, err))
	}
	return out
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func derefInt64(v *int64) int64 {
	if v == nil {
		return 0
	}
	return *v
}

func derefUint64(v *uint64) uint64 {
	if v == nil {
		return 0
	}
	return *v
}
