// Package servicedeploy deploys a gpujob service: it renders the spec,
// checks the route and the name are free, explains a placement the
// cluster cannot make now, keeps an autoscaled service's replica count,
// registers the job with its route in its meta, writes the route, follows
// the deployment, and brings back the route of the version Nomad reverts
// to when it fails. `gpujob service deploy` and `rollback` print what it
// does.
package servicedeploy

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/explain"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/cli/queues"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/servekv"
)

// Result is a deployment's outcome (`gpujob service deploy -json`).
type Result struct {
	Service    string `json:"service"`
	Namespace  string `json:"namespace"`
	Version    string `json:"version"`
	JobVersion uint64 `json:"job_version"`
	EvalID     string `json:"eval_id"`
	Deployment string `json:"deployment_id,omitempty"`
	Status     string `json:"status"` // registered, successful, failed
	// Description is Nomad's account of the deployment's end.
	Description string `json:"description,omitempty"`
	Queued      string `json:"queued,omitempty"` // why replicas cannot be placed now
	Endpoint    string `json:"endpoint"`
	// Queue is the service's place in its queue when it went through one
	// (queue mode: a queue configuration exists); Status is then "queued"
	// until the admission controller registers it.
	Queue *queues.Info `json:"queue,omitempty"`
}

// Request is a service to deploy.
type Request struct {
	Service *spec.Service
	// Namespace is the CLI's Nomad namespace: the job lands there, so a
	// spec that names another is refused.
	Namespace string
	// Gateway is the gateway's URL, for the endpoint.
	Gateway string
	// Admit, when set, checks the service against its queue before
	// anything is registered or written (the CLI's queues.CheckSubmitMode),
	// and says whether the cluster is in queue mode; nodes are the
	// cluster's as Register read them.
	Admit func(ctx context.Context, gang policy.Job, nodes []explain.Node) (queued bool, err error)
	// Records are the queued jobs' records, for queue mode (Admit says
	// so): a new service goes into its queue, an update of one the queue
	// admitted keeps its admission (UpdateQueued).
	Records     queues.Records
	SubmittedBy string
	Now         time.Time
}

// Gang is the service as the queue policy counts it: its initial replicas
// (at least one) at once, each with its GPUs, CPU and memory.
func Gang(s *spec.Service) policy.Job {
	return policy.Job{ID: s.Name, Queue: s.Queue, Kind: policy.KindService, Priority: s.Priority,
		Members: max(s.Replicas.Initial, 1), PerMember: policy.Resources{GPUs: s.GPUsPerReplica, CPUMHz: s.Resources.CPU,
			MemoryMB: s.Resources.MemoryMiB}}
}

// Registered is a registered service job.
type Registered struct {
	Result Result
	// Update says a running version was updated, not started afresh.
	Update bool
	// Replicas is the registered job's replica count.
	Replicas int
	// Queued is the service's queue entry when it went into its queue
	// (nothing registered in Nomad yet); nil otherwise.
	Queued *queues.Entry
}

