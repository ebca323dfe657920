// Package autoscale is the gateways' autoscaler and their load reports.
//
// Every gateway publishes its in-flight and queued requests per service to
// Consul (Reporter), under a session of its own so that a dead gateway's
// report disappears. Every gateway also runs an Autoscaler, but only the one
// holding the Consul lock servekv.LeaderKey acts: it watches the services'
// routes and all the load reports with blocking queries, and on every
// change and every Tick decides (Decide) each autoscaled service's replica
// count and sets it through Nomad (Scaler).
package autoscale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/gpujob/gpujob/internal/errlog"
	"log"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpujob/gpujob/internal/backoff"
	"github.com/gpujob/gpujob/internal/consul"
	"github.com/gpujob/gpujob/internal/servekv"
	consulapi "github.com/hashicorp/consul/api"
)

// Scaler is what the autoscaler needs of Nomad.
type Scaler interface {
	// Group reads the job jobID in namespace: its task group's current
	// count (Nomad's job spec, not running allocations), and the job's own
	// namespace and meta, by which it claims (or does not) the route that
	// names it.
	Group(ctx context.Context, namespace, jobID, group string) (Group, error)
	// Scale sets the group's count (Nomad's /v1/job/<id>/scale) with a
	// message saying why.
	Scale(ctx context.Context, namespace, jobID, group string, count int, reason string) error
}

// Group is what the autoscaler reads of a route's job before it scales it.
type Group struct {
	Count int
	// JobNamespace and Meta are the job's: it is scaled only when its meta
	// claims the route as its own (servekv.JobRoute), since a route is a
	// Consul key any user of the namespace may write, and could name any
	// job of it.
	JobNamespace string
	Meta         map[string]string
}

// Config configures an Autoscaler.
type Config struct {
	Consul *consulapi.Client
	// Prefix is the services' tree (servekv.DefaultPrefix if empty) and
	// GatewayPrefix the gateways' (servekv.DefaultGatewayPrefix).
	Prefix, GatewayPrefix string
	// ID is this gateway's, stored as the lock's value.
	ID     string
	Scaler Scaler
	// Logf receives scaling decisions, leadership changes and errors
	// (throttled); log.Printf if nil.
	Logf func(format string, args ...any)
	// Now is the clock of decisions and report ages; time.Now if nil.
	Now func() time.Time
	// Tick is how often the leader decides again without a change in the
	// load (for the delays to run out); decisions also run on every
	// change. Default DefaultTick.
	Tick time.Duration
}

// DefaultTick is Config.Tick's default.
const DefaultTick = time.Second

// LockSessionName names the leader's Consul session.
const LockSessionName = "gpujob-gateway-autoscaler"

const (
	// leaderLockDelay is how long Consul keeps the lock from everyone
	// after the leader's session is invalidated (a crash, a node failure;
	// a clean step-down releases it with no delay). None: any delay holds
	// up scale-from-zero after a leader's crash (and makes the gateways of
	// the previous release, on consulapi.Lock, retry only after its fixed
	// 5 s, DefaultLockRetryTime), and what the delay
	// guards against is cheap here: a leader cut off from Consul cannot
	// read fresh loads, and every Scale is preceded by a read of Nomad's
	// count, so an overlap costs at most a redundant Scale.
	leaderLockDelay = 0
	// callTimeout bounds one Count or Scale.
	callTimeout = 30 * time.Second
)

// Autoscaler campaigns for the autoscaling lock and, while it holds it,
// scales the services.
type Autoscaler struct {
	cfg    Config
	leader atomic.Bool
}

