package admit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/policy"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// ErrNotLeader is Reconcile's answer when this controller does not lead.
var ErrNotLeader = errors.New("admission controller: not the leader")

// errLeadershipLost is a write Consul refused because this controller's
// session no longer holds the leader key.
var errLeadershipLost = errors.New("admission controller: lost leadership")

// Controller admits queued jobs. Run it as the only task of a Nomad job:
// any number may run, one leads (internal/consul's Election on the
// leader key) and only the leader reconciles; every write it makes to
// Consul checks, in the same transaction, that its session still holds
// the leader key.
type Controller struct {
	Consul *api.Client
	Nomad  Nomad
	// Prefix is the queues' tree (contract.QueuePrefix when ""): the
	// configuration, jobs and state keys are under it.
	Prefix string
	// ID names this controller in the leader key (its allocation ID).
	ID         string
	SessionTTL time.Duration // default 10s
	// Resync is the longest time between two reconciles (default 30 s):
	// nodes and estimates change without a Consul or allocation event.
	Resync time.Duration
	// PartialGrace is how long an admitted batch gang may have fewer live
	// members than it has (a race with work outside gpujob after Nomad's
	// plan, a lost node) before it is stopped whole and queued again at
	// its place (default 30 s).
	PartialGrace time.Duration
	// Region is the Nomad region the controller registers in ("": Nomad's
	// default, global); a job naming another region is refused.
	Region string
	Logf   func(format string, args ...any)
	Now    func() time.Time

	mu      sync.Mutex
	session string // the leader session while leading, else ""
	lost    <-chan struct{}
}

// Result is what one Reconcile did.
type Result struct {
	Admitted, Preempted, Requeued, Finished []string
	// Partial are the admitted gangs stopped by the partial-gang guard.
	Partial []string
	// Withdrawn are jobs withdrawn while being admitted whose registered
	// job the round stopped.
	Withdrawn []string
	// Transactions counts the Consul transactions the round wrote;
	// LargestTransaction is the most operations one of them held (at most
	// maxTxnOps).
	Transactions, LargestTransaction int
	// Waiting are the queued jobs by name, with their status.
	Waiting map[string]*Status
	// Refused are jobs refused, by name, with the reason.
	Refused map[string]string
}

func (c *Controller) prefix() string {
	if c.Prefix == "" {
		return contract.QueuePrefix
	}
	return strings.TrimSuffix(c.Prefix, "/")
}

func (c *Controller) jobsPrefix() string   { return c.prefix() + "/jobs" }
func (c *Controller) statusPrefix() string { return c.prefix() + "/state/status" }
func (c *Controller) leaderKey() string    { return c.prefix() + "/state/leader" }
func (c *Controller) statsKey() string     { return c.prefix() + "/state/stats" }

func (c *Controller) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Controller) logf(format string, args ...any) {
	if c.Logf != nil {
		c.Logf(format, args...)
	}
}

func (c *Controller) partialGrace() time.Duration {
	if c.PartialGrace > 0 {
		return c.PartialGrace
	}
	return 30 * time.Second
}

// lead makes Reconcile act under session until lost closes.
func (c *Controller) lead(session string, lost <-chan struct{}) {
	c.mu.Lock()
	c.session, c.lost = session, lost
	c.mu.Unlock()
}

// leaderSession is the session to write under, or ErrNotLeader.
func (c *Controller) leaderSession() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.session == "" {
		return "", ErrNotLeader
	}
	select {
	case <-c.lost:
		return "", ErrNotLeader
	default:
	}
	return c.session, nil
}

// entry is one queued job record and its status in a round.
type entry struct {
	name        string // namespace/id
	key         string
	createIndex uint64
	// modifyIndex is the record's, for a delete that must not remove a
	// record its submitter replaced meanwhile.
	modifyIndex uint64
	rec         *JobRecord
	job         *nomadapi.Job
	invalid     error
	// queue is the record's queue as the stats count it (statsQueue).
	queue string

	st          *Status
	statusKey   string
	statusIndex uint64 // 0: no status stored
	stored      []byte // the status as stored
}

func (e *entry) marker(n int) string { return Marker(e.createIndex, n) }

// round is one Reconcile's working state.
type round struct {
	c       *Controller
	ctx     context.Context
	session string
	now     time.Time
	entries map[string]*entry
	res     Result
	// declared are the configuration's queues; stats the counters as
	// stored at statsIndex (0: none stored), changed only with the status
	// writes they count (tally).
	declared   map[string]bool
	stats      *Stats
	statsIndex uint64
	// scaleUps are the admitted services with replicas Nomad cannot
	// place, by the ID of the demand the policy weighs for them.
	scaleUps map[string]*entry
}