// Register renders req's service into a Nomad job and registers it, then
// writes its route. It refuses a spec naming another namespace than the
// CLI's, a route another service has, a name a job that is not a gpujob
// service has, and what req.Admit refuses; it says why Nomad cannot place the replicas now
// (Result.Queued); an update of an autoscaled service keeps the count the
// autoscaler (or a scale) set, within the new bounds.
func Register(ctx context.Context, nomad nomadapi.API, store servestore.Store, req Request) (*Registered, error) {
	s := req.Service
	ro := render.ServiceOptions{Namespace: req.Namespace}
	ns := ro.ServiceNamespace(s)
	if s.Namespace != "" && s.Namespace != req.Namespace {
		// The job would land in one namespace (Nomad takes the CLI's)
		// and its route and tag would name the other.
		return nil, fmt.Errorf("the service's namespace %q differs from the namespace the CLI uses (%s): set --namespace %s",
			s.Namespace, req.Namespace, s.Namespace)
	}
	hcl, err := ro.ServiceJobspec(s)
	if err != nil {
		return nil, fmt.Errorf("rendering service %s: %w", s.Name, err)
	}
	job, err := nomad.ParseHCL(string(hcl), "")
	if err != nil {
		return nil, fmt.Errorf("parsing the rendered job of %s: %w", s.Name, err)
	}
	if err := CheckRouteFree(ctx, store, s, ns); err != nil {
		return nil, err
	}
	existing, err := nomad.Job(s.Name)
	if err != nil && !gpujobs.IsNotFound(err) {
		return nil, fmt.Errorf("reading job %s: %w", s.Name, err)
	}
	if existing != nil && !IsService(existing) {
		return nil, fmt.Errorf("a job named %s exists in Nomad at %s and is not a gpujob service; choose another service name or stop that job", s.Name, nomad.Address())
	}
	if existing != nil && deref(existing.Stop) {
		existing = nil // stopped: a fresh start at the spec's count
	}
	nodes, err := observe.ClusterGPUs(nomad)
	if err != nil {
		return nil, fmt.Errorf("reading the cluster's GPUs: %w", err)
	}
	inQueue := false
	if req.Admit != nil {
		if inQueue, err = req.Admit(ctx, Gang(s), nodes); err != nil {
			return nil, err
		}
	}
	why, err := queued(nomad, s, job, nodes)
	if err != nil {
		return nil, err
	}
	if existing != nil && s.Autoscale != nil {
		KeepCount(job, existing, s.Replicas.Min, s.Replicas.Max)
	}
	// In queue mode a new service goes into its queue; an update of a
	// service the queue admitted is registered directly, keeping the
	// admission (QueueRules). One registered before queue mode is updated
	// as before: the controller counts it, never preempts it.
	//
	// The queue admits the initial replicas as one gang; the scaling block
	// stays, so the service scales within replicas { min max } (the
	// autoscaler, gpujob service scale) through Nomad, and the admission
	// controller weighs the replicas Nomad cannot place like a gang of the
	// service's class, preempting lower work of its queue for them.
	admitted := existing != nil && existing.Meta[contract.MetaAdmission] != ""
	// The route goes with the job, in its meta: a revert (Nomad's
	// auto_revert, gpujob service rollback) brings the route of the
	// version it goes back to (RestoreRoute).
	route := RouteOf(s, ns)
	routeJSON, err := json.Marshal(route)
	if err != nil {
		return nil, fmt.Errorf("encoding the route of %s: %w", s.Name, err)
	}
	if job.Meta == nil {
		job.Meta = map[string]string{}
	}
	job.Meta[MetaRoute] = string(routeJSON)
	if inQueue && existing == nil {
		return enqueue(ctx, store, req, job, route, why)
	}
	if inQueue && admitted {
		if err := updateAdmitted(ctx, req, job, existing); err != nil {
			return nil, err
		}
	}
	reg, err := nomad.Register(job)
	if err != nil {
		return nil, err
	}
	// The route once the job is registered, so a failed register leaves
	// the old one. A gateway that learns of the service before its
	// replicas are healthy holds the first requests; one that was routing
	// keeps routing through the update.
	if err := store.PutRoute(ctx, route); err != nil {
		return nil, fmt.Errorf("%s is registered, but its route is not: %w (deploy again)", s.Name, err)
	}
	cur, err := nomad.Job(s.Name)
	if err != nil {
		return nil, fmt.Errorf("reading job %s: %w", s.Name, err)
	}
	out := &Registered{Update: existing != nil, Result: Result{Service: s.Name, Namespace: ns, Version: s.Version,
		EvalID: reg.EvalID, Status: "registered", Queued: why, Endpoint: req.Gateway + s.Route.Path,
		JobVersion: deref(cur.Version)}}
	if g := Group(cur); g != nil {
		out.Replicas = deref(g.Count)
	}
	return out, nil
}

// enqueue writes the new service's queue record, then its route (the
// gateway holds requests until a replica is healthy).
func enqueue(ctx context.Context, store servestore.Store, req Request, job *api.Job, route servekv.Route, why string) (*Registered, error) {
	s := req.Service
	e, err := req.Records.Enqueue(ctx, queues.EnqueueOptions{Job: job, Namespace: req.Namespace, Queue: s.Queue,
		Kind: admit.KindService, Priority: queues.SpecPriority(s.Priority), SubmittedBy: req.SubmittedBy, Now: req.Now, NoLiveJob: true})
	if err != nil {
		return nil, err
	}
	if err := store.PutRoute(ctx, route); err != nil {
		return nil, fmt.Errorf("%s is queued, but its route is not written: %w (gpujob service stop %s, then deploy again)", s.Name, err, s.Name)
	}
	return &Registered{Queued: e, Replicas: e.Record.Members, Result: Result{Service: s.Name, Namespace: route.Namespace, Version: s.Version,
		Status: "queued", Queued: why, Endpoint: req.Gateway + s.Route.Path, Queue: e.Info()}}, nil
}