// New checks cfg and fills in its defaults.
func New(cfg Config) (*Autoscaler, error) {
	switch {
	case cfg.Consul == nil:
		return nil, errors.New("autoscaler: no Consul client")
	case cfg.Scaler == nil:
		return nil, errors.New("autoscaler: no Scaler")
	case cfg.ID == "":
		return nil, errors.New("autoscaler: no gateway ID")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = servekv.DefaultPrefix
	}
	if cfg.GatewayPrefix == "" {
		cfg.GatewayPrefix = servekv.DefaultGatewayPrefix
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Tick <= 0 {
		cfg.Tick = DefaultTick
	}
	return &Autoscaler{cfg: cfg}, nil
}

// IsLeader reports whether this gateway holds the lock and acts.
func (a *Autoscaler) IsLeader() bool { return a.leader.Load() }

// Run campaigns for the lock, scales while it holds it and campaigns again
// when it loses it, until ctx ends. Then it releases the lock, destroys its
// session and returns nil.
func (a *Autoscaler) Run(ctx context.Context) error {
	bo := backoff.New(backoffBase, backoffCap)
	for ctx.Err() == nil {
		a.term(ctx, bo)
	}
	return nil
}

// term campaigns and leads under one session, until ctx ends or the
// session is lost.
func (a *Autoscaler) term(ctx context.Context, bo *backoff.Backoff) {
	logf := a.cfg.Logf
	s, err := newSession(ctx, a.cfg.Consul, LockSessionName, consulapi.SessionBehaviorRelease, leaderLockDelay, logf)
	if err != nil {
		return // ctx ended
	}
	defer closeSession(s, logf)
	key := servekv.LeaderKey(a.cfg.GatewayPrefix)
	// The key keeps the format consulapi.Lock gave it (the value is the
	// gateway ID, the flags LockFlagValue), so that gateways of the
	// previous release, which still take it with consulapi.Lock, and
	// this one exclude each other during a rolling upgrade.
	e := consul.NewElection(s, key, consul.MutexOptions{Flags: consulapi.LockFlagValue, LockDelay: leaderLockDelay, Logf: logf})
	errs := errlog.New(logf, "autoscaler "+a.cfg.ID+": campaigning for "+key)
	for ctx.Err() == nil && s.Err() == nil {
		if err := e.Campaign(ctx, []byte(a.cfg.ID)); err != nil {
			if ctx.Err() != nil || s.Err() != nil {
				break
			}
			errs.Failed(err)
			// Perhaps the session is gone (Consul refuses to acquire
			// for it): find out now rather than at the next renewal.
			s.Check()
			bo.Wait(ctx)
			continue
		}
		errs.OK()
		started := time.Now()
		logf("autoscaler %s: leading (holding %s)", a.cfg.ID, key)
		a.lead(ctx, e.Lost())
		// Release the lock now, so that another gateway takes over at
		// once (its blocking wait wakes) rather than when the session
		// ends.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		if err := e.Resign(rctx); err != nil && !s.Lost() {
			logf("autoscaler %s: releasing %s: %v", a.cfg.ID, key, err)
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			logf("autoscaler %s: stepped down", a.cfg.ID)
			return
		case s.Lost():
			// The session ended: leave the loop below.
		default:
			logf("autoscaler %s: lost %s; campaigning again", a.cfg.ID, key)
			s.Check() // the session's end is the likeliest cause
			if time.Since(started) > time.Minute {
				bo.Reset()
			}
			bo.Wait(ctx)
			continue
		}
		break
	}
	if s.Lost() {
		logf("autoscaler %s: lost its consul session; campaigning again", a.cfg.ID)
	}
}

// route is one autoscaled service.
type route struct {
	name                             string // servekv.LoadName
	namespace, service, jobID, group string
	as                               servekv.Autoscale
}

// feed is what the leader's watches have read last.
type feed struct {
	mu       sync.Mutex
	routes   map[string]route
	routesOK bool
	loads    []servekv.Load
	loadsOK  bool // at least one list read
	loadsErr bool // the last read of the loads failed
	changed  chan struct{}
}

func (f *feed) notify() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// service is the leader's state of one service.
type service struct {
	State
	known    bool      // Current has been read from Nomad
	countAt  time.Time // when Current was read or set
	retryAt  time.Time // no Scale before this, after one failed
	countErr *errlog.Run
	scaleErr *errlog.Run
	busy     bool // the last Scale met ErrBusy (logged once)
	// refused is why the route's job is not the route's (logged once per
	// reason); "" when it is.
	refused string
}

// ErrBusy is what a Scaler returns, wrapped, when the group cannot be
// scaled now and will be later: Nomad refuses to scale a job while a
// deployment of it runs.
var ErrBusy = errors.New("the group cannot be scaled while a deployment of its job runs")

// busyRetry is how long the autoscaler waits to try again after ErrBusy.
const busyRetry = 2 * time.Second

// refusedRecheck is how often the autoscaler reads again the job of a route
// it refused (the job may be deployed as the route's service since).
const refusedRecheck = 10 * time.Second

// lead watches and decides until ctx ends or lost closes.
func (a *Autoscaler) lead(ctx context.Context, lost <-chan struct{}) {
	a.leader.Store(true)
	defer a.leader.Store(false)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f := &feed{changed: make(chan struct{}, 1)}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(3)
	go func() {
		defer wg.Done()
		select {
		case <-lost:
			cancel()
		case <-ctx.Done():
		}
	}()
	go func() {
		defer wg.Done()
		a.watchRoutes(ctx, f)
	}()
	go func() {
		defer wg.Done()
		a.watchLoads(ctx, f)
	}()

	services := map[string]*service{}
	tick := time.NewTicker(a.cfg.Tick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.changed:
		case <-tick.C:
		}
		a.decideAll(ctx, f, services)
	}
}

