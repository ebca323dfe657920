package admit

import (
	"context"
	"errors"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/queue/policy"
)

// Nomad is what the controller needs of Nomad: a seam, so that the
// controller is tested against a fake and wired to the API client (with
// the controller's own token) elsewhere.
type Nomad interface {
	// Nodes lists the client nodes that take gpujob work (ready, eligible,
	// with a healthy gpujob driver), with what they offer allocations.
	// Their Unmanaged is ignored: the controller counts it from
	// Allocations.
	Nodes(ctx context.Context) ([]policy.Node, error)
	// Allocations lists every allocation that holds resources on a client
	// now: client status pending or running, whatever the server wants of
	// it (an allocation being stopped holds its GPUs until it has).
	Allocations(ctx context.Context) ([]Alloc, error)
	// WaitAllocations blocks (a Nomad blocking query) until allocations
	// may have changed since index, and returns the new index; index 0
	// returns at once.
	WaitAllocations(ctx context.Context, index uint64) (uint64, error)
	// Job reads a job; nil (and no error) when there is none.
	Job(ctx context.Context, namespace, id string) (*JobInfo, error)
	// Plan is Nomad's plan (a dry run of the scheduler) of job against
	// the cluster as it is.
	Plan(ctx context.Context, job *api.Job) (*api.JobPlanResponse, error)
	// Register registers job only if its job modify index is still
	// enforceIndex (0: only if no such job exists); ErrConflict if not.
	Register(ctx context.Context, job *api.Job, enforceIndex uint64) error
	// Stop stops (deregisters, not purging) the job, every allocation of
	// it; a missing job is success.
	Stop(ctx context.Context, namespace, id string) error
	// JobAllocations lists every allocation of one job, terminal ones
	// too (Nomad's /v1/job/<id>/allocations), each with its ClientStatus
	// and DesiredStatus and the meta of the job version it ran (JobMeta:
	// the allocation's JobVersion through /v1/job/<id>/versions), for the
	// partial-gang guard: a member that ended by itself is not missing.
	// Resources and Node may be left empty. A missing job has none.
	JobAllocations(ctx context.Context, namespace, id string) ([]Alloc, error)
	// Unplaced is how many allocations of the job Nomad has been asked
	// for and has placed nowhere yet (its job summary's queued ones: a
	// blocked evaluation's), e.g. a service's replicas added by a scale
	// that no node has room for. A missing job has none.
	Unplaced(ctx context.Context, namespace, id string) (int, error)
}

// ErrConflict is a Register whose index check failed.
var ErrConflict = errors.New("the job changed since it was read")

// Alloc is one allocation that holds resources.
type Alloc struct {
	ID        string
	Namespace string
	JobID     string
	Node      string
	// JobMeta is its job's meta (MetaKind marks gpujob's jobs,
	// MetaAdmission the admission that registered it).
	JobMeta   map[string]string
	Resources policy.Resources
	// ClientStatus and DesiredStatus are Nomad's (pending, running,
	// complete, failed, lost; run, stop, evict); JobAllocations fills
	// them, Allocations may.
	ClientStatus, DesiredStatus string
}

// JobInfo is what the controller reads of a job.
type JobInfo struct {
	Meta map[string]string
	// Stop: the job was stopped (deregistered without purge).
	Stop bool
	// Status is Nomad's: pending, running or dead.
	Status string
	// ModifyIndex is the job's JobModifyIndex, for Register's check.
	ModifyIndex uint64
}
