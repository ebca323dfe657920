package gateway

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/autoscale"
)

// nomadClients are Nomad clients by namespace, made on first use: what
// the gateway (replica admission) and the autoscaler read and scale.
type nomadClients struct {
	mu        sync.Mutex
	clients   map[string]nomadapi.API
	newClient func(ns string) (nomadapi.API, error)
}

func newNomadClients(newClient func(ns string) (nomadapi.API, error)) *nomadClients {
	return &nomadClients{clients: map[string]nomadapi.API{}, newClient: newClient}
}

func (s *nomadClients) client(ns string) (nomadapi.API, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clients[ns]; ok {
		return c, nil
	}
	c, err := s.newClient(ns)
	if err != nil {
		return nil, err
	}
	s.clients[ns] = c
	return c, nil
}

// JobAllocations is a blocking query on the job's allocations
// (gateway.Nomad).
func (s *nomadClients) JobAllocations(ctx context.Context, ns, jobID string, waitIndex uint64, wait time.Duration) ([]*api.AllocationListStub, uint64, error) {
	c, err := s.client(ns)
	if err != nil {
		return nil, 0, err
	}
	q := (&api.QueryOptions{WaitIndex: waitIndex, WaitTime: wait}).WithContext(ctx)
	allocs, meta, err := c.JobAllocations(jobID, q)
	if err != nil {
		return nil, 0, err
	}
	return allocs, meta.LastIndex, nil
}

// Allocation reads one allocation whole (gateway.Nomad).
func (s *nomadClients) Allocation(_ context.Context, ns, allocID string) (*api.Allocation, error) {
	c, err := s.client(ns)
	if err != nil {
		return nil, err
	}
	a, err := c.Allocation(allocID)
	if err != nil && gpujobs.IsNotFound(err) {
		return nil, nil
	}
	return a, err
}

// Job reads a job (gateway.Nomad).
func (s *nomadClients) Job(_ context.Context, ns, jobID string) (*api.Job, error) {
	c, err := s.client(ns)
	if err != nil {
		return nil, err
	}
	j, err := c.Job(jobID)
	if err != nil && gpujobs.IsNotFound(err) {
		return nil, nil
	}
	return j, err
}

// Group reads a job's group count and its claim to a route
// (autoscale.Scaler).
func (s *nomadClients) Group(_ context.Context, ns, jobID, group string) (autoscale.Group, error) {
	c, err := s.client(ns)
	if err != nil {
		return autoscale.Group{}, err
	}
	job, err := c.Job(jobID)
	if err != nil {
		return autoscale.Group{}, err
	}
	out := autoscale.Group{Meta: job.Meta}
	if job.Namespace != nil {
		out.JobNamespace = *job.Namespace
	}
	for _, g := range job.TaskGroups {
		if g.Name != nil && *g.Name == group && g.Count != nil {
			out.Count = *g.Count
			return out, nil
		}
	}
	return autoscale.Group{}, fmt.Errorf("job %s/%s has no group %q", ns, jobID, group)
}

// Scale sets a group's count (autoscale.Scaler).
func (s *nomadClients) Scale(_ context.Context, ns, jobID, group string, count int, reason string) error {
	c, err := s.client(ns)
	if err != nil {
		return err
	}
	_, err = c.ScaleGroup(jobID, group, count, "gpujob gateway: "+reason)
	if err != nil && strings.Contains(err.Error(), "blocked due to active deployment") {
		// Nomad's words (job_endpoint.go): it has no error code of its own.
		return fmt.Errorf("%w: %v", autoscale.ErrBusy, err)
	}
	return err
}