// ScaleUpSuffix marks the pending demand of a service's replicas that
// Nomad cannot place (a scale-up): "<namespace>/<service> (scale-up)" is
// what a gang it preempts is told preempted it.
const ScaleUpSuffix = " (scale-up)"

// Reconcile reads the queue configuration, the queued jobs and their
// statuses, and Nomad's nodes and allocations; decides (policy.Decide);
// and acts: stops preempted gangs, registers admitted ones (each only
// after Nomad's plan places every member), requeues stopped victims,
// forgets finished jobs, and writes every job's status. It returns
// ErrNotLeader, doing nothing, unless this controller leads.
func (c *Controller) Reconcile(ctx context.Context) (*Result, error) {
	session, err := c.leaderSession()
	if err != nil {
		return nil, err
	}
	r := &round{c: c, ctx: ctx, session: session, now: c.now(), entries: map[string]*entry{}, scaleUps: map[string]*entry{},
		res: Result{Waiting: map[string]*Status{}, Refused: map[string]string{}}}
	if err := r.run(); err != nil {
		return &r.res, err
	}
	return &r.res, nil
}

func (r *round) run() error {
	c, ctx := r.c, r.ctx
	cfgRec, _, err := queuekv.New(c.Consul, c.prefix()).Read(ctx)
	if err != nil {
		// An invalid configuration is not acted on: nothing is admitted or
		// preempted until an operator applies a valid one.
		return fmt.Errorf("queue configuration: %w", err)
	}
	cfg := cfgRec.Config()
	r.declared = map[string]bool{}
	for _, q := range cfg.QueueNames() {
		r.declared[q] = true
	}
	if err := r.load(); err != nil {
		return err
	}
	nodes, err := c.Nomad.Nodes(ctx)
	if err != nil {
		return fmt.Errorf("nomad nodes: %w", err)
	}
	allocs, err := c.Nomad.Allocations(ctx)
	if err != nil {
		return fmt.Errorf("nomad allocations: %w", err)
	}
	byJob := map[string][]Alloc{}
	unmanaged := map[string]policy.Resources{}
	for _, a := range allocs {
		// Only training and service jobs are the queue's: gpujob's own
		// helpers (gateway, exporter, the controllers) hold what they hold
		// outside it, like any other work.
		if k := a.JobMeta[contract.MetaKind]; k != contract.KindTrain && k != contract.KindService {
			u := unmanaged[a.Node]
			unmanaged[a.Node] = policy.Resources{GPUs: u.GPUs + a.Resources.GPUs, CPUMHz: u.CPUMHz + a.Resources.CPUMHz, MemoryMB: u.MemoryMB + a.Resources.MemoryMB}
			continue
		}
		n := a.Namespace + "/" + a.JobID
		byJob[n] = append(byJob[n], a)
	}
	for i := range nodes {
		nodes[i].Unmanaged = unmanaged[nodes[i].Name]
	}
	if err := r.recover(byJob); err != nil {
		return err
	}
	state := policy.State{Config: cfg, Nodes: nodes, Now: r.now}
	for _, name := range r.sortedNames() {
		e := r.entries[name]
		if e.invalid != nil {
			continue
		}
		switch e.st.State {
		case StateAdmitted, StatePreempted:
			run := policy.Running{Job: e.rec.PolicyJob(), Stopping: e.st.State == StatePreempted}
			if e.st.AdmittedAt != nil {
				run.StartedAt = *e.st.AdmittedAt
			}
			run.Placement = placementOf(byJob[name])
			if live := len(byJob[name]); live > run.Job.Members {
				// A service scaled past its record (within its scaling
				// block): the quota counts what holds resources.
				run.Job.Members = live
			}
			if len(run.Placement) == 0 {
				for _, p := range e.st.Placement {
					run.Placement = append(run.Placement, policy.NodeAlloc{Node: p.Node, Members: p.Members})
				}
			}
			delete(byJob, name)
			state.Running = append(state.Running, run)
		default:
			j := e.rec.PolicyJob()
			j.Nominated = e.st.Nominated
			state.Pending = append(state.Pending, j)
		}
	}
	if err := r.scaleUpDemands(&state); err != nil {
		return err
	}
	// gpujob jobs the queue did not admit (submitted before queues, or
	// their record is gone or invalid): they hold GPUs of their queue, and
	// are never preempted (the policy ranks them above everything).
	for _, name := range sortedKeys(byJob) {
		as := byJob[name]
		q := as[0].JobMeta[contract.MetaQueue]
		state.Running = append(state.Running, policy.Running{
			Job: policy.Job{ID: name, Queue: q, Class: policy.ClassService, Priority: 1 << 20,
				Members: len(as), PerMember: as[0].Resources},
			StartedAt: r.now, Placement: placementOf(as),
		})
	}
	d, err := policy.Decide(state)
	if err != nil {
		return fmt.Errorf("queue configuration: %w", err)
	}
	for _, p := range d.Preempt {
		if err := r.preempt(p); err != nil {
			return err
		}
	}
	for _, a := range d.Admit {
		if err := r.admit(a); err != nil {
			return err
		}
	}
	for _, w := range d.Waiting {
		e := r.entries[w.Job]
		if e == nil {
			continue
		}
		st := e.st
		st.State, st.Position, st.Reason = StateQueued, w.Position, w.Reason()
		st.EstimatedStart = nil
		if !w.EstimatedStart.IsZero() {
			t := w.EstimatedStart
			st.EstimatedStart = &t
		}
		r.res.Waiting[e.name] = st
	}
	for _, f := range d.Refused {
		e := r.entries[f.Job]
		if e == nil {
			continue
		}
		e.st.State, e.st.Reason, e.st.Position, e.st.EstimatedStart = StateRefused, f.Err.Error(), 0, nil
		r.res.Refused[e.name] = e.st.Reason
	}
	return r.flush()
}

