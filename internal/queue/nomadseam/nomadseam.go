// Package nomadseam is the admission controller's Nomad (admit.Nomad) on
// Nomad's HTTP API, with the controller's own token: node:read, and
// list-jobs, read-job and submit-job in every namespace (jobspecs/acl's
// nomad-queue-controller).
//
// Nodes are counted by internal/nomadnode's rules, as the CLI counts them.
// Allocations span every namespace (namespace=*): a job of any namespace
// holds GPUs the queue must not hand out twice.
package nomadseam

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/nomadnode"
	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/queue/policy"
)

// Unreported is the capacity of a node that reports no CPU or memory: not
// limited by it (as the CLI's submit check counts it).
const Unreported = 1 << 30

// DefaultWait is how long WaitAllocations' blocking query waits for a
// change before it answers anyway (Nomad caps it at 10 minutes).
const DefaultWait = 5 * time.Minute

// Nomad is admit.Nomad on a Nomad API client.
type Nomad struct {
	c *api.Client
	// Wait is WaitAllocations' blocking query's wait; 0: DefaultWait.
	Wait time.Duration
}

var _ admit.Nomad = (*Nomad)(nil)

// New is the controller's Nomad through c (its address, token and TLS).
func New(c *api.Client) *Nomad { return &Nomad{c: c} }

// all is a query of every namespace.
func all(ctx context.Context, params map[string]string) *api.QueryOptions {
	return (&api.QueryOptions{Namespace: "*", Params: params}).WithContext(ctx)
}

