package gateway

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/backoff"
	"github.com/gpujob/gpujob/internal/consul"
	"github.com/gpujob/gpujob/internal/errlog"
	"github.com/gpujob/gpujob/internal/servekv"
)

// Replica admission. A route names a Consul service and tag, and Consul lets
// anyone who may register a service (on a cluster without ACLs, any job;
// with them, any token with service:write on the name) add an instance
// under that name and tag: a hostile job would get a share of another
// tenant's requests, bearer tokens included. So the gateway sends a route's
// requests only to the Consul instances that Nomad vouches for: an instance
// is admitted when its service ID names an allocation
// ("_nomad-task-<alloc ID>-<task>-<service>-<port>") that is a running
// allocation of the route's job, in the route's namespace and group, and
// when its address is one Nomad gave that allocation's ports. The job must
// claim the route in its own meta (servekv.JobRoute), since the route's
// job ID is a KV value that any user of the namespace may write. Nomad is
// followed with a blocking query on the job's allocations, never per
// request.

// Nomad is what the gateway reads of Nomad to admit replicas.
type Nomad interface {
	// JobAllocations lists the allocations of job jobID in namespace ns.
	// With waitIndex above 0 it is a blocking query: Nomad answers once
	// its index passes waitIndex, or after wait. It returns Nomad's index.
	JobAllocations(ctx context.Context, ns, jobID string, waitIndex uint64, wait time.Duration) ([]*nomadapi.AllocationListStub, uint64, error)
	// Allocation reads an allocation whole (its ports); nil, nil when
	// there is none.
	Allocation(ctx context.Context, ns, allocID string) (*nomadapi.Allocation, error)
	// Job reads a job; nil, nil when there is none.
	Job(ctx context.Context, ns, jobID string) (*nomadapi.Job, error)
}

// nomadServicePrefix starts the ID of every service Nomad registers in
// Consul for a task: "_nomad-task-<alloc ID>-<task>-<service>-<port>".
const nomadServicePrefix = "_nomad-task-"

// allocOfServiceID is the allocation ID a Nomad service ID names.
func allocOfServiceID(id string) (string, bool) {
	rest, ok := strings.CutPrefix(id, nomadServicePrefix)
	if !ok || len(rest) < 37 || rest[36] != '-' || !isUUID(rest[:36]) {
		return "", false
	}
	return rest[:36], true
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
	}
	return true
}

// replicaSet is what Nomad says may serve a route: the host addresses of
// the running allocations of its job, by allocation ID.
type replicaSet struct {
	loaded bool
	// refusal says why no instance is admitted (the route's job does not
	// claim it, or there is no such job); "" when the job is the route's.
	refusal string
	addrs   map[string]map[string]bool
}

// The reasons an instance is refused, the label of
// gpujob_gateway_refused_instances. They are few and fixed, unlike the
// logged explanation, so an operator can tell an attack signal (address:
// a replica's service ID forged at another address) from a registration
// outside Nomad or a job squatting on another's name.
const (
	// refusedRoute: the route admits nothing (it names no job, Nomad has
	// no such job, or the job does not claim the route).
	refusedRoute = "route"
	// refusedNotNomad: the service ID names no Nomad allocation (an
	// instance registered straight into Consul).
	refusedNotNomad = "not_nomad"
	// refusedAllocation: the ID names an allocation that is not a running
	// allocation of the route's job (another job's, or a stopped one).
	refusedAllocation = "allocation"
	// refusedAddress: the ID names a replica's allocation, but at an
	// address Nomad did not give it.
	refusedAddress = "address"
)

// refusalReasons are the reasons in the order the metrics list them.
var refusalReasons = []string{refusedRoute, refusedNotNomad, refusedAllocation, refusedAddress}

// admits reports whether the Consul instance id at addr is a replica; if
// not, which of the refusal reasons applies and, for the log, why.
func (s *replicaSet) admits(id, addr string) (ok bool, reason, why string) {
	if s.refusal != "" {
		return false, refusedRoute, s.refusal
	}
	alloc, ok := allocOfServiceID(id)
	if !ok {
		return false, refusedNotNomad, "its ID names no Nomad allocation"
	}
	a, ok := s.addrs[alloc]
	if !ok {
		return false, refusedAllocation, "allocation " + alloc + " is not a running allocation of the route's job"
	}
	if !a[normalizeAddr(addr)] {
		return false, refusedAddress, fmt.Sprintf("Nomad gave allocation %s no port at %s", alloc, addr)
	}
	return true, "", ""
}

// normalizeAddr writes host:port with the IP in its canonical form, so
// that Consul's and Nomad's spellings of one address compare equal.
func normalizeAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil {
		host = ip.String()
	}
	return net.JoinHostPort(host, port)
}

