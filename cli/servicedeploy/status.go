package servicedeploy

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gatewayclient"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/queues"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/servekv"
)

// Status is a service's replicas, deployment and traffic (`gpujob service
// status`, also its -json).
type Status struct {
	Service   string `json:"service"`
	Namespace string `json:"namespace"`
	// Queue is the service's place in its queue when it went through one
	// (queue mode); a service still waiting there has no Nomad job yet,
	// and its JobStatus is "queued" (or "refused").
	Queue *queues.Info `json:"queue,omitempty"`
	// QueueLine is Queue in a sentence, for people.
	QueueLine  string          `json:"-"`
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

// StatusRequest names the service whose status to read.
type StatusRequest struct {
	Name string
	// Namespace is the CLI's, for a job that names none.
	Namespace string
	// Gateway is the gateway's URL (the endpoint's base); Admin its admin
	// listener's, for the traffic figures.
	Gateway, Admin string
}

// ReadStatus gathers a service's status: its job from Nomad, its route
// from the store, each replica's health from Consul's catalog, its latest
// deployment, and the gateway's traffic figures. Traffic is optional: a
// gateway that does not answer leaves TrafficError, not an error.
func ReadStatus(ctx context.Context, nomad nomadapi.API, store servestore.Store, req StatusRequest) (*Status, error) {
	name := req.Name
	job, err := Load(nomad, name)
	if err != nil {
		return nil, err
	}
	ns := firstOf(deref(job.Namespace), req.Namespace)
	st := &Status{Service: name, Namespace: ns, JobStatus: deref(job.Status), Version: job.Meta[contract.MetaVersion],
		JobVersion: deref(job.Version), Endpoint: req.Gateway}
	if g := Group(job); g != nil {
		st.Desired = deref(g.Count)
		if p := g.Scaling; p != nil {
			st.Min, st.Max = int(deref(p.Min)), int(deref(p.Max))
		}
	}
	if r, err := store.Route(ctx, ns, name); err == nil && r != nil {
		st.Endpoint = req.Gateway + r.PathPrefix
	}
	labels := VersionLabels(nomad, name)
	stubs, _, err := nomad.JobAllocations(name, nil)
	if err != nil {
		return nil, err
	}
	health, err := consulHealth(ctx, store.Consul, name, render.ServiceTag(ns))
	if err != nil {
		return nil, err
	}
	tally(st, stubs, labels, health)
	if d, _, err := nomad.LatestDeployment(name, nil); err == nil && d != nil {
		st.Deployment = deploymentView(d)
	}
	st.Traffic, err = gatewayStats(ctx, req.Admin, ns, name)
	if err != nil {
		st.TrafficError = err.Error()
	}
	return st, nil
}

// VersionLabels maps each job version of service name to the service
// version it runs (its meta): each allocation runs one job version, and
// people know the service's versions, not Nomad's. Empty when the
// versions cannot be read: the labels only decorate.
func VersionLabels(nomad nomadapi.API, name string) map[uint64]string {
	labels := map[uint64]string{}
	if vs, err := nomad.JobVersions(name); err == nil {
		for _, v := range vs {
			labels[deref(v.Version)] = v.Meta[contract.MetaVersion]
		}
	}
	return labels
}

// tally adds the live replicas (running or pending) to st, with their
// health, and counts them by version.
func tally(st *Status, stubs []*api.AllocationListStub, labels map[uint64]string, health map[string]replicaHealth) {
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
}

func deploymentView(d *api.Deployment) *DeploymentView {
	v := &DeploymentView{ID: d.ID, JobVersion: d.JobVersion, Status: d.Status, Description: d.StatusDescription,
		Line: DeploymentLine(d)}
	if tg := d.TaskGroups[render.ServiceGroup]; tg != nil {
		v.Canaries, v.Placed, v.Promoted = tg.DesiredCanaries, len(tg.PlacedCanaries), tg.Promoted
		v.Healthy, v.Desired = tg.HealthyAllocs, tg.DesiredTotal
	}
	return v
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
	return healthByAlloc(entries), nil
}

// healthByAlloc keys Consul's entries of a service by the allocation ID
// in their service ID.
func healthByAlloc(entries []*consul.ServiceEntry) map[string]replicaHealth {
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
	return out
}

// gatewayStats asks the gateway's admin listener for the service's
// figures; a gateway that has none for it gives zeros.
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

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}
