package service

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/explain"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gatewayclient"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/servekv"
)

type deployOptions struct {
	vars, varFiles []string
	detach         bool
	json           bool
	gateway        string
}

func newDeployCmd(f *factory.Factory) *cobra.Command {
	o := &deployOptions{}
	cmd := &cobra.Command{
		Use:   "deploy SPEC",
		Short: "Deploy a service spec, or roll out a new version of it",
		Long: `Deploy renders SPEC into a Nomad service job, registers it and writes its
gateway route to Consul. A service that runs already is updated in place:
its replica count is kept (a deploy does not undo the autoscaler or a
scale), and Nomad rolls the replicas over to the new version, through
canaries when the spec asks for them.

Deploy then follows the deployment until it succeeds (exit 0), or fails
(exit 1, saying why and whether Nomad reverted to the last good version).
--detach returns once the job is registered. If the cluster cannot place
the replicas now, deploy says why in plain words; Nomad places them when it
can.`,
		Example: `  gpujob service deploy jobspecs/examples/serve-bert.hcl
  gpujob service deploy -var version=v2 jobspecs/examples/serve-bert.hcl
  gpujob service deploy --detach -json serve.hcl`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return deploy(cmd.Context(), f, o, args[0])
		},
	}
	gpujobs.AddSpecFlags(cmd, &o.vars, &o.varFiles)
	cmd.Flags().BoolVar(&o.detach, "detach", false, "return once the job is registered")
	cmd.Flags().BoolVar(&o.json, "json", false, "print the outcome as JSON")
	addGatewayFlag(cmd, &o.gateway)
	return cmd
}

// DeployResult is deploy's outcome, for -json.
type DeployResult struct {
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
}

func deploy(ctx context.Context, f *factory.Factory, o *deployOptions, path string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	s, files, diags := spec.LoadService(path, spec.Options{Vars: o.vars, VarFiles: o.varFiles})
	if diags.HasErrors() {
		fmt.Fprint(f.IO.ErrOut, spec.Format(diags, files))
		return &cmdutil.ExitError{Code: 1, Err: fmt.Errorf("%s: the spec has errors; nothing was deployed", path)}
	}
	ro := render.ServiceOptions{Namespace: f.Namespace()}
	ns := ro.ServiceNamespace(s)
	if s.Namespace != "" && s.Namespace != f.Namespace() {
		// The job would land in one namespace (Nomad takes the CLI's)
		// and its route and tag would name the other.
		return fmt.Errorf("%s: the service's namespace %q differs from the namespace the CLI uses (%s): set --namespace %s",
			path, s.Namespace, f.Namespace(), s.Namespace)
	}
	hcl, err := ro.ServiceJobspec(s)
	if err != nil {
		return fmt.Errorf("rendering %s: %w", path, err)
	}
	nomad, err := f.Nomad()
	if err != nil {
		return err
	}
	store, err := servestore.Open(f)
	if err != nil {
		return err
	}
	job, err := nomad.ParseHCL(string(hcl), "")
	if err != nil {
		return err
	}
	if err := checkRouteFree(ctx, store, s, ns); err != nil {
		return err
	}
	existing, err := nomad.Job(s.Name)
	if err != nil && !gpujobs.IsNotFound(err) {
		return err
	}
	if existing != nil && !IsService(existing) {
		return fmt.Errorf("a job named %s exists in Nomad at %s and is not a gpujob service; choose another service name or stop that job", s.Name, nomad.Address())
	}
	if existing != nil && deref(existing.Stop) {
		existing = nil // stopped: a fresh start at the spec's count
	}
	nodes, err := observe.ClusterGPUs(nomad)
	if err != nil {
		return err
	}
	plan, err := nomad.Plan(job)
	if err != nil {
		return err
	}
	ask := explain.Ask{Workers: s.Replicas.Initial, GPUsPerWorker: s.GPUsPerReplica, NodePool: s.NodePool,
		Datacenters: s.Datacenters, CPU: s.Resources.CPU, MemoryMiB: s.Resources.MemoryMiB}
	if s.GPU != nil {
		ask.Model, ask.MinGPUMemoryMiB = s.GPU.Model, s.GPU.MinMemoryMiB
	}
	why := explain.Placement(ask, plan.FailedTGAllocs[render.ServiceGroup], nodes)

	// An update of an autoscaled service keeps the count the autoscaler
	// (or a scale) set, within the new bounds; a fixed one takes the
	// spec's.
	if existing != nil && s.Autoscale != nil {
		if g, eg := group(job), group(existing); g != nil && eg != nil && eg.Count != nil {
			n := min(max(*eg.Count, s.Replicas.Min), s.Replicas.Max)
			g.Count = &n
		}
	}
	// The route goes with the job, in its meta: a revert (Nomad's
	// auto_revert, gpujob service rollback) brings the route of the
	// version it goes back to (restoreRoute).
	route := RouteOf(s, ns)
	routeJSON, err := json.Marshal(route)
	if err != nil {
		return err
	}
	if job.Meta == nil {
		job.Meta = map[string]string{}
	}
	job.Meta[MetaRoute] = string(routeJSON)
	reg, err := nomad.Register(job)
	if err != nil {
		return err
	}
	// The route once the job is registered, so a failed register leaves
	// the old one. A gateway that learns of the service before its
	// replicas are healthy holds the first requests; one that was routing
	// keeps routing through the update.
	if err := store.PutRoute(ctx, route); err != nil {
		return fmt.Errorf("%s is registered, but its route is not: %w (deploy again)", s.Name, err)
	}
	res := DeployResult{Service: s.Name, Namespace: ns, Version: s.Version, EvalID: reg.EvalID, Status: "registered",
		Queued: why, Endpoint: gatewayclient.Addr(o.gateway) + s.Route.Path}
	cur, err := nomad.Job(s.Name)
	if err != nil {
		return err
	}
	res.JobVersion = deref(cur.Version)
	out := f.IO.Out
	if !o.json {
		verb := "deployed"
		if existing != nil {
			verb = "updating"
		}
		fmt.Fprintf(out, "%s %s %s (job version %d): %d replica(s) × %d GPU(s), evaluation %s\n",
			verb, s.Name, s.Version, res.JobVersion, deref(group(cur).Count), s.GPUsPerReplica, gpujobs.ShortID(reg.EvalID))
		if why != "" {
			fmt.Fprintf(out, "queued: %s\n", why)
		}
	}
	if o.detach {
		return finish(out, o.json, res, nil)
	}
	d, err := watchDeployment(ctx, nomad, s.Name, res.JobVersion, progressTo(out, o.json))
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(f.IO.ErrOut, "stopped watching; the deployment goes on: gpujob service status %s\n", s.Name)
			return nil
		}
		return err
	}
	if d != nil {
		res.Deployment, res.Status, res.Description = d.ID, d.Status, d.StatusDescription
	} else {
		res.Status = "successful" // an unchanged job: nothing to roll out
	}
	var failed error
	if res.Status != api.DeploymentStatusSuccessful {
		failed = &cmdutil.ExitError{Code: 1, Err: fmt.Errorf("deployment of %s %s %s: %s", s.Name, s.Version, res.Status, res.Description)}
		// Nomad's auto_revert registered the last good version again:
		// its route goes back with it.
		if v, err := restoreRoute(ctx, nomad, store, s.Name, s.Version); err != nil {
			fmt.Fprintf(f.IO.ErrOut, "gpujob: restoring the route of the version Nomad reverted to: %v\n", err)
		} else if v != "" && !o.json {
			fmt.Fprintf(out, "%s is back on %s, with its route\n", s.Name, v)
		}
	}
	return finish(out, o.json, res, failed)
}

