package service

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gatewayclient"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/cli/servicedeploy"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/servekv"
)

func newStatusCmd(f *factory.Factory) *cobra.Command {
	var asJSON bool
	var gateway, admin string
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: "Show a service's replicas by version and health, its deployment and its traffic",
		Long: `Status shows the service's replicas (version, node, Nomad status and Consul
health), the deployment in progress or the last one (canaries, promotion),
the endpoint URL at the gateway, and the gateway's figures for the service:
requests per second, p50 and p99 latency, requests in flight and held.`,
		Example: `  gpujob service status bert-clf
  gpujob service status bert-clf -json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			gw := gatewayclient.Addr(gateway)
			st, err := status(ctx, f, args[0], gw, gatewayclient.AdminAddr(admin, gw))
			if err != nil {
				return err
			}
			if asJSON {
				return gpujobs.PrintJSON(f.IO.Out, st)
			}
			return printStatus(f.IO.Out, st)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	addGatewayFlag(cmd, &gateway)
	cmd.Flags().StringVar(&admin, "gateway-admin", "",
		"the gateway's admin `URL`, for the traffic figures (default $"+gatewayclient.EnvGatewayAdmin+", else the --gateway host on the port after its own)")
	return cmd
}

// Status is `service status`'s view, also its -json.
type Status struct {
	Service    string          `json:"service"`
	Namespace  string          `json:"namespace"`
	JobStatus  string          `json:"job_status"`
	Version    string          `json:"version"` // the current job version's
	JobVersion uint64          `json:"job_version"`
	Desired    int             `json:"desired"`
	Min        int             `json:"min"`
	Max        int             `json:"max"`
	Healthy    int             `json:"healthy"`
	Versions   []VersionCount  `json:"versions"`
	Replicas   []Replica       `json:"replicas"`
	Deployment *DeploymentView `json:"deployment,omitempty"`
	Endpoint   string          `json:"endpoint"`
	Traffic    *Traffic        `json:"traffic,omitempty"`
	// TrafficError says why there are no traffic figures.
	TrafficError string `json:"traffic_error,omitempty"`
}

// VersionCount is how many replicas run a version, and how many of them
// pass their check.
type VersionCount struct {
	Version string `json:"version"`
	Running int    `json:"running"`
	Healthy int    `json:"healthy"`
}

// Replica is one allocation of the service.
type Replica struct {
	Alloc      string `json:"alloc_id"`
	Name       string `json:"name"`
	Node       string `json:"node"`
	Version    string `json:"version"`
	JobVersion uint64 `json:"job_version"`
	Status     string `json:"status"`
	Health     string `json:"health"` // Consul's: passing, warning, critical, or "" when not registered
	Canary     bool   `json:"canary"`
	Address    string `json:"address,omitempty"`
}

// DeploymentView is the latest deployment.
type DeploymentView struct {
	ID          string `json:"id"`
	JobVersion  uint64 `json:"job_version"`
	Status      string `json:"status"`
	Description string `json:"description"`
	Canaries    int    `json:"canaries"`
	Placed      int    `json:"canaries_placed"`
	Promoted    bool   `json:"promoted"`
	Healthy     int    `json:"healthy"`
	Desired     int    `json:"desired"`
	Line        string `json:"summary"`
}

// Traffic is the gateway's figures for the service (its /-/stats).
type Traffic = servekv.Stats

func status(ctx context.Context, f *factory.Factory, name, gateway, admin string) (*Status, error) {
	nomad, err := f.Nomad()
	if err != nil {
		return nil, err
	}
	job, err := loadService(nomad, name)
	if err != nil {
		return nil, err
	}
	ns := firstOf(deref(job.Namespace), f.Namespace())
	st := &Status{Service: name, Namespace: ns, JobStatus: deref(job.Status), Version: job.Meta[contract.MetaVersion],
		JobVersion: deref(job.Version), Endpoint: gateway}
	g := servicedeploy.Group(job)
	if g != nil {
		st.Desired = deref(g.Count)
		if p := g.Scaling; p != nil {
			st.Min, st.Max = int(deref(p.Min)), int(deref(p.Max))
		}
	}
	store, err := servestore.Open(f)
	if err != nil {
		return nil, err
	}
	if r, err := store.Route(ctx, ns, name); err == nil && r != nil {
		st.Endpoint = gateway + r.PathPrefix
	}
	// Versions label the replicas: each allocation runs one job version.
	labels := map[uint64]string{}
	if vs, err := nomad.JobVersions(name); err == nil {
		for _, v := range vs {
			labels[deref(v.Version)] = v.Meta[contract.MetaVersion]
		}
	}
	stubs, _, err := nomad.JobAllocations(name, nil)
	if err != nil {
		return nil, err
	}
	health, err := consulHealth(ctx, store.Consul, name, render.ServiceTag(ns))
	if err != nil {
		return nil, err
	}
	byVersion := map[string]*VersionCount{}
	for _, a := range stubs {
		if a.ClientStatus != api.AllocClientStatusRunning && a.ClientStatus != api.AllocClientStatusPending {
			continue
		}
		r := Replica{Alloc: a.ID, Name: a.Name, Node: a.NodeName, JobVersion: a.JobVersion, Status: a.ClientStatus,
			Version: labels[a.JobVersion]}
		if h, ok := health[a.ID]; ok {
			r.Health, r.Address, r.Canary = h.status, h.addr, h.canary
		}
		if a.DeploymentStatus != nil && a.DeploymentStatus.Canary {
			r.Canary = true
		}
		st.Replicas = append(st.Replicas, r)
		vc := byVersion[r.Version]
		if vc == nil {
			vc = &VersionCount{Version: r.Version}
			byVersion[r.Version] = vc
		}
		if r.Status == api.AllocClientStatusRunning {
			vc.Running++
		}
		if r.Health == consul.HealthPassing {
			vc.Healthy++
			st.Healthy++
		}
	}
	sort.Slice(st.Replicas, func(i, j int) bool { return st.Replicas[i].Name < st.Replicas[j].Name })
	for _, vc := range byVersion {
		st.Versions = append(st.Versions, *vc)
	}
	sort.Slice(st.Versions, func(i, j int) bool { return st.Versions[i].Version < st.Versions[j].Version })

	if d, _, err := nomad.LatestDeployment(name, nil); err == nil && d != nil {
		v := &DeploymentView{ID: d.ID, JobVersion: d.JobVersion, Status: d.Status, Description: d.StatusDescription,
			Line: servicedeploy.DeploymentLine(d)}
		if tg := d.TaskGroups[render.ServiceGroup]; tg != nil {
			v.Canaries, v.Placed, v.Promoted = tg.DesiredCanaries, len(tg.PlacedCanaries), tg.Promoted
			v.Healthy, v.Desired = tg.HealthyAllocs, tg.DesiredTotal
		}
		st.Deployment = v
	}
	st.Traffic, err = gatewayStats(ctx, admin, ns, name)
	if err != nil {
		st.TrafficError = err.Error()
	}
	return st, nil
}

type replicaHealth struct {
	status, addr string
	canary       bool
}

// consulHealth is each allocation's registration of the service: Nomad
// names it "_nomad-task-<alloc ID>-<task>-<service>-<port>".
func consulHealth(ctx context.Context, c *consul.Client, service, tag string) (map[string]replicaHealth, error) {
	entries, _, err := c.Health().Service(service, tag, false, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("reading the health of %s from Consul: %w", service, err)
	}
	out := map[string]replicaHealth{}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Service.ID, "_nomad-task-")
		if !ok || len(rest) < 36 {
			continue
		}
		addr := firstOf(e.Service.Address, e.Node.Address)
		h := replicaHealth{status: e.Checks.AggregatedStatus(), addr: addr + ":" + strconv.Itoa(e.Service.Port)}
		for _, t := range e.Service.Tags {
			if t == render.TagCanary {
				h.canary = true
			}
		}
		out[rest[:36]] = h
	}
	return out, nil
}

// gatewayStats asks the gateway's admin listener for the service's
// figures.
func gatewayStats(ctx context.Context, admin, ns, name string) (*Traffic, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	all, err := gatewayclient.StatsAt(ctx, admin)
	if err != nil {
		return nil, err
	}
	s, ok := all.Services[servekv.LoadName(ns, name)]
	if !ok {
		return &Traffic{}, nil
	}
	return &s, nil
}

func printStatus(w io.Writer, st *Status) error {
	fmt.Fprintf(w, "service    %s (namespace %s)\n", st.Service, st.Namespace)
	fmt.Fprintf(w, "version    %s (job version %d), job %s\n", st.Version, st.JobVersion, st.JobStatus)
	fmt.Fprintf(w, "replicas   %d healthy of %d desired (bounds %d-%d)\n", st.Healthy, st.Desired, st.Min, st.Max)
	for _, v := range st.Versions {
		fmt.Fprintf(w, "           %s: %d running, %d healthy\n", firstOf(v.Version, "?"), v.Running, v.Healthy)
	}
	if d := st.Deployment; d != nil {
		fmt.Fprintf(w, "deployment %s\n", strings.TrimPrefix(d.Line, "deployment "))
	}
	fmt.Fprintf(w, "endpoint   %s\n", st.Endpoint)
	if t := st.Traffic; t != nil {
		fmt.Fprintf(w, "traffic    %.1f req/s, p50 %.1f ms, p99 %.1f ms, %d in flight, %d held (last %s)\n",
			t.RPS, t.P50Ms, t.P99Ms, t.Inflight, t.Queued, firstOf(t.Window, "minute"))
	} else if st.TrafficError != "" {
		fmt.Fprintf(w, "traffic    unknown: %s\n", st.TrafficError)
	}
	if len(st.Replicas) == 0 {
		fmt.Fprintln(w, "\nno replica runs")
		return nil
	}
	fmt.Fprintln(w)
	t := gpujobs.NewTable(w, "ALLOC", "NAME", "VERSION", "STATUS", "HEALTH", "CANARY", "NODE", "ADDRESS")
	for _, r := range st.Replicas {
		canary := ""
		if r.Canary {
			canary = "yes"
		}
		t.Row(gpujobs.ShortID(r.Alloc), r.Name, r.Version, r.Status, r.Health, canary, r.Node, r.Address)
	}
	return t.Flush()
}