// updateAdmitted prepares the update of a service the queue admitted: the
// new job keeps the admission marker (a job without it would be a job the
// queue never admitted, and the controller would forget the admission),
// may not ask for more GPUs than the admission covers, and replaces the
// queue record's job, so that a requeue after a preemption starts the new
// version. It refuses a bigger update: stop the service and deploy it
// again to queue it at its new size.
func updateAdmitted(ctx context.Context, req Request, job, existing *api.Job) error {
	s := req.Service
	e, err := req.Records.Get(ctx, req.Namespace, s.Name)
	if err != nil {
		return err
	}
	if e != nil && e.Invalid == "" {
		had, g := e.Record.Members*e.Record.PerMember.GPUs, Gang(s)
		if want := g.Members * g.PerMember.GPUs; want > had {
			return fmt.Errorf("service %s was admitted by queue %s with %d GPUs; this update asks for %d: an update may not add GPUs "+
				"(the queue did not admit them): gpujob service stop %s, then deploy again to queue it at its new size",
				s.Name, e.Info().Queue, had, want, s.Name)
		}
		if _, err := req.Records.Update(ctx, e, queues.EnqueueOptions{Job: job, Namespace: req.Namespace, Queue: s.Queue,
			Kind: admit.KindService, Priority: queues.SpecPriority(s.Priority)}); err != nil {
			return err
		}
	}
	job.Meta[contract.MetaAdmission] = existing.Meta[contract.MetaAdmission]
	return nil
}

// queued says, in plain words, why Nomad cannot place the job's replicas
// now; "" when it can.
func queued(nomad nomadapi.API, s *spec.Service, job *api.Job, nodes []explain.Node) (string, error) {
	plan, err := nomad.Plan(job)
	if err != nil {
		return "", fmt.Errorf("planning job %s: %w", s.Name, err)
	}
	ask := explain.Ask{Workers: s.Replicas.Initial, GPUsPerWorker: s.GPUsPerReplica, NodePool: s.NodePool,
		Datacenters: s.Datacenters, CPU: s.Resources.CPU, MemoryMiB: s.Resources.MemoryMiB}
	if s.GPU != nil {
		ask.Model, ask.MinGPUMemoryMiB = s.GPU.Model, s.GPU.MinMemoryMiB
	}
	return explain.Placement(ask, plan.FailedTGAllocs[render.ServiceGroup], nodes), nil
}

// KeepCount sets job's replica count to existing's, within [lo, hi]: an
// update of an autoscaled service does not undo the autoscaler or a scale.
func KeepCount(job, existing *api.Job, lo, hi int) {
	g, eg := Group(job), Group(existing)
	if g == nil || eg == nil || eg.Count == nil {
		return
	}
	n := min(max(*eg.Count, lo), hi)
	g.Count = &n
}

// Conclude records in res how the deployment d ended (nil: Nomad had
// nothing to roll out) and, when it failed, writes the route of the
// version Nomad's auto_revert went back to. failed is non-nil for a
// deployment that did not succeed; revertedTo names the version Nomad
// went back to ("" when none); restoreErr says why its route could not be
// written.
func Conclude(ctx context.Context, nomad nomadapi.API, store servestore.Store, res *Result, d *api.Deployment) (revertedTo string, restoreErr, failed error) {
	if d != nil {
		res.Deployment, res.Status, res.Description = d.ID, d.Status, d.StatusDescription
	} else {
		res.Status = api.DeploymentStatusSuccessful // an unchanged job: nothing to roll out
	}
	if res.Status == api.DeploymentStatusSuccessful {
		return "", nil, nil
	}
	failed = fmt.Errorf("deployment of %s %s %s: %s", res.Service, res.Version, res.Status, res.Description)
	revertedTo, restoreErr = RestoreRoute(ctx, nomad, store, res.Service, res.Version)
	return revertedTo, restoreErr, failed
}
