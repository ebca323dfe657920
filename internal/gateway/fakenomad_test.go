package gateway

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/servekv"
)

// fakeNomad is Nomad as the gateway reads it, in memory, with blocking
// queries: every change moves the index and wakes the waiters.
type fakeNomad struct {
	mu      sync.Mutex
	index   uint64
	changed chan struct{}
	jobs    map[string]*nomadapi.Job        // "ns/id"
	allocs  map[string]*nomadapi.Allocation // by ID
	err     error                           // while set, every call fails

	listCalls atomic.Int64
}

func newFakeNomad() *fakeNomad {
	return &fakeNomad{index: 1, changed: make(chan struct{}), jobs: map[string]*nomadapi.Job{}, allocs: map[string]*nomadapi.Allocation{}}
}

// bump records a change; the caller holds mu.
func (f *fakeNomad) bump() {
	f.index++
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeNomad) setErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
	f.bump()
}

// putJob registers (or replaces) a job with meta. Like Nomad, which
// updates a job's allocations in place for a change of its meta, it
// touches the job's allocations.
func (f *fakeNomad) putJob(ns, id string, meta map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.jobs[ns+"/"+id] = &nomadapi.Job{ID: &id, Namespace: &ns, Meta: meta}
	for _, a := range f.allocs {
		if a.Namespace == ns && a.JobID == id {
			a.ModifyIndex = f.index
		}
	}
	f.bump()
}

// serviceJob registers job id as the job of service ns/svc, claiming its
// route in its meta as gpujob service deploy does.
func (f *fakeNomad) serviceJob(ns, svc, id string) {
	b, _ := json.Marshal(servekv.Route{Namespace: ns, Service: svc, JobID: id, Group: "serve"})
	f.putJob(ns, id, map[string]string{servekv.JobMetaKind: servekv.JobKindService, servekv.JobMetaRoute: string(b)})
}

// runAlloc adds a running allocation of job ns/jobID in group with the
// port "http" at addr, and returns its ID.
func (f *fakeNomad) runAlloc(ns, jobID, group, addr string) string {
	host, portS, err := net.SplitHostPort(addr)
	if err != nil {
		panic(err)
	}
	port, _ := strconv.Atoi(portS)
	id := newUUID()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.allocs[id] = &nomadapi.Allocation{
		ID: id, Namespace: ns, JobID: jobID, TaskGroup: group,
		ClientStatus: nomadapi.AllocClientStatusRunning, DesiredStatus: nomadapi.AllocDesiredStatusRun,
		AllocatedResources: &nomadapi.AllocatedResources{Shared: nomadapi.AllocatedSharedResources{
			Ports: []nomadapi.PortMapping{{Label: "http", Value: port, HostIP: host}},
		}},
		ModifyIndex: f.index,
	}
	f.bump()
	return id
}

// setAllocStatus changes an allocation's client status.
func (f *fakeNomad) setAllocStatus(id, status string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.allocs[id].ClientStatus = status
	f.allocs[id].ModifyIndex = f.index
	f.bump()
}

func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func (f *fakeNomad) JobAllocations(ctx context.Context, ns, jobID string, waitIndex uint64, wait time.Duration) ([]*nomadapi.AllocationListStub, uint64, error) {
	f.listCalls.Add(1)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		f.mu.Lock()
		if f.err != nil {
			err := f.err
			f.mu.Unlock()
			return nil, 0, err
		}
		if f.index > waitIndex {
			var out []*nomadapi.AllocationListStub
			for _, a := range f.allocs {
				if a.Namespace == ns && a.JobID == jobID {
					out = append(out, &nomadapi.AllocationListStub{ID: a.ID, Namespace: a.Namespace, JobID: a.JobID,
						TaskGroup: a.TaskGroup, ClientStatus: a.ClientStatus, DesiredStatus: a.DesiredStatus, ModifyIndex: a.ModifyIndex})
				}
			}
			idx := f.index
			f.mu.Unlock()
			return out, idx, nil
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			f.mu.Lock()
			idx := f.index
			f.mu.Unlock()
			return nil, idx, nil
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
}

func (f *fakeNomad) Allocation(ctx context.Context, ns, id string) (*nomadapi.Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	a, ok := f.allocs[id]
	if !ok || a.Namespace != ns {
		return nil, nil
	}
	cp := *a
	return &cp, nil
}

func (f *fakeNomad) Job(ctx context.Context, ns, id string) (*nomadapi.Job, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	j, ok := f.jobs[ns+"/"+id]
	if !ok {
		return nil, nil
	}
	cp := *j
	return &cp, nil
}
