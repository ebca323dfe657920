package admit

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/consul"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
	"github.com/gpujob/gpujob/internal/testagent"
)

var shared = testagent.Lazy{HCL: `session_ttl_min = "1s"`}

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

// fakeNomad is a cluster: nodes, allocations of jobs outside the queue,
// and the jobs registered through it, placed first-fit at registration
// (as Nomad places what fits and leaves the rest blocked).
type fakeNomad struct {
	mu      sync.Mutex
	nodes   []policy.Node
	outside []Alloc
	jobs    map[string]*fakeJob
	// planFails makes Plan report the named jobs unplaceable (a race
	// with work outside gpujob that the policy did not see).
	planFails map[string]bool
	// slowStop keeps a stopped job's allocations until release.
	slowStop bool
	// short makes Register place that many members fewer of the named
	// job than fit (work outside gpujob took them after the plan).
	short map[string]int
	// jobAllocs counts JobAllocations calls.
	jobAllocs int
	// onPlan and onRegister run after a Plan or Register of a job (by
	// name), e.g. to simulate a crash by cancelling the controller.
	onPlan, onRegister func(name string)
	registers          map[string]int
	plans, stops       int
	calls              int
	index              uint64
}

type fakeJob struct {
	job    *nomadapi.Job
	stop   bool
	modify uint64
	allocs []Alloc
	// ended are its terminal allocations.
	ended []Alloc
	// blocked are members asked for by a scale and not placed yet; each
	// Allocations places what fits of them, as Nomad's blocked
	// evaluation does once capacity frees.
	blocked int
	// dead: every member ended by itself (Nomad's status "dead", the job
	// not stopped).
	dead bool
}

func newFake(nodes int, gpus int) *fakeNomad {
	f := &fakeNomad{jobs: map[string]*fakeJob{}, planFails: map[string]bool{}, short: map[string]int{}, registers: map[string]int{}, index: 1}
	for i := range nodes {
		f.nodes = append(f.nodes, policy.Node{Name: fmt.Sprintf("n%d", i+1),
			Capacity: policy.Resources{GPUs: gpus, CPUMHz: 100000, MemoryMB: 100000}})
	}
	return f
}

func name(job *nomadapi.Job) string {
	ns := "default"
	if job.Namespace != nil && *job.Namespace != "" {
		ns = *job.Namespace
	}
	return ns + "/" + *job.ID
}

// holding is every allocation that holds resources now.
func (f *fakeNomad) holding() []Alloc {
	out := append([]Alloc(nil), f.outside...)
	for _, n := range sortedKeys(f.jobs) {
		j := f.jobs[n]
		if !j.stop || f.slowStop {
			out = append(out, j.allocs...)
		}
	}
	return out
}

// place places job's members first-fit; it returns those placed.
func (f *fakeNomad) place(job *nomadapi.Job) (placed []Alloc, want int) {
	free := map[string]int{}
	for _, n := range f.nodes {
		free[n.Name] = n.Capacity.GPUs
	}
	for _, a := range f.holding() {
		free[a.Node] -= a.Resources.GPUs
	}
	for _, g := range job.TaskGroups {
		r := groupResources(g)
		for i := range *g.Count {
			want++
			for _, n := range f.nodes {
				if free[n.Name] >= r.GPUs {
					free[n.Name] -= r.GPUs
					placed = append(placed, Alloc{ID: fmt.Sprintf("%s-%d", *job.ID, i), Namespace: *job.Namespace, JobID: *job.ID,
						Node: n.Name, JobMeta: maps.Clone(job.Meta), Resources: policy.Resources(r)})
					break
				}
			}
		}
	}
	return placed, want
}

func (f *fakeNomad) Nodes(context.Context) ([]policy.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return append([]policy.Node(nil), f.nodes...), nil
}

func (f *fakeNomad) Allocations(context.Context) ([]Alloc, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.unblock()
	return f.holding(), nil
}

// scale asks for k more members of job n (a service's scale-up): what fits
// is placed now, the rest is blocked until capacity frees.
func (f *fakeNomad) scale(n string, k int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.jobs[n].blocked += k
	f.unblock()
	f.index++
}

// unblock places what fits of the jobs' blocked members, first-fit.
func (f *fakeNomad) unblock() {
	for _, n := range sortedKeys(f.jobs) {
		j := f.jobs[n]
		if j.stop || j.blocked == 0 {
			continue
		}
		one := *j.job
		g := *one.TaskGroups[0]
		g.Count = ptr(j.blocked)
		one.TaskGroups = []*nomadapi.TaskGroup{&g}
		placed, _ := f.place(&one)
		for i := range placed {
			placed[i].ID = fmt.Sprintf("%s-scaled-%d-%d", *j.job.ID, f.index, i)
		}
		j.allocs = append(j.allocs, placed...)
		j.blocked -= len(placed)
	}
}

