package service

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/command/gpujobs"
	"github.com/gpujob/gpujob/cli/command/submit"
	"github.com/gpujob/gpujob/cli/explain"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
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
		return &submit.ExitError{Code: 1, Err: fmt.Errorf("%s: the spec has errors; nothing was deployed", path)}
	}
	ro := render.ServiceOptions{Namespace: f.Namespace()}
	ns := ro.ServiceNamespace(s)
	hcl, err := ro.ServiceJobspec(s)
	if err != nil {
		return fmt.Errorf("rendering %s: %w", path, err)
	}
	nomad, err := f.Nomad()
	if err != nil {
		return err
	}
	store, err := Store(f)
	if err != nil {
		return err
	}
	job, err := nomad.ParseHCL(string(hcl), "")
	if err != nil {
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
	nodes, err := submit.ClusterGPUs(nomad)
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

	// The route first: a gateway that learns of the service before its
	// replicas are healthy holds the first requests instead of answering
	// 404, and one that was routing keeps routing through the update.
	if err := store.PutRoute(ctx, RouteOf(s, ns)); err != nil {
		return err
	}
	var reg *api.JobRegisterResponse
	if existing != nil {
		reg, err = nomad.RegisterPreservingCounts(job)
	} else {
		reg, err = nomad.Register(job)
	}
	if err != nil {
		return err
	}
	res := DeployResult{Service: s.Name, Namespace: ns, Version: s.Version, EvalID: reg.EvalID, Status: "registered",
		Queued: why, Endpoint: gatewayAddr(o.gateway) + s.Route.Path}
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
		failed = &submit.ExitError{Code: 1, Err: fmt.Errorf("deployment of %s %s %s: %s", s.Name, s.Version, res.Status, res.Description)}
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
		JobID: s.Name, Group: render.ServiceGroup,
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

var errNoDeployment = errors.New("no deployment")