// allocAddrs are the host addresses of an allocation's ports: its group
// network's port mappings, and the older network blocks of the group and of
// its tasks.
func allocAddrs(a *nomadapi.Allocation) map[string]bool {
	out := map[string]bool{}
	res := a.AllocatedResources
	if res == nil {
		return out
	}
	add := func(ip string, port int) {
		if ip != "" && port > 0 {
			out[normalizeAddr(net.JoinHostPort(ip, strconv.Itoa(port)))] = true
		}
	}
	for _, p := range res.Shared.Ports {
		add(p.HostIP, p.Value)
	}
	nets := append([]*nomadapi.NetworkResource(nil), res.Shared.Networks...)
	for _, t := range res.Tasks {
		if t != nil {
			nets = append(nets, t.Networks...)
		}
	}
	for _, n := range nets {
		if n == nil {
			continue
		}
		for _, p := range append(append([]nomadapi.Port(nil), n.ReservedPorts...), n.DynamicPorts...) {
			add(n.IP, p.Value)
		}
	}
	return out
}

// jobRecheck is how often the route's job is read again although none of
// its allocations changed (a job updated in place, say).
const jobRecheck = 30 * time.Second

// watchReplicas follows, with blocking queries on its allocations, which
// replicas Nomad vouches for as the route's, until ctx ends. On errors the
// last good set stays (an outage of Nomad must not empty the pool).
func (p *pool) watchReplicas(ctx context.Context) {
	nomad := p.g.cfg.Nomad
	ns, jobID := p.svc.ns, p.jobID
	bo := backoff.New(250*time.Millisecond, 30*time.Second)
	errs := errlog.NewNoted(p.g.logf, fmt.Sprintf("gateway: asking Nomad which replicas of %s (job %s) may serve", p.svc.key, jobID), " (keeping the last good ones)")
	if jobID == "" {
		p.setReplicas(replicaSet{loaded: true, refusal: "the route names no Nomad job"})
		<-ctx.Done()
		return
	}
	var (
		index     uint64
		lastPrint string
		checkedAt time.Time
		cache     = map[string]map[string]bool{} // addresses of running allocations, by ID
		lastSet   replicaSet
	)
	fail := func(err error) {
		errs.Failed(err)
		bo.Wait(ctx)
	}
	for ctx.Err() == nil {
		allocs, got, err := nomad.JobAllocations(ctx, ns, jobID, index, watchWait)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			fail(err)
			continue
		}
		// Nomad's index is its whole allocation table's: it moves with
		// other jobs too. What changed for this job is in the list.
		print := allocsPrint(allocs)
		if lastSet.loaded && print == lastPrint && time.Since(checkedAt) < jobRecheck {
			index = consul.NextIndex(index, got)
			continue
		}
		set, err := p.readReplicas(ctx, ns, jobID, allocs, cache)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			fail(err) // the index stays: the next query answers at once
			continue
		}
		bo.Reset()
		errs.OK()
		index = consul.NextIndex(index, got)
		lastPrint, checkedAt = print, time.Now()
		if set.refusal != lastSet.refusal && set.refusal != "" {
			p.g.logf("gateway: route %s: admitting no replica: %s", p.svc.key, set.refusal)
		}
		lastSet = set
		p.setReplicas(set)
	}
}

// readReplicas reads the route's job and the addresses of its running
// allocations (from cache when known: an allocation's ports never change).
func (p *pool) readReplicas(ctx context.Context, ns, jobID string, allocs []*nomadapi.AllocationListStub, cache map[string]map[string]bool) (replicaSet, error) {
	nomad := p.g.cfg.Nomad
	job, err := nomad.Job(ctx, ns, jobID)
	if err != nil {
		return replicaSet{}, fmt.Errorf("reading job %s: %w", jobID, err)
	}
	if job == nil {
		return replicaSet{loaded: true, refusal: fmt.Sprintf("Nomad has no job %s in namespace %s", jobID, ns)}, nil
	}
	jobNS := ""
	if job.Namespace != nil {
		jobNS = *job.Namespace
	}
	claimed, err := servekv.JobRoute(p.svc.ns, p.svc.name, jobNS, jobID, job.Meta)
	if err != nil {
		return replicaSet{loaded: true, refusal: err.Error()}, nil
	}
	set := replicaSet{loaded: true, addrs: map[string]map[string]bool{}}
	for _, a := range allocs {
		if a.ClientStatus != nomadapi.AllocClientStatusRunning || a.DesiredStatus != nomadapi.AllocDesiredStatusRun ||
			a.JobID != jobID || (a.Namespace != "" && a.Namespace != ns) ||
			(claimed.Group != "" && a.TaskGroup != claimed.Group) {
			continue
		}
		addrs, ok := cache[a.ID]
		if !ok {
			full, err := nomad.Allocation(ctx, ns, a.ID)
			if err != nil {
				return replicaSet{}, fmt.Errorf("reading allocation %s: %w", a.ID, err)
			}
			if full == nil || full.JobID != jobID || (full.Namespace != "" && full.Namespace != ns) {
				continue
			}
			addrs = allocAddrs(full)
			cache[a.ID] = addrs
		}
		set.addrs[a.ID] = addrs
	}
	for id := range cache {
		if _, ok := set.addrs[id]; !ok {
			delete(cache, id)
		}
	}
	return set, nil
}

// allocsPrint is what of a job's allocations bears on admission.
func allocsPrint(allocs []*nomadapi.AllocationListStub) string {
	parts := make([]string, 0, len(allocs))
	for _, a := range allocs {
		parts = append(parts, a.ID+"/"+a.ClientStatus+"/"+a.DesiredStatus+"/"+strconv.FormatUint(a.ModifyIndex, 10))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}