func (f *fakeNomad) Unplaced(_ context.Context, ns, id string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if j := f.jobs[ns+"/"+id]; j != nil && !j.stop {
		return j.blocked, nil
	}
	return 0, nil
}

func (f *fakeNomad) WaitAllocations(ctx context.Context, index uint64) (uint64, error) {
	for {
		f.mu.Lock()
		i := f.index
		f.mu.Unlock()
		if i != index {
			return i, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (f *fakeNomad) Job(_ context.Context, ns, id string) (*JobInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	j := f.jobs[ns+"/"+id]
	if j == nil {
		return nil, nil
	}
	status := "running"
	if j.stop || j.dead {
		status = "dead"
	}
	return &JobInfo{Meta: maps.Clone(j.job.Meta), Stop: j.stop, Status: status, ModifyIndex: j.modify}, nil
}

func (f *fakeNomad) Plan(_ context.Context, job *nomadapi.Job) (*nomadapi.JobPlanResponse, error) {
	f.mu.Lock()
	f.calls++
	f.plans++
	placed, want := f.place(job)
	fail := f.planFails[name(job)]
	hook := f.onPlan
	f.mu.Unlock()
	if hook != nil {
		hook(name(job))
	}
	resp := &nomadapi.JobPlanResponse{}
	if fail || len(placed) < want {
		resp.FailedTGAllocs = map[string]*nomadapi.AllocationMetric{"train": {NodesEvaluated: len(f.nodes),
			DimensionExhausted: map[string]int{"devices: nvidia/gpu": len(f.nodes)}}}
	}
	return resp, nil
}

func (f *fakeNomad) Register(ctx context.Context, job *nomadapi.Job, enforce uint64) error {
	if err := ctx.Err(); err != nil {
		return err // the controller crashed before the request went out
	}
	f.mu.Lock()
	n := name(job)
	old := f.jobs[n]
	switch {
	case old == nil && enforce != 0, old != nil && old.modify != enforce:
		f.mu.Unlock()
		return ErrConflict
	}
	f.calls++
	f.registers[n]++
	f.index++
	j := &fakeJob{job: job, modify: f.index}
	if old != nil {
		j.ended = old.ended
	}
	j.allocs, _ = f.place(job)
	if k := f.short[n]; k > 0 {
		j.allocs = j.allocs[:max(len(j.allocs)-k, 0)]
	}
	f.jobs[n] = j
	hook := f.onRegister
	f.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	return nil
}

func (f *fakeNomad) Stop(_ context.Context, ns, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.stops++
	if j := f.jobs[ns+"/"+id]; j != nil && !j.stop {
		j.stop = true
		f.index++
		j.modify = f.index
	}
	return nil
}

func (f *fakeNomad) JobAllocations(_ context.Context, ns, id string) ([]Alloc, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.jobAllocs++
	j := f.jobs[ns+"/"+id]
	if j == nil {
		return nil, nil
	}
	var out []Alloc
	for _, a := range j.allocs {
		a.ClientStatus, a.DesiredStatus = nomadapi.AllocClientStatusRunning, nomadapi.AllocDesiredStatusRun
		if j.stop {
			a.DesiredStatus = nomadapi.AllocDesiredStatusStop
		}
		out = append(out, a)
	}
	return append(out, j.ended...), nil
}

// end ends k live members of job n with a client and desired status
// (complete/run: done by itself; lost/stop: its node was lost).
func (f *fakeNomad) end(n string, k int, client, desired string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	j := f.jobs[n]
	for range k {
		a := j.allocs[len(j.allocs)-1]
		j.allocs = j.allocs[:len(j.allocs)-1]
		a.ClientStatus, a.DesiredStatus = client, desired
		j.ended = append(j.ended, a)
	}
	f.index++
}

// release ends the stopped jobs' allocations (a slow stop's end).
func (f *fakeNomad) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, j := range f.jobs {
		if j.stop {
			j.allocs = nil
		}
	}
	f.index++
}

// finish ends a job as if it completed.
func (f *fakeNomad) finish(n string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if j := f.jobs[n]; j != nil {
		j.stop, j.allocs = true, nil
		f.index++
	}
}

// complete ends every member of a job as completed by itself, as a batch
// job ends in Nomad: its allocations complete, the job dead, not stopped.
func (f *fakeNomad) complete(n string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if j := f.jobs[n]; j != nil {
		for _, a := range j.allocs {
			a.ClientStatus, a.DesiredStatus = nomadapi.AllocClientStatusComplete, nomadapi.AllocDesiredStatusRun
			j.ended = append(j.ended, a)
		}
		j.allocs, j.dead = nil, true
		f.index++
	}
}

func (f *fakeNomad) registered(n string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.registers[n]
}

// fixture is a controller of a test's own tree, with its fake cluster.
type fixture struct {
	t      *testing.T
	client *api.Client
	prefix string
	nomad  *fakeNomad
	c      *Controller
	now    time.Time
}

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func newFixture(t *testing.T, nodes, gpus int) *fixture {
	t.Helper()
	f := &fixture{t: t, client: shared.Client(t), prefix: "test/" + strings.ReplaceAll(t.Name(), "/", "-"),
		nomad: newFake(nodes, gpus), now: t0}
	f.c = f.controller("c1")
	return f
}

func (f *fixture) controller(id string) *Controller {
	return &Controller{Consul: f.client, Nomad: f.nomad, Prefix: f.prefix, ID: id, SessionTTL: 2 * time.Second,
		Logf: f.t.Logf, Now: func() time.Time { return f.now }}
}

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// lead makes c the leader with a session and election of its own, as Run
// does; the session ends with the test.
func (f *fixture) lead(c *Controller) *consul.Session {
	f.t.Helper()
	ctx := ctxOf(f.t)
	sess, err := consul.NewSession(ctx, f.client, consul.SessionOptions{Name: f.t.Name(), TTL: 2 * time.Second, TTLOnly: true, LockDelay: time.Millisecond})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = sess.Close(context.Background()) })
	el := consul.NewElection(sess, c.leaderKey(), consul.MutexOptions{LockDelay: time.Second})
	if err := el.Campaign(ctx, []byte(c.ID)); err != nil {
		f.t.Fatal(err)
	}
	c.lead(sess.ID(), el.Lost())
	return sess
}

