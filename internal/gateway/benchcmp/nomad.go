package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/servekv"
)

// benchNomad is the Nomad the benchmark's gateway asks which replicas it
// may route to: the job bench-echo, claiming the benchmark's route, with one
// running allocation per replica address (allocIDFmt, numbered from 1 as
// register names them). Nothing changes, so its blocking query blocks for
// its whole wait, as Nomad's would.
type benchNomad struct {
	job    *nomadapi.Job
	allocs []*nomadapi.Allocation
}

func newBenchNomad(replicas string) *benchNomad {
	ns, id := benchNS, benchJob
	claim, _ := json.Marshal(servekv.Route{Namespace: benchNS, Service: benchService, JobID: benchJob, Group: benchGroup})
	n := &benchNomad{job: &nomadapi.Job{ID: &id, Namespace: &ns,
		Meta: map[string]string{servekv.JobMetaKind: servekv.JobKindService, servekv.JobMetaRoute: string(claim)}}}
	for i, addr := range strings.Split(replicas, ",") {
		host, portS, err := net.SplitHostPort(addr)
		if err != nil {
			continue
		}
		port, _ := strconv.Atoi(portS)
		n.allocs = append(n.allocs, &nomadapi.Allocation{
			ID: fmt.Sprintf(allocIDFmt, i+1), Namespace: benchNS, JobID: benchJob, TaskGroup: benchGroup,
			ClientStatus: nomadapi.AllocClientStatusRunning, DesiredStatus: nomadapi.AllocDesiredStatusRun,
			AllocatedResources: &nomadapi.AllocatedResources{Shared: nomadapi.AllocatedSharedResources{
				Ports: []nomadapi.PortMapping{{Label: "http", Value: port, HostIP: host}}}},
		})
	}
	return n
}

func (n *benchNomad) JobAllocations(ctx context.Context, ns, jobID string, waitIndex uint64, wait time.Duration) ([]*nomadapi.AllocationListStub, uint64, error) {
	if waitIndex > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
	var out []*nomadapi.AllocationListStub
	if ns == benchNS && jobID == benchJob {
		for _, a := range n.allocs {
			out = append(out, &nomadapi.AllocationListStub{ID: a.ID, Namespace: a.Namespace, JobID: a.JobID,
				TaskGroup: a.TaskGroup, ClientStatus: a.ClientStatus, DesiredStatus: a.DesiredStatus})
		}
	}
	return out, 1, nil
}

func (n *benchNomad) Allocation(_ context.Context, ns, id string) (*nomadapi.Allocation, error) {
	for _, a := range n.allocs {
		if a.ID == id && a.Namespace == ns {
			return a, nil
		}
	}
	return nil, nil
}

func (n *benchNomad) Job(_ context.Context, ns, id string) (*nomadapi.Job, error) {
	if ns == benchNS && id == benchJob {
		return n.job, nil
	}
	return nil, nil
}