// load lists the job records and statuses, decodes and checks them, and
// deletes statuses whose record is gone.
func (r *round) load() error {
	c, ctx := r.c, r.ctx
	q := (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx)
	jobs, _, err := c.Consul.KV().List(c.jobsPrefix()+"/", q)
	if err != nil {
		return fmt.Errorf("reading %s/: %w", c.jobsPrefix(), err)
	}
	statuses, _, err := c.Consul.KV().List(c.statusPrefix()+"/", q)
	if err != nil {
		return fmt.Errorf("reading %s/: %w", c.statusPrefix(), err)
	}
	for _, p := range jobs {
		name := strings.TrimPrefix(p.Key, c.jobsPrefix()+"/")
		ns, id, ok := strings.Cut(name, "/")
		if !ok || !validNamespace.MatchString(ns) || !validID.MatchString(id) {
			c.logf("ignoring %s: not <namespace>/<job ID> under %s/", p.Key, c.jobsPrefix())
			continue
		}
		e := &entry{name: name, key: p.Key, createIndex: p.CreateIndex, modifyIndex: p.ModifyIndex, statusKey: c.statusPrefix() + "/" + name}
		e.rec, e.job, e.invalid = DecodeJobRecord(p.Value, r.now)
		e.queue = RecordQueue(e.rec, p.Value)
		if e.invalid == nil && e.rec.Name() != name {
			e.invalid = fmt.Errorf("the record names job %s, its key %s", e.rec.Name(), name)
		}
		if e.invalid == nil && e.job.Region != nil && *e.job.Region != "" && *e.job.Region != orDefault(c.Region, defaultRegion) {
			e.invalid = fmt.Errorf("job region %q: the queue runs jobs in region %q (leave region out)", clip(*e.job.Region), orDefault(c.Region, defaultRegion))
		}
		r.entries[name] = e
	}
	var orphans api.TxnOps
	for _, p := range statuses {
		name := strings.TrimPrefix(p.Key, c.statusPrefix()+"/")
		e := r.entries[name]
		if e == nil {
			// Its record was withdrawn, or finished and deleted: the status
			// goes too, once a registration it was in the middle of is
			// undone.
			if err := r.undoWithdrawn(name, p.Value); err != nil {
				return err
			}
			orphans = append(orphans, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDeleteCAS, Key: p.Key, Index: p.ModifyIndex}})
			if len(orphans) == maxTxnOps-1 {
				if err := r.txn(orphans); err != nil {
					return err
				}
				orphans = nil
			}
			continue
		}
		e.statusIndex, e.stored = p.ModifyIndex, p.Value
		st, err := DecodeStatus(p.Value)
		switch {
		case err != nil:
			// Only the controller writes statuses; one it cannot read is
			// rebuilt from Nomad (recover), as if none had been written.
			c.logf("%s: unreadable status (%v): rebuilding it from Nomad", name, err)
		case st.RecordIndex != e.createIndex:
			// A status of an earlier record of the same name.
		default:
			e.st = st
		}
	}
	if len(orphans) > 0 {
		if err := r.txn(orphans); err != nil {
			return err
		}
	}
	if err := r.loadStats(); err != nil {
		return err
	}
	for _, e := range r.entries {
		if e.invalid != nil {
			e.st = &Status{Format: Format, State: StateRefused, RecordIndex: e.createIndex,
				Reason: "the queued job's record is invalid and is not acted on: " + e.invalid.Error()}
			r.res.Refused[e.name] = e.st.Reason
			continue
		}
		if e.st == nil {
			e.st = &Status{Format: Format, State: StateQueued, RecordIndex: e.createIndex}
		}
	}
	return nil
}

