package servicedeploy

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/servekv"
)

// MetaRoute is the job meta that carries the route it was deployed with:
// also the job's claim to the route, which the gateways and the autoscaler
// check (servekv.JobRoute) before they send it traffic or scale it.
const MetaRoute = contract.MetaRoute

// RouteOf is the gateway's route to s in namespace ns.
func RouteOf(s *spec.Service, ns string) servekv.Route {
	r := servekv.Route{
		Namespace: ns, Service: s.Name,
		ConsulService: s.Name, Tag: render.ServiceTag(ns),
		PathPrefix: s.Route.Path, Host: s.Route.Host, Auth: s.Route.Auth,
		Timeout:    servekv.Duration(s.Route.Timeout),
		QueueLimit: s.Route.QueueLimit, QueueTimeout: servekv.Duration(s.Route.QueueTimeout),
		MaxBodyBytes: s.Route.MaxBodyBytes,
		JobID:        s.Name, Group: render.ServiceGroup,
	}
	if r.QueueLimit == 0 {
		r.QueueLimit = -1 // the spec's "hold none"; the gateway's 0 is its default
	}
	if rl := s.Route.RateLimit; rl != nil {
		r.RateLimit = &servekv.Limit{RPS: rl.RPS, Burst: rl.Burst}
	}
	if a := s.Autoscale; a != nil {
		r.Autoscale = &servekv.Autoscale{Min: s.Replicas.Min, Max: s.Replicas.Max, TargetInflight: a.TargetInflight,
			ScaleUpDelay: servekv.Duration(a.ScaleUpDelay), ScaleDownDelay: servekv.Duration(a.ScaleDownDelay)}
	}
	return r
}

// RestoreRoute writes the route of the job's current version when that
// version is no longer the one just deployed (a revert): it returns that
// version's label, "" when nothing was reverted.
func RestoreRoute(ctx context.Context, nomad nomadapi.API, store servestore.Store, name, deployed string) (string, error) {
	cur, err := nomad.Job(name)
	if err != nil {
		return "", fmt.Errorf("reading job %s: %w", name, err)
	}
	v := cur.Meta[contract.MetaVersion]
	if v == deployed {
		return "", nil
	}
	return v, PutRouteOf(ctx, store, cur)
}

// PutRouteOf writes the route a job version carries in its meta.
func PutRouteOf(ctx context.Context, store servestore.Store, job *api.Job) error {
	raw := job.Meta[MetaRoute]
	if raw == "" {
		return fmt.Errorf("job version %d carries no route (%s meta)", deref(job.Version), MetaRoute)
	}
	var r servekv.Route
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		return fmt.Errorf("job version %d: its %s meta: %w", deref(job.Version), MetaRoute, err)
	}
	return store.PutRoute(ctx, r)
}

// CheckRouteFree refuses a route that another service (of any namespace)
// has (RouteConflict), reading the routes from store.
func CheckRouteFree(ctx context.Context, store servestore.Store, s *spec.Service, ns string) error {
	routes, err := store.Routes(ctx)
	if err != nil {
		return err
	}
	return RouteConflict(routes, s, ns)
}

// RouteConflict refuses a route that another service (of any namespace)
// has among routes: the same host and path, or a path inside or around its
// path. The gateways would route the older one anyway; this says so before
// anything is deployed.
func RouteConflict(routes []servekv.Route, s *spec.Service, ns string) error {
	for _, r := range routes {
		if r.Namespace == ns && r.Service == s.Name {
			continue
		}
		if !strings.EqualFold(r.Host, s.Route.Host) {
			continue
		}
		if nested(r.PathPrefix, s.Route.Path) || nested(s.Route.Path, r.PathPrefix) {
			where := r.PathPrefix
			if r.Host != "" {
				where = r.Host + where
			}
			return fmt.Errorf("the route %s%s would take over %s, which service %s/%s has: choose another route.path (or route.host)",
				s.Route.Host, s.Route.Path, where, r.Namespace, r.Service)
		}
	}
	return nil
}

// nested reports whether path is prefix or lies under it, segment-wise.
func nested(prefix, path string) bool {
	prefix, path = strings.TrimSuffix(prefix, "/"), strings.TrimSuffix(path, "/")
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// IsService reports whether job is a gpujob service's.
func IsService(job *api.Job) bool {
	return job != nil && job.Meta[contract.MetaKind] == contract.KindService
}

// Group is the job's replica group, nil when it has none.
func Group(job *api.Job) *api.TaskGroup {
	for _, g := range job.TaskGroups {
		if g.Name != nil && *g.Name == render.ServiceGroup {
			return g
		}
	}
	return nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