func (f *fixture) config(queues ...queuekv.Queue) {
	f.t.Helper()
	s := queuekv.New(f.client, f.prefix)
	_, idx, err := s.Read(ctxOf(f.t))
	if err != nil {
		f.t.Fatal(err)
	}
	r := &queuekv.Record{Format: queuekv.Format, Queues: queues, File: "q.hcl", SHA256: strings.Repeat("ab", 32),
		AppliedBy: "ops@host", AppliedAt: t0}
	if _, err := s.Write(ctxOf(f.t), r, idx); err != nil {
		f.t.Fatal(err)
	}
}

// jobOf is a rendered gang job: members × gpus.
func jobOf(ns, id, queue string, members, gpus int) *nomadapi.Job {
	cpu, mem, cnt := 100, 256, uint64(gpus)
	meta := map[string]string{contract.MetaKind: contract.KindTrain}
	if queue != "" {
		meta[contract.MetaQueue] = queue
	}
	return &nomadapi.Job{ID: &id, Namespace: &ns, Type: ptr(nomadapi.JobTypeBatch), Meta: meta,
		TaskGroups: []*nomadapi.TaskGroup{{Name: ptr("train"), Count: &members,
			Tasks: []*nomadapi.Task{{Name: "train", Driver: contract.DriverName, Resources: &nomadapi.Resources{CPU: &cpu, MemoryMB: &mem,
				Devices: []*nomadapi.RequestedDevice{{Name: contract.GPUDevice, Count: &cnt}}}}}}}}
}

// recordOf is job's queue record.
func recordOf(job *nomadapi.Job, priority int, submitted time.Time) *JobRecord {
	b, _ := json.Marshal(job)
	r := groupResources(job.TaskGroups[0])
	return &JobRecord{Format: Format, ID: *job.ID, Namespace: *job.Namespace, Queue: job.Meta[contract.MetaQueue], Kind: KindTrain,
		Priority: priority, Members: *job.TaskGroups[0].Count, PerMember: r, SubmittedAt: submitted, SubmittedBy: "alice@desk", Job: b}
}

// submit stores a record as submit would.
func (f *fixture) submit(r *JobRecord) {
	f.t.Helper()
	b, err := EncodeJobRecord(r, f.now)
	if err != nil {
		f.t.Fatal(err)
	}
	f.put(JobKey(f.c.jobsPrefix(), r.Namespace, r.ID), b)
}

func (f *fixture) put(key string, b []byte) {
	f.t.Helper()
	if _, err := f.client.KV().Put(&api.KVPair{Key: key, Value: b}, nil); err != nil {
		f.t.Fatal(err)
	}
}

// status reads a job's status (nil when none).
func (f *fixture) status(n string) *Status {
	f.t.Helper()
	p, _, err := f.client.KV().Get(f.c.statusPrefix()+"/"+n, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	if p == nil {
		return nil
	}
	st, err := DecodeStatus(p.Value)
	if err != nil {
		f.t.Fatalf("status of %s: %v", n, err)
	}
	return st
}

func (f *fixture) reconcile(c *Controller) *Result {
	f.t.Helper()
	res, err := c.Reconcile(ctxOf(f.t))
	if err != nil {
		f.t.Fatalf("reconcile: %v", err)
	}
	return res
}

func ptr[T any](v T) *T { return &v }