// undoWithdrawn stops the Nomad job of a status whose record is gone when
// the status says a registration was under way (Admitting) and Nomad has
// the job of that admission: the job was withdrawn (gpujob stop, which
// saw it queued) while the controller registered it, and must not run.
// A status without an intent is left to whoever withdrew the record: an
// admitted job's stop stops it in Nomad itself.
func (r *round) undoWithdrawn(name string, value []byte) error {
	st, err := DecodeStatus(value)
	if err != nil || st.Admitting == 0 {
		return nil
	}
	ns, id, _ := strings.Cut(name, "/")
	info, err := r.c.Nomad.Job(r.ctx, ns, id)
	if err != nil {
		return fmt.Errorf("reading job %s: %w", name, err)
	}
	if info == nil || info.Stop {
		return nil
	}
	if ri, _, ok := parseMarker(info.Meta[contract.MetaAdmission]); !ok || ri != st.RecordIndex {
		return nil // another submission's job of the same name
	}
	if err := r.c.Nomad.Stop(r.ctx, ns, id); err != nil {
		return fmt.Errorf("stopping job %s (withdrawn while being admitted): %w", name, err)
	}
	r.c.logf("%s: withdrawn while being admitted: stopped the job registered for it", name)
	r.res.Withdrawn = append(r.res.Withdrawn, name)
	return nil
}

// recover brings each status up to date with Nomad: a registration whose
// outcome is unknown (Admitting, or a lost status), a victim that has
// stopped, an admitted job that has ended.
func (r *round) recover(byJob map[string][]Alloc) error {
	c, ctx := r.c, r.ctx
	for _, name := range r.sortedNames() {
		e := r.entries[name]
		if e.invalid != nil {
			continue
		}
		st := e.st
		// The job's allocations of this record's admissions, by the marker.
		mine := byJob[name][:0:0]
		for _, a := range byJob[name] {
			if ri, _, ok := parseMarker(a.JobMeta[contract.MetaAdmission]); ok && ri == e.createIndex {
				mine = append(mine, a)
			}
		}
		switch {
		case st.Admitting > 0 || (st.State != StateAdmitted && st.State != StatePreempted && len(mine) > 0):
			// A registration may have happened that the status does not
			// say: Nomad's job decides.
			info, err := c.Nomad.Job(ctx, e.rec.Namespace, e.rec.ID)
			if err != nil {
				return fmt.Errorf("reading job %s: %w", name, err)
			}
			n := 0
			if info != nil && !info.Stop {
				if ri, k, ok := parseMarker(info.Meta[contract.MetaAdmission]); ok && ri == e.createIndex {
					n = k
				}
			}
			if n > 0 {
				c.logf("%s: found admission %d registered in Nomad; recording it", name, n)
				st.State, st.Admissions, st.Admitting = StateAdmitted, n, 0
				at := r.now
				st.AdmittedAt, st.Position, st.Reason, st.EstimatedStart, st.Nominated = &at, 0, "", nil, false
			} else {
				st.Admitting = 0
			}
			if err := r.write(e); err != nil {
				return err
			}
		case st.State == StatePreempted:
			info, err := c.Nomad.Job(ctx, e.rec.Namespace, e.rec.ID)
			if err != nil {
				return fmt.Errorf("reading job %s: %w", name, err)
			}
			if info != nil && !info.Stop && info.Meta[contract.MetaAdmission] == e.marker(st.Admissions) {
				// The stop may not have reached Nomad (a crash after the
				// status was written): again.
				if err := c.Nomad.Stop(ctx, e.rec.Namespace, e.rec.ID); err != nil {
					return fmt.Errorf("stopping job %s: %w", name, err)
				}
			}
			if len(mine) == 0 {
				at := r.now
				st.State, st.AdmittedAt, st.Placement, st.QueuedAt = StateQueued, nil, nil, &at
				r.res.Requeued = append(r.res.Requeued, name)
				c.logf("%s: stopped; queued again at its place (submitted %s)", name, e.rec.SubmittedAt.Format(time.RFC3339))
			}
		case st.State == StateAdmitted && len(mine) == 0:
			// No member holds anything: registered and not placed yet
			// (Nomad's job is pending, its placement is kept for it), or
			// ended. Asked at once, not after a grace: a job that ended
			// soon after its admission would hold its placement's GPUs
			// in the policy's eyes until the next resync.
			info, err := c.Nomad.Job(ctx, e.rec.Namespace, e.rec.ID)
			if err != nil {
				return fmt.Errorf("reading job %s: %w", name, err)
			}
			if info == nil || info.Stop || info.Status == "dead" || info.Meta[contract.MetaAdmission] != e.marker(st.Admissions) {
				// Ended (or stopped, or purged, or replaced): forget it.
				ops := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVDeleteCAS, Key: e.key, Index: e.modifyIndex}}}
				if e.statusIndex != 0 {
					ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDeleteCAS, Key: e.statusKey, Index: e.statusIndex}})
				}
				if err := r.txn(ops); err != nil {
					return err
				}
				delete(r.entries, name)
				r.res.Finished = append(r.res.Finished, name)
				c.logf("%s: ended in Nomad; its queue records are deleted", name)
				continue
			}
		}
		if err := r.guardPartial(e, mine); err != nil {
			return err
		}
	}
	return nil
}