// Nodes lists the nodes that take gpujob work now: ready, eligible (not
// draining), with a healthy gpujob driver; each with its healthy GPUs and
// its CPU and memory less what it reserves.
func (n *Nomad) Nodes(ctx context.Context) ([]policy.Node, error) {
	stubs, _, err := n.c.Nodes().List((&api.QueryOptions{Params: map[string]string{"resources": "true"}}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	names := nodeNames(stubs)
	var out []policy.Node
	for _, s := range stubs {
		if s == nil || s.Status != api.NodeStatusReady || s.SchedulingEligibility != api.NodeSchedulingEligible || s.Drain ||
			nomadnode.DriverProblem(s.Drivers) != "" {
			continue
		}
		cpu, mem := nomadnode.Allocatable(s)
		c := policy.Resources{CPUMHz: Unreported, MemoryMB: Unreported}
		if r := s.NodeResources; r != nil {
			// A node that reports a resource offers what its
			// reservation leaves, 0 included.
			if r.Cpu.CpuShares > 0 {
				c.CPUMHz = int(min(cpu, Unreported))
			}
			if r.Memory.MemoryMB > 0 {
				c.MemoryMB = int(min(mem, Unreported))
			}
			for _, g := range r.Devices {
				c.GPUs += len(nomadnode.HealthyGPUs(g))
			}
		}
		out = append(out, policy.Node{Name: names[s.ID], Capacity: c})
	}
	return out, nil
}

// nodeNames names each node by its name, which allocations carry too and a
// person reads in a placement; nodes that share a name (Nomad allows it)
// are told apart by their ID.
func nodeNames(stubs []*api.NodeListStub) map[string]string {
	count := map[string]int{}
	for _, s := range stubs {
		if s != nil {
			count[s.Name]++
		}
	}
	out := map[string]string{}
	for _, s := range stubs {
		if s == nil {
			continue
		}
		out[s.ID] = s.Name
		if count[s.Name] > 1 || s.Name == "" {
			out[s.ID] = nodeByID(s.Name, s.ID)
		}
	}
	return out
}

func nodeByID(name, id string) string {
	if name == "" {
		return id
	}
	return name + " (" + id + ")"
}

// holds says whether an allocation in this client status holds its
// resources on its node: pending (being started) or running, whatever the
// server wants of it (one being stopped holds its GPUs until it has).
func holds(clientStatus string) bool {
	return clientStatus == api.AllocClientStatusPending || clientStatus == api.AllocClientStatusRunning
}

// Allocations lists every allocation, in every namespace, that holds
// resources on a client now, with its job's meta (gpujob's kind and the
// admission marker) and what it holds. An allocation of a job that is
// gone has no meta: the controller counts it as outside the queue.
func (n *Nomad) Allocations(ctx context.Context) ([]admit.Alloc, error) {
	stubs, _, err := n.c.Allocations().List(all(ctx, map[string]string{"resources": "true", "task_states": "false"}))
	if err != nil {
		return nil, fmt.Errorf("listing allocations: %w", err)
	}
	jobs, _, err := n.c.Jobs().List(all(ctx, map[string]string{"meta": "true"}))
	if err != nil {
		return nil, fmt.Errorf("listing jobs: %w", err)
	}
	meta := map[string]map[string]string{}
	for _, j := range jobs {
		if j != nil {
			meta[j.Namespace+"/"+j.ID] = j.Meta
		}
	}
	nodes, _, err := n.c.Nodes().List((&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	names := nodeNames(nodes)
	var out []admit.Alloc
	for _, a := range stubs {
		if a == nil || !holds(a.ClientStatus) {
			continue
		}
		node, ok := names[a.NodeID]
		if !ok {
			node = nodeByID(a.NodeName, a.NodeID)
		}
		out = append(out, admit.Alloc{ID: a.ID, Namespace: a.Namespace, JobID: a.JobID, Node: node,
			JobMeta: meta[a.Namespace+"/"+a.JobID], Resources: allocated(a.AllocatedResources),
			ClientStatus: a.ClientStatus, DesiredStatus: a.DesiredStatus})
	}
	return out, nil
}

// allocated is what an allocation holds: the sum over its tasks of CPU,
// memory and GPUs (device instances nomadnode.IsGPU counts). Summing
// every task overstates a group with lifecycle tasks that never run
// together, which only keeps the queue from overfilling a node.
func allocated(r *api.AllocatedResources) policy.Resources {
	var out policy.Resources
	if r == nil {
		return out
	}
	for _, t := range r.Tasks {
		if t == nil {
			continue
		}
		out.CPUMHz += int(t.Cpu.CpuShares)
		out.MemoryMB += int(t.Memory.MemoryMB)
		for _, d := range t.Devices {
			if d != nil && nomadnode.IsGPU(d.Vendor, d.Type) {
				out.GPUs += len(d.DeviceIDs)
			}
		}
	}
	return out
}

// WaitAllocations is a blocking query on the allocation list of every
// namespace: it answers when the list changed after index, or after Wait,
// with Nomad's index. It asks for one stub a page: only the index is
// wanted, and Allocations reads the list.
func (n *Nomad) WaitAllocations(ctx context.Context, index uint64) (uint64, error) {
	wait := n.Wait
	if wait <= 0 {
		wait = DefaultWait
	}
	q := all(ctx, map[string]string{"task_states": "false"})
	q.WaitIndex, q.WaitTime, q.PerPage = index, wait, 1
	_, meta, err := n.c.Allocations().List(q)
	if err != nil {
		return index, fmt.Errorf("watching allocations: %w", err)
	}
	return meta.LastIndex, nil
}

// JobAllocations lists every allocation of one job, terminal ones too,
// with its client and desired status and the meta of the job version it
// ran (a member of an earlier admission carries that admission's marker):
// the partial-gang guard tells a member that ended by itself from one
// that is missing. A missing job has none.
func (n *Nomad) JobAllocations(ctx context.Context, namespace, id string) ([]admit.Alloc, error) {
	q := func() *api.QueryOptions { return (&api.QueryOptions{Namespace: namespace}).WithContext(ctx) }
	stubs, _, err := n.c.Jobs().Allocations(id, true, q())
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the allocations of job %s/%s: %w", namespace, id, err)
	}
	if len(stubs) == 0 {
		return nil, nil
	}
	versions, _, _, err := n.c.Jobs().Versions(id, false, q())
	if isNotFound(err) {
		// Purged between the two reads: its allocations go with it.
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the versions of job %s/%s: %w", namespace, id, err)
	}
	meta := map[uint64]map[string]string{}
	for _, v := range versions {
		if v != nil && v.Version != nil {
			meta[*v.Version] = v.Meta
		}
	}
	out := make([]admit.Alloc, 0, len(stubs))
	for _, a := range stubs {
		if a == nil {
			continue
		}
		// A version Nomad no longer keeps (it keeps the last few) leaves
		// the member without meta: not of the current admission.
		out = append(out, admit.Alloc{ID: a.ID, Namespace: a.Namespace, JobID: a.JobID,
			Node: nodeByID(a.NodeName, a.NodeID), JobMeta: meta[a.JobVersion],
			ClientStatus: a.ClientStatus, DesiredStatus: a.DesiredStatus})
	}
	return out, nil
}

// Job reads a job; nil when there is none.
func (n *Nomad) Job(ctx context.Context, namespace, id string) (*admit.JobInfo, error) {
	j, _, err := n.c.Jobs().Info(id, (&api.QueryOptions{Namespace: namespace}).WithContext(ctx))
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading job %s/%s: %w", namespace, id, err)
	}
	info := &admit.JobInfo{Meta: j.Meta}
	if j.Stop != nil {
		info.Stop = *j.Stop
	}
	if j.Status != nil {
		info.Status = *j.Status
	}
	if j.JobModifyIndex != nil {
		info.ModifyIndex = *j.JobModifyIndex
	}
	return info, nil
}

// Unplaced is the sum over the job's groups of its summary's queued
// allocations (Nomad's /v1/job/<id>/summary).
func (n *Nomad) Unplaced(ctx context.Context, namespace, id string) (int, error) {
	sum, _, err := n.c.Jobs().Summary(id, (&api.QueryOptions{Namespace: namespace}).WithContext(ctx))
	if isNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the summary of job %s/%s: %w", namespace, id, err)
	}
	queued := 0
	for _, g := range sum.Summary {
		queued += g.Queued
	}
	return queued, nil
}

// Plan is Nomad's plan of job (no diff) in the job's namespace.
func (n *Nomad) Plan(ctx context.Context, job *api.Job) (*api.JobPlanResponse, error) {
	r, _, err := n.c.Jobs().PlanOpts(job, &api.PlanOptions{}, write(ctx, job))
	if err != nil {
		return nil, fmt.Errorf("planning job %s: %w", jobName(job), err)
	}
	return r, nil
}

// Register registers job with Nomad's index check: only if its job modify
// index is still enforceIndex (0: no such job). A failed check is
// admit.ErrConflict.
func (n *Nomad) Register(ctx context.Context, job *api.Job, enforceIndex uint64) error {
	_, _, err := n.c.Jobs().RegisterOpts(job, &api.RegisterOptions{EnforceIndex: true, ModifyIndex: enforceIndex}, write(ctx, job))
	if err != nil {
		if isConflict(err) {
			return fmt.Errorf("registering job %s: %w (%v)", jobName(job), admit.ErrConflict, err)
		}
		return fmt.Errorf("registering job %s: %w", jobName(job), err)
	}
	return nil
}

// Stop deregisters the job without purging it (its allocations stop; the
// job stays readable, stopped, with its meta); a missing job is success.
func (n *Nomad) Stop(ctx context.Context, namespace, id string) error {
	_, _, err := n.c.Jobs().DeregisterOpts(id, &api.DeregisterOptions{Purge: false}, (&api.WriteOptions{Namespace: namespace}).WithContext(ctx))
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("stopping job %s/%s: %w", namespace, id, err)
	}
	return nil
}

// write is a write in job's namespace.
func write(ctx context.Context, job *api.Job) *api.WriteOptions {
	w := &api.WriteOptions{}
	if job != nil && job.Namespace != nil {
		w.Namespace = *job.Namespace
	}
	return w.WithContext(ctx)
}

func jobName(job *api.Job) string {
	if job == nil || job.ID == nil {
		return "?"
	}
	if job.Namespace != nil && *job.Namespace != "" {
		return *job.Namespace + "/" + *job.ID
	}
	return *job.ID
}

func isNotFound(err error) bool {
	var ue api.UnexpectedResponseError
	return errors.As(err, &ue) && ue.HasStatusCode() && ue.StatusCode() == http.StatusNotFound
}

// isConflict reports whether err is Nomad's refusal of a register whose
// index check failed: a 500 whose text starts with
// api.RegisterEnforceIndexErrPrefix ("Enforcing job modify index").
func isConflict(err error) bool {
	return err != nil && strings.Contains(err.Error(), api.RegisterEnforceIndexErrPrefix)
}
