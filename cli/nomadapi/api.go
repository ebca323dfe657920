// Package nomadapi is the slice of the Nomad HTTP API the gpujob CLI uses,
// behind an interface so every command is unit-tested against a fake.
package nomadapi

import (
	"errors"

	"github.com/hashicorp/nomad/api"
)

// API is what the commands need of Nomad. Blocking queries go through the
// QueryOptions (WaitIndex/WaitTime); nothing here polls on a timer.
type API interface {
	// Address is the agent's address, for error messages and hints.
	Address() string

	// ParseHCL parses a jobspec with the agent's own HCL2 parser; vars is
	// the content of a variables file.
	ParseHCL(jobHCL, vars string) (*api.Job, error)
	Validate(job *api.Job) (*api.JobValidateResponse, error)
	Plan(job *api.Job) (*api.JobPlanResponse, error)
	Register(job *api.Job) (*api.JobRegisterResponse, error)
	// RegisterNew registers job only if no job of its ID exists (Nomad's
	// enforce_index 0); otherwise it returns an error wrapping
	// ErrJobExists and changes nothing.
	RegisterNew(job *api.Job) (*api.JobRegisterResponse, error)
	Deregister(jobID string, purge bool) (string, error)

	Job(jobID string) (*api.Job, error)
	Jobs(q *api.QueryOptions) ([]*api.JobListStub, *api.QueryMeta, error)
	JobSummary(jobID string) (*api.JobSummary, error)
	JobAllocations(jobID string, q *api.QueryOptions) ([]*api.AllocationListStub, *api.QueryMeta, error)
	Evaluation(evalID string, q *api.QueryOptions) (*api.Evaluation, *api.QueryMeta, error)

	Allocation(allocID string) (*api.Allocation, error)
	// Allocations lists the allocations of q's namespace ("*": all); the
	// params resources=true and task_states=true add their reserved
	// resources and task states to the stubs.
	Allocations(q *api.QueryOptions) ([]*api.AllocationListStub, *api.QueryMeta, error)
	// Logs streams a task's log; follow keeps it open. Frames and errors
	// arrive on the channels until cancel is closed or the log ends.
	Logs(alloc *api.Allocation, task, stream string, follow bool, cancel <-chan struct{}) (<-chan *api.StreamFrame, <-chan error)

	Nodes(q *api.QueryOptions) ([]*api.NodeListStub, *api.QueryMeta, error)
	Node(nodeID string) (*api.Node, error)
	NodeAllocations(nodeID string) ([]*api.Allocation, error)
	// NodeStats is the client's host stats, GPU device stats included.
	NodeStats(nodeID string) (*api.HostStats, error)

	// ACLEnabled reports whether the cluster enforces ACLs (asking for the
	// request's own token: Nomad answers "ACL support disabled" when not).
	ACLEnabled() (bool, error)
	// ACL policies and tokens; Nomad 1.6 lets only a management token
	// touch them. Deleting what is not there is not an error.
	UpsertACLPolicy(p *api.ACLPolicy) error
	DeleteACLPolicy(name string) error
	CreateACLToken(t *api.ACLToken) (*api.ACLToken, error)
	ACLTokens() ([]*api.ACLTokenListStub, error)
	DeleteACLToken(accessorID string) error
	// Variables (Nomad's secrets store) in the client's namespace. Variable
	// returns nil, nil when there is none at path; deleting what is not
	// there is not an error.
	PutVariable(v *api.Variable) error
	Variable(path string) (*api.Variable, error)
	DeleteVariable(path string) error

	// Services (service.go). ScaleGroup sets one group's count with a
	// message saying why; LatestDeployment is the job's newest deployment (nil
	// when it has none); JobVersions lists its versions, newest first;
	// Revert makes an earlier version the current one again.
	ScaleGroup(jobID, group string, count int, message string) (*api.JobRegisterResponse, error)
	LatestDeployment(jobID string, q *api.QueryOptions) (*api.Deployment, *api.QueryMeta, error)
	JobVersions(jobID string) ([]*api.Job, error)
	Revert(jobID string, version uint64) (*api.JobRegisterResponse, error)
}

// ErrJobExists is RegisterNew's answer when a job of that ID exists.
var ErrJobExists = errors.New("a job of that ID already exists")