// guardPartial stops an admitted batch gang that has had fewer live
// members than it has past the grace: Nomad placed part of it (work
// outside gpujob took capacity between the plan and the registration)
// or lost some (a node). A partial gang holds GPUs and cannot train; it
// is stopped whole, like a preempted one, and queued again at its place.
// Members that ended by themselves (completed or failed, as Nomad meant
// them to run) are not missing: a batch gang's members may finish apart,
// and a failing job ends rather than queueing forever. Services are not
// gangs: their replicas serve alone.
func (r *round) guardPartial(e *entry, mine []Alloc) error {
	c, ctx, st := r.c, r.ctx, e.st
	if st.State != StateAdmitted || st.Admitting != 0 || e.rec.Kind == KindService {
		return nil
	}
	cur := e.marker(st.Admissions)
	live := 0
	for _, a := range mine {
		if a.JobMeta[contract.MetaAdmission] == cur {
			live++
		}
	}
	ended := 0
	if live < e.rec.Members {
		all, err := c.Nomad.JobAllocations(ctx, e.rec.Namespace, e.rec.ID)
		if err != nil {
			return fmt.Errorf("reading the allocations of job %s: %w", e.name, err)
		}
		for _, a := range all {
			if a.JobMeta[contract.MetaAdmission] == cur && a.DesiredStatus == nomadapi.AllocDesiredStatusRun &&
				(a.ClientStatus == nomadapi.AllocClientStatusComplete || a.ClientStatus == nomadapi.AllocClientStatusFailed) {
				ended++
			}
		}
	}
	missing := e.rec.Members - live - ended
	if missing <= 0 {
		st.ShortSince = nil
		return nil
	}
	if st.ShortSince == nil {
		at := r.now
		st.ShortSince = &at
		c.logf("%s: %d of %d members live (%d ended); stopped and queued again if still short after %s", e.name, live, e.rec.Members, ended, c.partialGrace())
		return nil
	}
	if short := r.now.Sub(*st.ShortSince); short < c.partialGrace() {
		return nil
	}
	// A job stopped outside the queue (nomad job stop, gpujob cancel)
	// loses its members one by one: it ended, it is not queued again
	// (recover forgets it once its allocations are gone).
	info, err := c.Nomad.Job(ctx, e.rec.Namespace, e.rec.ID)
	if err != nil {
		return fmt.Errorf("reading job %s: %w", e.name, err)
	}
	if info == nil || info.Stop || info.Meta[contract.MetaAdmission] != cur {
		return nil
	}
	at := r.now
	st.State, st.PreemptedBy, st.PreemptedAt = StatePreempted, "", &at
	st.PreemptedWhy = fmt.Sprintf("only %d of its %d members were placed or running for %s (capacity taken by work outside the queue, or a node lost): stopped whole and queued again at its place",
		live+ended, e.rec.Members, r.now.Sub(*st.ShortSince).Round(time.Second))
	st.ShortSince = nil
	st.Preemptions++
	if err := r.write(e); err != nil {
		return err
	}
	if err := c.Nomad.Stop(ctx, e.rec.Namespace, e.rec.ID); err != nil {
		// Stopped again next round (recover): the status says preempted.
		return fmt.Errorf("stopping partial gang %s: %w", e.name, err)
	}
	c.logf("%s: %s", e.name, st.PreemptedWhy)
	r.res.Partial = append(r.res.Partial, e.name)
	return nil
}