func (a *Autoscaler) watchRoutes(ctx context.Context, f *feed) {
	prefix := a.cfg.Prefix + "/"
	// Each bad version of a key is logged once, not on every change of
	// the tree.
	logged := map[string]uint64{}
	watchList(ctx, a.cfg.Consul, prefix, a.cfg.Logf, "autoscaler: watching the routes under "+prefix, func(pairs consulapi.KVPairs) {
		routes := a.parseRoutes(pairs, logged)
		f.mu.Lock()
		f.routes, f.routesOK = routes, true
		f.mu.Unlock()
		f.notify()
	}, nil, nil)
}

// parseRoutes picks the autoscaled services out of the services' tree.
func (a *Autoscaler) parseRoutes(pairs consulapi.KVPairs, logged map[string]uint64) map[string]route {
	routes := map[string]route{}
	seen := map[string]bool{}
	skip := func(p *consulapi.KVPair, format string, args ...any) {
		if logged[p.Key] != p.ModifyIndex {
			logged[p.Key] = p.ModifyIndex
			a.cfg.Logf("autoscaler: route %s: "+format+"; not autoscaling it", append([]any{p.Key}, args...)...)
		}
	}
	for _, p := range pairs {
		ns, svc, ok := servekv.ParseRouteKey(a.cfg.Prefix, p.Key)
		if !ok {
			continue // tokens and anything else
		}
		seen[p.Key] = true
		var r servekv.Route
		if err := json.Unmarshal(p.Value, &r); err != nil {
			skip(p, "malformed JSON: %v", err)
			continue
		}
		if r.Autoscale == nil || r.Autoscale.Max <= 0 {
			continue
		}
		switch {
		case r.Namespace != "" && r.Namespace != ns, r.Service != "" && r.Service != svc:
			skip(p, "it names %s/%s", r.Namespace, r.Service)
			continue
		case r.JobID == "" || r.Group == "":
			skip(p, "autoscale is set but the job ID or group is missing")
			continue
		}
		name := servekv.LoadName(ns, svc)
		routes[name] = route{name: name, namespace: ns, service: svc, jobID: r.JobID, group: r.Group, as: *r.Autoscale}
	}
	for k := range logged {
		if !seen[k] {
			delete(logged, k)
		}
	}
	return routes
}

func (a *Autoscaler) watchLoads(ctx context.Context, f *feed) {
	prefix := servekv.LoadPrefix(a.cfg.GatewayPrefix)
	bad := errlog.New(a.cfg.Logf, "autoscaler: reading load reports")
	setErr := func(failing bool) {
		f.mu.Lock()
		f.loadsErr = failing
		f.mu.Unlock()
	}
	watchList(ctx, a.cfg.Consul, prefix, a.cfg.Logf, "autoscaler: watching the load reports under "+prefix, func(pairs consulapi.KVPairs) {
		loads := make([]servekv.Load, 0, len(pairs))
		for _, p := range pairs {
			var l servekv.Load
			if err := json.Unmarshal(p.Value, &l); err != nil {
				bad.Failed(fmt.Errorf("%s: %w", p.Key, err))
				continue
			}
			loads = append(loads, l)
		}
		f.mu.Lock()
		f.loads, f.loadsOK, f.loadsErr = loads, true, false
		f.mu.Unlock()
		f.notify()
	}, func(error) { setErr(true) }, func() { setErr(false) })
}

// decideAll decides every autoscaled service once.
func (a *Autoscaler) decideAll(ctx context.Context, f *feed, services map[string]*service) {
	f.mu.Lock()
	routes, loads := f.routes, f.loads
	// Without both lists, or while the loads cannot be read, the load is
	// unknown: an empty or ageing view would read as no load and scale
	// services down.
	ready := f.routesOK && f.loadsOK && !f.loadsErr
	f.mu.Unlock()
	if !ready {
		return
	}
	for name := range services {
		if _, ok := routes[name]; !ok {
			delete(services, name)
		}
	}
	names := make([]string, 0, len(routes))
	for name := range routes {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if ctx.Err() != nil {
			return
		}
		st := services[name]
		if st == nil {
			st = &service{
				countErr: errlog.New(a.cfg.Logf, "autoscaler: reading the count of "+name),
				scaleErr: errlog.New(a.cfg.Logf, "autoscaler: scaling "+name),
			}
			services[name] = st
		}
		a.decide(ctx, routes[name], st, loads)
	}
}