func finish(out io.Writer, asJSON bool, res DeployResult, failed error) error {
	if asJSON {
		if err := gpujobs.PrintJSON(out, res); err != nil {
			return err
		}
		return failed
	}
	if failed == nil {
		switch res.Status {
		case "registered":
			fmt.Fprintf(out, "follow it: gpujob service status %s\n", res.Service)
		default:
			fmt.Fprintf(out, "%s %s is live at %s\n", res.Service, res.Version, res.Endpoint)
		}
	}
	return failed
}

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

// MetaRoute is the job meta that carries the route it was deployed with:
// also the job's claim to the route, which the gateways and the autoscaler
// check (servekv.JobRoute) before they send it traffic or scale it.
const MetaRoute = contract.MetaRoute

// restoreRoute writes the route of the job's current version when that
// version is no longer the one just deployed (a revert): it returns that
// version's label, "" when nothing was reverted.
func restoreRoute(ctx context.Context, nomad nomadapi.API, store servestore.Store, name, deployed string) (string, error) {
	cur, err := nomad.Job(name)
	if err != nil {
		return "", err
	}
	v := cur.Meta[contract.MetaVersion]
	if v == deployed {
		return "", nil
	}
	return v, putRouteOf(ctx, store, cur)
}

// putRouteOf writes the route a job version carries in its meta.
func putRouteOf(ctx context.Context, store servestore.Store, job *api.Job) error {
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

// checkRouteFree refuses a route that another service (of any namespace)
// has: the same host and path, or a path inside or around its path. The
// gateways would route the older one anyway; this says so before
// anything is deployed.
func checkRouteFree(ctx context.Context, store servestore.Store, s *spec.Service, ns string) error {
	routes, err := store.Routes(ctx)
	if err != nil {
		return err
	}
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