// preempt stops a victim gang, recording who preempted it and why first,
// and nominates the preemptor.
func (r *round) preempt(p policy.Preemption) error {
	c := r.c
	v, pre := r.entries[p.Victim], r.entries[p.Preemptor]
	if v == nil || v.invalid != nil || v.st.State != StateAdmitted {
		c.logf("not preempting %s for %s: not a job the queue admitted", p.Victim, p.Preemptor)
		return nil
	}
	at := r.now
	v.st.State, v.st.PreemptedBy, v.st.PreemptedWhy, v.st.PreemptedAt = StatePreempted, p.Preemptor, p.Reason, &at
	v.st.Preemptions++
	if err := r.write(v); err != nil {
		return err
	}
	if err := c.Nomad.Stop(r.ctx, v.rec.Namespace, v.rec.ID); err != nil {
		// Stopped again next round (recover), the status says preempted.
		return fmt.Errorf("stopping job %s (preempted by %s): %w", p.Victim, p.Preemptor, err)
	}
	c.logf("%s: preempted: %s", p.Victim, p.Reason)
	r.res.Preempted = append(r.res.Preempted, p.Victim)
	if pre == nil {
		// A service's scale-up: its admitted status carries the
		// nomination while its replicas wait for the victims' GPUs.
		pre = r.scaleUps[p.Preemptor]
	}
	if pre != nil && !pre.st.Nominated {
		pre.st.Nominated = true
		if err := r.write(pre); err != nil {
			return err
		}
	}
	return nil
}

// admit registers one admitted gang: intent first (Admitting), then
// Nomad's job is read (a registration of this admission may exist), then
// planned against live capacity, then registered with an index check,
// then the admission recorded.
func (r *round) admit(a policy.Admission) error {
	c, ctx := r.c, r.ctx
	if svc := r.scaleUps[a.Job]; svc != nil {
		// Room for the replicas exists (or was made): Nomad's blocked
		// evaluation places them; nothing to register.
		c.logf("%s: its scale-up fits; Nomad places its replicas", svc.name)
		return nil
	}
	e := r.entries[a.Job]
	if e == nil || e.invalid != nil {
		return nil
	}
	st := e.st
	n := st.Admissions + 1
	marker := e.marker(n)
	st.Admitting = n
	// Guarded by the record: a job withdrawn (gpujob stop) since the
	// round read it gets no intent, and the round starts over.
	if err := r.writeGuarded(e); err != nil {
		return err
	}
	info, err := c.Nomad.Job(ctx, e.rec.Namespace, e.rec.ID)
	if err != nil {
		return fmt.Errorf("reading job %s: %w", e.name, err)
	}
	if info == nil || info.Stop || info.Meta[contract.MetaAdmission] != marker {
		job := withMarker(e.job, marker)
		plan, err := c.Nomad.Plan(ctx, job)
		if err != nil {
			return fmt.Errorf("planning job %s: %w", e.name, err)
		}
		if why := unplaced(plan, e.rec.Members); why != "" {
			st.Admitting, st.State, st.Position, st.EstimatedStart = 0, StateQueued, 0, nil
			st.Reason = "admitted by the queue, but " + why + "; tried again when the cluster changes"
			r.res.Waiting[e.name] = st
			c.logf("%s: not registered: %s", e.name, why)
			return r.write(e)
		}
		// The plan took a while: a stop may have withdrawn the job since.
		// Read its record once more, consistently, just before Nomad
		// gets it. What still slips between this read and Register is
		// caught by the guarded write below and the next round's load.
		if gone, err := r.withdrawn(e); err != nil {
			return err
		} else if gone {
			c.logf("%s: withdrawn while being admitted: not registered", e.name)
			return nil
		}
		var index uint64
		if info != nil {
			index = info.ModifyIndex
		}
		if err := c.Nomad.Register(ctx, job, index); err != nil {
			// The outcome may be unknown (an answer lost): Admitting
			// stays, and the next round reads Nomad's job before anything.
			return fmt.Errorf("registering job %s: %w", e.name, err)
		}
	}
	at := r.now
	st.State, st.Admissions, st.Admitting, st.AdmittedAt = StateAdmitted, n, 0, &at
	st.Position, st.Reason, st.EstimatedStart, st.Nominated = 0, "", nil, false
	st.Placement, st.ShortSince = nil, nil
	for _, p := range a.Placement {
		st.Placement = append(st.Placement, Placement{Node: p.Node, Members: p.Members})
	}
	if a.Backfilled {
		st.Reason = "backfilled: it ends before, or fits beside, the first job waiting for capacity"
	}
	if a.BorrowedGPUs > 0 {
		st.Reason = strings.TrimPrefix(st.Reason+fmt.Sprintf("; borrows %d GPUs of its cohort's idle quota", a.BorrowedGPUs), "; ")
	}
	// Guarded by the record: when the job was withdrawn after the read
	// above, the status keeps its intent (Admitting) and the next round's
	// load stops the job it finds registered under it.
	if err := r.writeGuarded(e); err != nil {
		return err
	}
	c.logf("%s: admitted (admission %d)", e.name, n)
	r.res.Admitted = append(r.res.Admitted, e.name)
	return nil
}