// decide takes one decision for r and carries it out.
func (a *Autoscaler) decide(ctx context.Context, r route, st *service, loads []servekv.Load) {
	now := a.cfg.Now()
	fresh := false
	if st.refused != "" && now.Sub(st.countAt) < refusedRecheck {
		return // the route's job is not its service's: asked again later
	}
	// The count is read at most about once a tick (decisions run on every
	// load report too), and again before any Scale.
	if !st.known || now.Sub(st.countAt) >= a.cfg.Tick/2 {
		if !a.readCount(ctx, r, st, now) {
			return
		}
		fresh = true
	}
	s := st.State
	s.Inflight, s.Queued, s.Gateways = Aggregate(loads, r.name, now)
	desired, reason, next := Decide(r.as, s, now)
	if desired == s.Current {
		st.State = next
		return
	}
	if desired < s.Current && s.Gateways == 0 {
		// No gateway reports at all, this one included: that is no
		// evidence of an idle service, only of broken reports.
		return
	}
	if now.Before(st.retryAt) {
		return // a Scale failed: try again at the next tick
	}
	if !fresh {
		// Do not scale from a stale count: Nomad's may have changed
		// (gpujob service scale, a job update).
		if !a.readCount(ctx, r, st, now) {
			return
		}
		s.Current, s.AboveSince, s.BelowSince, s.WindowMax = st.Current, st.AboveSince, st.BelowSince, st.WindowMax
		desired, reason, next = Decide(r.as, s, now)
		if desired == s.Current {
			st.State = next
			return
		}
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	err := a.cfg.Scaler.Scale(cctx, r.namespace, r.jobID, r.group, desired, reason)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		// Keep the state before the decision, so the next tick takes it
		// again.
		st.State = s
		if errors.Is(err, ErrBusy) {
			// Nomad scales no group while a deployment of its job runs
			// (one a scale started, or a rollout): wait for it, without
			// a refused write every half tick.
			st.retryAt = now.Add(busyRetry)
			if !st.busy {
				a.cfg.Logf("autoscaler: %s: waiting for the running deployment to end before scaling to %d (%s)", r.name, desired, reason)
			}
			st.busy = true
			return
		}
		st.retryAt = now.Add(a.cfg.Tick / 2)
		st.scaleErr.Failed(fmt.Errorf("to %d (%s): %w", desired, reason, err))
		return
	}
	st.scaleErr.OK()
	st.State, st.countAt, st.retryAt, st.busy = next, now, time.Time{}, false
	a.cfg.Logf("autoscaler: %s (job %s, group %s): %s", r.name, r.jobID, r.group, reason)
}

// readCount reads the group's count from Nomad into st, and checks that
// the job claims the route: a route naming a job that is not its service's
// (another service's, a plain job, one whose group is not the route's) is
// refused, and logged once, and the job is never scaled for it. A count
// that differs from the one st had (someone else scaled the group) starts
// the delays' windows over, as they were measured against the old count.
func (a *Autoscaler) readCount(ctx context.Context, r route, st *service, now time.Time) bool {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	g, err := a.cfg.Scaler.Group(cctx, r.namespace, r.jobID, r.group)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			st.countErr.Failed(err)
		}
		return false
	}
	st.countErr.OK()
	if err := owns(r, g); err != nil {
		if st.refused != err.Error() {
			st.refused = err.Error()
			a.cfg.Logf("autoscaler: route %s names job %s group %s: %v; not autoscaling it", r.name, r.jobID, r.group, err)
		}
		st.known, st.countAt = false, now
		return false
	}
	if st.refused != "" {
		a.cfg.Logf("autoscaler: route %s: job %s claims it now; autoscaling it", r.name, r.jobID)
		st.refused = ""
	}
	n := g.Count
	if !st.known || n != st.Current {
		st.Current = n
		st.AboveSince, st.BelowSince, st.WindowMax = time.Time{}, time.Time{}, 0
	}
	st.known, st.countAt = true, now
	return true
}

// owns checks that the job the route names claims the route and the group.
func owns(r route, g Group) error {
	claimed, err := servekv.JobRoute(r.namespace, r.service, g.JobNamespace, r.jobID, g.Meta)
	if err != nil {
		return err
	}
	if claimed.Group != r.group {
		return fmt.Errorf("the job claims its group %q, not %q", claimed.Group, r.group)
	}
	return nil
}
