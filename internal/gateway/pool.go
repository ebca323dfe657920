package gateway

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/consul"
)

// The tags Nomad registers gpujob replicas with (servekv's design).
const (
	versionTagPrefix = "gpujob-version="
	canaryTag        = "gpujob-canary"
)

// endpoint is one healthy replica. Its fields never change: a replica whose
// address or tags change is a new endpoint sharing the old one's load.
type endpoint struct {
	id      string // Consul's Service.ID
	addr    string // host:port
	version string // its gpujob-version tag, "" if none
	canary  bool   // a canary of an unpromoted deployment
	load    *endpointLoad
}

// endpointLoad is the part of an endpoint that lives across the pool's
// updates, keyed by Service.ID: what the balancer and the ejection read.
type endpointLoad struct {
	inflight     atomic.Int64
	ejectedUntil atomic.Int64 // unix nanoseconds; 0 = never ejected
}

func (e *endpoint) ejected(now time.Time) bool {
	return e.load.ejectedUntil.Load() > now.UnixNano()
}

func (e *endpoint) eject(until time.Time) { e.load.ejectedUntil.Store(until.UnixNano()) }

// poolState is one immutable view of a pool. Whoever waits for a change
// waits on changed, which is closed when the state is replaced.
type poolState struct {
	eps     []*endpoint // sorted by id
	loaded  bool        // the first health query has answered
	stopped bool        // the pool's route went away or changed service
	changed chan struct{}
}

// pool keeps the replicas of one route: the healthy instances of its
// Consul service and tag (a blocking health query) that Nomad vouches for
// as allocations of its job (a blocking query on the job's allocations,
// admit.go). It is loaded once both have answered.
type pool struct {
	g             *Gateway
	svc           *service
	consulService string
	tag           string
	jobID         string

	state atomic.Pointer[poolState]
	mu    sync.Mutex // serializes replacements of state

	// inputs guards what the two watches last read, and the refusals
	// already logged.
	inputs   sync.Mutex
	entries  []*consulapi.ServiceEntry
	healthOK bool // the health query has answered
	replicas replicaSet
	refused  map[string]string // instance "id@addr" -> the reason logged
	// refusedBy is the healthy instances left out by refusal reason, for
	// the metrics: replaced whole on each update, never changed in place.
	refusedBy atomic.Pointer[map[string]int]

	cancel context.CancelFunc
	done   chan struct{}
}

func newPool(g *Gateway, s *service, consulService, tag, jobID string) *pool {
	p := &pool{g: g, svc: s, consulService: consulService, tag: tag, jobID: jobID, refused: map[string]string{}}
	p.state.Store(&poolState{changed: make(chan struct{})})
	return p
}

// start runs the pool's watch until ctx ends or stop.
func (p *pool) start(ctx context.Context) {
	ctx, p.cancel = context.WithCancel(ctx)
	p.done = make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		p.watch(ctx)
	}()
	go func() {
		defer wg.Done()
		p.watchReplicas(ctx)
	}()
	go func() {
		wg.Wait()
		close(p.done)
	}()
}

// stop ends the watch, waits for it, and empties the pool for good, which
// wakes the requests held on it.
func (p *pool) stop() {
	if p.cancel != nil {
		p.cancel()
		<-p.done
	}
	p.setState(nil, true, true)
}

// snapshot is the pool's current state.
func (p *pool) snapshot() *poolState { return p.state.Load() }

// setState replaces the state and wakes its waiters; a stopped pool stays
// stopped.
func (p *pool) setState(eps []*endpoint, loaded, stopped bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.state.Load()
	if old.stopped {
		return
	}
	p.state.Store(&poolState{eps: eps, loaded: loaded, stopped: stopped, changed: make(chan struct{})})
	close(old.changed)
}

// watch follows Health().Service(consulService, tag, passing only) with
// blocking queries: Consul answers as soon as a check changes or a replica
// is deregistered, so the pool follows it within a round trip. On errors the
// last good endpoints stay (an outage of Consul must not empty the pool).
func (p *pool) watch(ctx context.Context) {
	what := fmt.Sprintf("gateway: watching the replicas of %s (consul service %q tag %q)", p.svc.key, p.consulService, p.tag)
	_ = consul.Watch(ctx, consul.ServiceQuery(p.g.cfg.Consul, p.consulService, p.tag, true), watchOptions(p.g.logf, what),
		func(entries []*consulapi.ServiceEntry, _ uint64) error {
			p.setEntries(entries)
			return nil
		})
}