// scaleUpDemands adds to state a pending demand for each admitted service
// with replicas Nomad cannot place: a scale (the autoscaler, gpujob
// service scale) within its scaling block went to Nomad, not through the
// queue, and what Nomad could not place waits as a gang of its own would,
// of the service's class, so that it preempts lower work the way a new
// gang would. Admitting it registers nothing (Nomad places the replicas
// once there is room); a service whose replicas are all placed has its
// nomination cleared.
func (r *round) scaleUpDemands(state *policy.State) error {
	for _, name := range r.sortedNames() {
		e := r.entries[name]
		if e.invalid != nil || e.rec.Kind != KindService || e.st.State != StateAdmitted {
			continue
		}
		n, err := r.c.Nomad.Unplaced(r.ctx, e.rec.Namespace, e.rec.ID)
		if err != nil {
			return fmt.Errorf("reading job %s: %w", name, err)
		}
		if n <= 0 {
			e.st.Nominated = false
			continue
		}
		j := e.rec.PolicyJob()
		j.ID, j.Members, j.MaxRuntime, j.Nominated = name+ScaleUpSuffix, min(n, MaxMembers), 0, e.st.Nominated
		j.SubmittedAt = r.now
		state.Pending = append(state.Pending, j)
		r.scaleUps[j.ID] = e
	}
	return nil
}

// withMarker is a copy of job whose meta carries the admission marker.
func withMarker(job *nomadapi.Job, marker string) *nomadapi.Job {
	cp := *job
	cp.Meta = maps.Clone(job.Meta)
	if cp.Meta == nil {
		cp.Meta = map[string]string{}
	}
	cp.Meta[contract.MetaAdmission] = marker
	return &cp
}

// unplaced says in words what of the gang Nomad's plan would not place
// ("" when it places every member).
func unplaced(plan *nomadapi.JobPlanResponse, members int) string {
	if plan == nil {
		return "Nomad's plan answered nothing"
	}
	if len(plan.FailedTGAllocs) == 0 {
		if plan.Annotations != nil && len(plan.Annotations.PreemptedAllocs) > 0 {
			// Nomad's own preemption (by job priority, where an operator
			// enabled it) evicts single allocations: members of other
			// gangs. The queue preempts whole gangs itself; the job's Nomad
			// priority never buys it a place.
			return fmt.Sprintf("Nomad's plan places it only by evicting %d allocations of other jobs (Nomad's preemption by job priority; the queue preempts whole gangs itself)", len(plan.Annotations.PreemptedAllocs))
		}
		return ""
	}
	var parts []string
	for _, g := range sortedKeys(plan.FailedTGAllocs) {
		m := plan.FailedTGAllocs[g]
		s := "group " + g
		if m != nil {
			var why []string
			for _, k := range sortedKeys(m.DimensionExhausted) {
				why = append(why, fmt.Sprintf("%s exhausted on %d nodes", k, m.DimensionExhausted[k]))
			}
			if m.NodesEvaluated > 0 {
				why = append(why, fmt.Sprintf("%d nodes evaluated", m.NodesEvaluated))
			}
			if len(why) > 0 {
				s += " (" + strings.Join(why, ", ") + ")"
			}
		}
		parts = append(parts, s)
	}
	return fmt.Sprintf("Nomad's plan cannot place all %d members at once now: %s", members, strings.Join(parts, "; "))
}

// maxTxnOps bounds the operations of one transaction (Consul 1.15 takes
// up to 128; the controller keeps to half).
const maxTxnOps = 64

// flush writes every status that changed, in transactions of up to
// maxTxnOps operations (the leader check, a check-and-set of each status,
// and of the stats when the batch counts something): a position change of
// 500 waiting jobs is 8 transactions, not 500. A failed check-and-set
// fails its transaction: the round stops, and the next one reads again.
func (r *round) flush() error {
	var batch []*entry
	var ops api.TxnOps
	var values [][]byte
	t := &tally{r: r}
	send := func() error {
		if len(ops) == 0 {
			return nil
		}
		all := ops
		sop, err := t.op()
		if err != nil {
			return err
		}
		if sop != nil {
			all = append(all, sop)
		}
		results, err := r.txnResults(all)
		if err != nil {
			return err
		}
		t.commit(results)
		index := map[string]uint64{}
		for _, res := range results {
			if res.KV != nil {
				index[res.KV.Key] = res.KV.ModifyIndex
			}
		}
		for i, e := range batch {
			e.statusIndex, e.stored = index[e.statusKey], values[i]
		}
		batch, ops, values = nil, nil, nil
		return nil
	}
	// room is the operations a batch may hold besides the leader check.
	const room = maxTxnOps - 1
	for _, name := range r.sortedNames() {
		e := r.entries[name]
		b, err := EncodeStatus(e.st)
		if err != nil {
			return fmt.Errorf("%s: %w", e.name, err)
		}
		if bytes.Equal(b, e.stored) {
			continue
		}
		if t.next == nil && len(ops) == room-1 && t.counts(e) {
			// Its counts need the stats operation too: the next batch.
			if err := send(); err != nil {
				return err
			}
		}
		t.add(e)
		batch, values = append(batch, e), append(values, b)
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: e.statusKey, Value: b, Index: e.statusIndex}})
		if len(ops)+btoi(t.next != nil) >= room {
			if err := send(); err != nil {
				return err
			}
		}
	}
	return send()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// write stores e's status now if it differs from what is stored,
