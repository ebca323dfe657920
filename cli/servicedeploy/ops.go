package servicedeploy

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/internal/contract"
)

// ErrNoService is Load's answer when Nomad has no job of the name: stop
// tells it apart from a job of another kind (it may still find a route
// left behind to remove).
var ErrNoService = errors.New("not found")

// Load reads a service's job and refuses one that is not a gpujob
// service, so no `gpujob service` verb acts on a job it did not make.
func Load(nomad nomadapi.API, name string) (*api.Job, error) {
	job, err := nomad.Job(name)
	if err != nil && !gpujobs.IsNotFound(err) {
		return nil, err
	}
	if job == nil {
		return nil, fmt.Errorf("service %q %w in Nomad at %s", name, ErrNoService, nomad.Address())
	}
	if !IsService(job) {
		return nil, fmt.Errorf("job %q is not a gpujob service (its meta has no %s = %q); use `nomad job status %s`",
			name, contract.MetaKind, contract.KindService, name)
	}
	return job, nil
}

// Scaled is a scale's outcome.
type Scaled struct {
	// Was is the replica count before; Count the one asked for.
	Was, Count int
	// EvalID is Nomad's evaluation of the scale, "" when the count was
	// already Count and nothing was asked of Nomad.
	EvalID string
}

// Scale sets service name's replica count to n through Nomad's scale API.
// n must lie within the spec's replicas { min max } (the job's scaling
// policy): outside them the autoscaler would move it straight back, and
// Nomad would refuse it anyway.
func Scale(nomad nomadapi.API, name string, n int) (Scaled, error) {
	job, err := Load(nomad, name)
	if err != nil {
		return Scaled{}, err
	}
	g := Group(job)
	if g == nil {
		return Scaled{}, fmt.Errorf("service %s has no %q group; was it deployed by gpujob?", name, render.ServiceGroup)
	}
	if job.Meta[contract.MetaAdmission] != "" && g.Scaling == nil {
		// Admitted by its queue as a fixed gang (deployed before services
		// kept their scaling block in queue mode): no bounds to scale in.
		return Scaled{}, fmt.Errorf("service %s was started by its queue with %d replica(s) and no replicas { min max } to scale in: "+
			"set them in the spec and deploy it again", name, deref(g.Count))
	}
	if p := g.Scaling; p != nil && p.Min != nil && p.Max != nil && (int64(n) < *p.Min || int64(n) > *p.Max) {
		return Scaled{}, fmt.Errorf("service %s runs %d to %d replicas (its replicas { min max }); %d is outside; change the spec and deploy to widen it",
			name, *p.Min, *p.Max, n)
	}
	out := Scaled{Was: deref(g.Count), Count: n}
	if out.Was == n {
		// A scale to the same count is still a new job version and
		// deployment in Nomad: skip it.
		return out, nil
	}
	reg, err := nomad.ScaleGroup(name, render.ServiceGroup, n, "gpujob service scale")
	if err != nil {
		return Scaled{}, err
	}
	out.EvalID = reg.EvalID
	return out, nil
}

// RollbackTarget is the version to go back to: to when given (to >= 0; it
// must not be the current one), else the newest stable one that serves
// another version than the current. versions is newest first.
func RollbackTarget(versions []*api.Job, to int64) (*api.Job, error) {
	if len(versions) == 0 {
		return nil, fmt.Errorf("no job versions")
	}
	cur := versions[0]
	if to >= 0 {
		if uint64(to) == deref(cur.Version) {
			return nil, fmt.Errorf("job version %d is the current one", to)
		}
		for _, v := range versions {
			if deref(v.Version) == uint64(to) {
				return v, nil
			}
		}
		return nil, fmt.Errorf("no job version %d (Nomad keeps the last few)", to)
	}
	for _, v := range versions[1:] {
		if deref(v.Stable) && v.Meta[contract.MetaVersion] != cur.Meta[contract.MetaVersion] {
			return v, nil
		}
	}
	return nil, fmt.Errorf("no earlier stable version serves another version than %s; name one with --to-version", cur.Meta[contract.MetaVersion])
}

// RolledBack is a registered rollback.
type RolledBack struct {
	// Target is the job version it goes back to.
	Target *api.Job
	// EvalID is Nomad's evaluation of the revert.
	EvalID string
	// RouteErr says why the route of Target could not be written: the
	// revert stands, and the gateways keep the route they had.
	RouteErr error
}

// Rollback makes an earlier job version of service name current again
// (RollbackTarget picks it; to < 0 lets it choose) and writes that
// version's route, which its job meta carries. It does not wait for the
// rolling update: AwaitRollback does.
func Rollback(ctx context.Context, nomad nomadapi.API, store servestore.Store, name string, to int64) (*RolledBack, error) {
	if _, err := Load(nomad, name); err != nil {
		return nil, err
	}
	versions, err := nomad.JobVersions(name)
	if err != nil {
		return nil, err
	}
	target, err := RollbackTarget(versions, to)
	if err != nil {
		return nil, fmt.Errorf("service %s: %w", name, err)
	}
	reg, err := nomad.Revert(name, deref(target.Version))
	if err != nil {
		return nil, err
	}
	return &RolledBack{Target: target, EvalID: reg.EvalID, RouteErr: PutRouteOf(ctx, store, target)}, nil
}

// AwaitRollback follows the deployment of service name's current job
// version (the one a revert registered) until it ends; an error when it
// did not succeed.
func AwaitRollback(ctx context.Context, nomad nomadapi.API, name string, progress func(*api.Deployment)) error {
	cur, err := nomad.Job(name)
	if err != nil {
		return err
	}
	d, err := Watch(ctx, nomad, name, deref(cur.Version), progress)
	if err != nil {
		return err
	}
	if d != nil && d.Status != api.DeploymentStatusSuccessful {
		return fmt.Errorf("rollback of %s %s: %s", name, d.Status, d.StatusDescription)
	}
	return nil
}

// Stopped is a stop's outcome.
type Stopped struct {
	// Orphan says the service had no job, only a route left by a deploy
	// whose job is gone: the route (and with purge its tokens) was
	// removed.
	Orphan bool
	// EvalID is Nomad's evaluation of the deregistration.
	EvalID string
}

// Stop removes service name's gateway route first (the gateways answer
// 404 for it from then on, instead of routing to replicas that are going
// away), then deregisters its job; purge also removes its tokens and the
// job's history. A route whose job is gone is removed too; a job of
// another kind is refused untouched.
func Stop(ctx context.Context, nomad nomadapi.API, store servestore.Store, ns, name string, purge bool) (Stopped, error) {
	_, jobErr := Load(nomad, name)
	if jobErr != nil && !errors.Is(jobErr, ErrNoService) {
		return Stopped{}, jobErr // another kind of job, or Nomad failing
	}
	route, err := store.Route(ctx, ns, name)
	if err != nil {
		return Stopped{}, err
	}
	if jobErr != nil && route == nil {
		return Stopped{}, jobErr
	}
	if err := store.DeleteRoute(ctx, ns, name); err != nil {
		return Stopped{}, err
	}
	out := Stopped{Orphan: jobErr != nil}
	if !out.Orphan {
		if out.EvalID, err = nomad.Deregister(name, purge); err != nil {
			return Stopped{}, err
		}
	}
	if purge {
		if err := store.DeleteService(ctx, ns, name); err != nil {
			return out, err
		}
	}
	return out, nil
}