// setEntries takes a new answer of the health query.
func (p *pool) setEntries(entries []*consulapi.ServiceEntry) {
	p.inputs.Lock()
	defer p.inputs.Unlock()
	p.entries, p.healthOK = entries, true
	p.update()
}

// setReplicas takes a new answer from Nomad.
func (p *pool) setReplicas(s replicaSet) {
	p.inputs.Lock()
	defer p.inputs.Unlock()
	p.replicas = s
	p.update()
}

// update makes the healthy instances that Nomad vouches for the pool's
// endpoints, keeping the load of those already known (by Service.ID), and
// logs and counts a change; it logs each instance it leaves out once. The
// caller holds inputs. Until both watches have answered the pool stays
// unloaded: requests wait for it without counting as held.
func (p *pool) update() {
	if !p.healthOK || !p.replicas.loaded {
		return
	}
	cur := p.snapshot()
	known := make(map[string]*endpoint, len(cur.eps))
	for _, e := range cur.eps {
		known[e.id] = e
	}
	eps := make([]*endpoint, 0, len(p.entries))
	seen := make(map[string]bool, len(p.entries))
	refused := map[string]string{}
	refusedBy := map[string]int{}
	for _, en := range p.entries {
		ep := endpointOf(en)
		if ep == nil || seen[ep.id] {
			continue
		}
		if ok, reason, why := p.replicas.admits(ep.id, ep.addr); !ok {
			key := ep.id + "@" + ep.addr
			if _, counted := refused[key]; !counted {
				refusedBy[reason]++
			}
			refused[key] = why
			if p.refused[key] != why {
				p.g.logf("gateway: pool %s: refusing consul instance %s at %s: %s", p.svc.key, ep.id, ep.addr, why)
			}
			continue
		}
		seen[ep.id] = true
		if old := known[ep.id]; old != nil {
			if old.addr == ep.addr && old.version == ep.version && old.canary == ep.canary {
				ep = old
			} else {
				ep.load = old.load
			}
		}
		eps = append(eps, ep)
	}
	p.refused = refused
	p.refusedBy.Store(&refusedBy)
	sort.Slice(eps, func(i, j int) bool { return eps[i].id < eps[j].id })
	if cur.loaded && sameEndpoints(cur.eps, eps) {
		return
	}
	p.setState(eps, true, false)
	p.g.metrics.poolUpdated(p.svc)
	p.g.logf("gateway: pool %s: %d healthy endpoint(s)%s", p.svc.key, len(eps), describeVersions(eps))
}

// refusals is the healthy instances the pool leaves out now, by refusal
// reason (nil before its first update).
func (p *pool) refusals() map[string]int {
	if m := p.refusedBy.Load(); m != nil {
		return *m
	}
	return nil
}

// endpointOf is a health entry's endpoint, nil when it has no address.
func endpointOf(en *consulapi.ServiceEntry) *endpoint {
	if en == nil || en.Service == nil || en.Service.Port <= 0 {
		return nil
	}
	host := en.Service.Address
	if host == "" && en.Node != nil {
		host = en.Node.Address
	}
	if host == "" {
		return nil
	}
	ep := &endpoint{id: en.Service.ID, addr: net.JoinHostPort(host, strconv.Itoa(en.Service.Port)), load: &endpointLoad{}}
	for _, t := range en.Service.Tags {
		if v, ok := strings.CutPrefix(t, versionTagPrefix); ok {
			ep.version = v
		} else if t == canaryTag {
			ep.canary = true
		}
	}
	return ep
}

func sameEndpoints(a, b []*endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// describeVersions is a log line's " (v1: 2, v2: 1 canary)".
func describeVersions(eps []*endpoint) string {
	if len(eps) == 0 {
		return ""
	}
	type count struct{ n, canary int }
	byVersion := map[string]*count{}
	var order []string
	for _, e := range eps {
		c := byVersion[e.version]
		if c == nil {
			c = &count{}
			byVersion[e.version] = c
			order = append(order, e.version)
		}
		c.n++
		if e.canary {
			c.canary++
		}
	}
	sort.Strings(order)
	parts := make([]string, 0, len(order))
	for _, v := range order {
		c := byVersion[v]
		name := v
		if name == "" {
			name = "unversioned"
		}
		s := name + ": " + strconv.Itoa(c.n)
		if c.canary > 0 {
			s += " (" + strconv.Itoa(c.canary) + " canary)"
		}
		parts = append(parts, s)
	}
	return " (" + strings.Join(parts, ", ") + ")"
}