// checking the stored index and the leadership in one transaction: for
// the writes that must land before a Nomad call (intent, preemption).
// What the change counts goes into the stats in the same transaction.
func (r *round) write(e *entry) error {
	b, err := EncodeStatus(e.st)
	if err != nil {
		return fmt.Errorf("%s: %w", e.name, err)
	}
	if bytes.Equal(b, e.stored) {
		return nil
	}
	return r.writeStatus(e, b, nil)
}

// writeGuarded is write, in a transaction that also checks that e's job
// record is still the one the round read (not withdrawn, not replaced).
func (r *round) writeGuarded(e *entry) error {
	b, err := EncodeStatus(e.st)
	if err != nil {
		return fmt.Errorf("%s: %w", e.name, err)
	}
	guard := &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: e.key, Index: e.modifyIndex}}
	if err := r.writeStatus(e, b, guard); err != nil {
		return fmt.Errorf("%s: %w", e.name, err)
	}
	return nil
}

// writeStatus stores b as e's status (check-and-set), after guard when
// set, with the stats of what the change counts, in one transaction.
func (r *round) writeStatus(e *entry, b []byte, guard *api.TxnOp) error {
	var ops api.TxnOps
	if guard != nil {
		ops = append(ops, guard)
	}
	ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: e.statusKey, Value: b, Index: e.statusIndex}})
	t := &tally{r: r}
	t.add(e)
	sop, err := t.op()
	if err != nil {
		return err
	}
	if sop != nil {
		ops = append(ops, sop)
	}
	results, err := r.txnResults(ops)
	if err != nil {
		return err
	}
	t.commit(results)
	for _, res := range results {
		if res.KV != nil && res.KV.Key == e.statusKey {
			e.statusIndex = res.KV.ModifyIndex
		}
	}
	e.stored = b
	return nil
}

// withdrawn reads e's job record again, consistently: true when it is
// gone or is another record of the same name.
func (r *round) withdrawn(e *entry) (bool, error) {
	p, _, err := r.c.Consul.KV().Get(e.key, (&api.QueryOptions{RequireConsistent: true}).WithContext(r.ctx))
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", e.key, err)
	}
	return p == nil || p.CreateIndex != e.createIndex, nil
}

func (r *round) txn(ops api.TxnOps) error {
	_, err := r.txnResults(ops)
	return err
}

// txnResults runs ops in one transaction after a check that this
// controller's session holds the leader key: a deposed leader writes
// nothing. A failed check-and-set is an error: the round stops, and the
// next one reads again.
func (r *round) txnResults(ops api.TxnOps) (api.TxnResults, error) {
	all := append(api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: r.c.leaderKey(), Session: r.session}}}, ops...)
	r.res.Transactions++
	r.res.LargestTransaction = max(r.res.LargestTransaction, len(all))
	ok, resp, _, err := r.c.Consul.Txn().Txn(all, (&api.QueryOptions{}).WithContext(r.ctx))
	if err != nil {
		return nil, fmt.Errorf("writing the queue state: %w", err)
	}
	if !ok {
		for _, e := range resp.Errors {
			if e.OpIndex == 0 {
				return nil, fmt.Errorf("%w: %s", errLeadershipLost, e.What)
			}
		}
		var what []string
		for _, e := range resp.Errors {
			what = append(what, e.What)
		}
		return nil, fmt.Errorf("writing the queue state: changed since read (%s)", strings.Join(what, "; "))
	}
	return resp.Results, nil
}

func (r *round) sortedNames() []string { return sortedKeys(r.entries) }

func placementOf(as []Alloc) []policy.NodeAlloc {
	count := map[string]int{}
	for _, a := range as {
		count[a.Node]++
	}
	var out []policy.NodeAlloc
	for _, n := range sortedKeys(count) {
		out = append(out, policy.NodeAlloc{Node: n, Members: count[n]})
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
