package observe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/internal/backoff"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// Source is what readers of the cluster need; *Watcher implements it.
type Source interface {
	// Snapshot assembles the cluster now: what the blocking queries last
	// saw plus fresh GPU stats (one stats request per node with GPUs).
	Snapshot(ctx context.Context) (*Snapshot, error)
	// Changed signals whenever a blocking query saw nodes, allocations,
	// jobs or sweeps change.
	Changed() <-chan struct{}
}

// Config configures a Watcher.
type Config struct {
	Nomad nomadapi.API
	// Consul, when set, is where the sweeps' records are read.
	Consul *consul.Client
	// SweepPrefix is the sweeps' KV prefix (default sweepkv.DefaultPrefix).
	SweepPrefix string
	// QueuePrefix is the queues' tree (default contract.QueuePrefix),
	// read from Consul too for the queue summaries.
	QueuePrefix string
	// Logf, when set, hears of reads that fail (throttled).
	Logf func(format string, args ...any)
	// NodeID, when set, limits the GPUs (and their stats requests) to one
	// node: an exporter of a system job reports its own node's GPUs.
	NodeID string
	// LossInterval is how often the running training members' logs are
	// read for their latest loss lines (one log read per member); 0 never.
	LossInterval time.Duration
	// StatsTimeout bounds one node's stats request (default 5 s), and
	// StatsParallel the requests in flight at once (default 16).
	StatsTimeout  time.Duration
	StatsParallel int
	// WaitTime is the blocking queries' wait (default 5 m).
	WaitTime time.Duration
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// Requests, when set, counts the requests made, by endpoint.
	Requests func(endpoint string)
	// NoStats makes Once read no GPU stats, for a view that counts GPUs
	// and their holders only (`gpujob queue status`): the nodes,
	// allocations and jobs alone.
	NoStats bool
}

// Watcher keeps a view of the cluster current with blocking queries.
type Watcher struct {
	cfg     Config
	changed chan struct{}
	ready   chan struct{} // closed once nodes, allocations and jobs were read
	readyN  int

	mu      sync.Mutex
	nodes   []*api.NodeListStub
	allocs  []*api.AllocationListStub
	jobs    []*api.JobListStub
	sweeps  []Sweep
	sweepEr string
	losses  map[string][]RankLoss // by namespace/job
	errs    map[string]string     // the last error of each query loop

	queues queueState // what the queue watches read (its own lock)
}

// NewWatcher returns a watcher; Run starts its queries.
func NewWatcher(cfg Config) *Watcher {
	if cfg.SweepPrefix == "" {
		cfg.SweepPrefix = sweepkv.DefaultPrefix
	}
	if cfg.QueuePrefix == "" {
		cfg.QueuePrefix = contract.QueuePrefix
	}
	if cfg.StatsTimeout <= 0 {
		cfg.StatsTimeout = 5 * time.Second
	}
	if cfg.StatsParallel <= 0 {
		cfg.StatsParallel = 16
	}
	if cfg.WaitTime <= 0 {
		cfg.WaitTime = 5 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Requests == nil {
		cfg.Requests = func(string) {}
	}
	return &Watcher{cfg: cfg, changed: make(chan struct{}, 1), ready: make(chan struct{}),
		losses: map[string][]RankLoss{}, errs: map[string]string{}, queues: queueState{errs: map[string]string{}}}
}

// Changed implements Source.
func (w *Watcher) Changed() <-chan struct{} { return w.changed }

// Ready is closed once the first answers of the node, allocation and job
// queries are in.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

func (w *Watcher) signal() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// Run runs the blocking queries until ctx ends. Errors are retried with
// backoff and shown in the snapshots' warnings meanwhile.
func (w *Watcher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	loops := []func(context.Context){w.watchNodes, w.watchAllocs, w.watchJobs}
	if w.cfg.Consul != nil {
		loops = append(loops, w.watchSweeps, w.watchQueues)
	}
	if w.cfg.LossInterval > 0 {
		loops = append(loops, w.readLosses)
	}
	for _, l := range loops {
		wg.Add(1)
		go func() { defer wg.Done(); l(ctx) }()
	}
	wg.Wait()
	return ctx.Err()
}

// blockingLoop runs one blocking query until ctx ends: query gets the
// index to wait on and returns the new index; an index that goes back
// (a restarted server) starts over from 0, as Consul's and Nomad's
// documentation ask.
func (w *Watcher) blockingLoop(ctx context.Context, name string, query func(q *api.QueryOptions) (uint64, error)) {
	b := backoff.New(250*time.Millisecond, 10*time.Second)
	var index uint64
	first := true
	for ctx.Err() == nil {
		q := (&api.QueryOptions{WaitIndex: index, WaitTime: w.cfg.WaitTime}).WithContext(ctx)
		w.cfg.Requests(name)
		next, err := query(q)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.setErr(name, err)
			b.Wait(ctx)
			continue
		}
		b.Reset()
		w.setErr(name, nil)
		if first {
			first = false
			w.mu.Lock()
			w.readyN++
			if w.readyN == 3 {
				close(w.ready)
			}
			w.mu.Unlock()
		}
		if next < index {
			next = 0
		}
		if next != index {
			w.signal()
		}
		index = next
	}
}

func (w *Watcher) setErr(name string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		delete(w.errs, name)
	} else {
		w.errs[name] = err.Error()
	}
}

func (w *Watcher) watchNodes(ctx context.Context) {
	w.blockingLoop(ctx, "nodes", func(q *api.QueryOptions) (uint64, error) {
		q.Params = map[string]string{"resources": "true"}
		nodes, meta, err := w.cfg.Nomad.Nodes(q)
		if err != nil {
			return 0, err
		}
		w.mu.Lock()
		w.nodes = nodes
		w.mu.Unlock()
		return meta.LastIndex, nil
	})
}

func (w *Watcher) watchAllocs(ctx context.Context) {
	w.blockingLoop(ctx, "allocations", func(q *api.QueryOptions) (uint64, error) {
		q.Namespace = "*"
		q.Params = map[string]string{"resources": "true", "task_states": "true"}
		allocs, meta, err := w.cfg.Nomad.Allocations(q)
		if err != nil {
			return 0, err
		}
		w.mu.Lock()
		w.allocs = allocs
		w.mu.Unlock()
		return meta.LastIndex, nil
	})
}

func (w *Watcher) watchJobs(ctx context.Context) {
	w.blockingLoop(ctx, "jobs", func(q *api.QueryOptions) (uint64, error) {
		q.Namespace = "*"
		q.Params = map[string]string{"meta": "true"}
		jobs, meta, err := w.cfg.Nomad.Jobs(q)
		if err != nil {
			return 0, err
		}
		w.mu.Lock()
		w.jobs = jobs
		w.mu.Unlock()
		return meta.LastIndex, nil
	})
}

// watchSweeps follows the sweeps' key names with a blocking query and
// reads each sweep's spec and state when they change. Key names only:
// the trials' metric records, up to hundreds of KiB each, are not read.
func (w *Watcher) watchSweeps(ctx context.Context) {
	kv := w.cfg.Consul.KV()
	b := backoff.New(250*time.Millisecond, 10*time.Second)
	var index uint64
	prefix := strings.TrimSuffix(w.cfg.SweepPrefix, "/") + "/"
	for ctx.Err() == nil {
		w.cfg.Requests("sweep-keys")
		keys, meta, err := kv.Keys(prefix, "", (&consul.QueryOptions{WaitIndex: index, WaitTime: w.cfg.WaitTime}).WithContext(ctx))
		if err == nil {
			var sweeps []Sweep
			sweeps, err = w.readSweeps(ctx, keys)
			if err == nil {
				w.mu.Lock()
				w.sweeps, w.sweepEr = sweeps, ""
				w.mu.Unlock()
				if meta.LastIndex != index {
					w.signal()
				}
				index = meta.LastIndex
				if index < 1 {
					index = 1
				}
				b.Reset()
				// Trials report often; a sweep view needs no more than
				// one read a second.
				backoff.Sleep(ctx, time.Second)
				continue
			}
		}
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		w.sweepEr = "reading the sweeps from Consul: " + err.Error()
		w.mu.Unlock()
		index = 0
		b.Wait(ctx)
	}
}

func (w *Watcher) readSweeps(ctx context.Context, keys []string) ([]Sweep, error) {
	kv := w.cfg.Consul.KV()
	var out []Sweep
	for _, k := range keys {
		if !strings.HasSuffix(k, "/state") || strings.Contains(k, "/trials/") {
			continue
		}
		root := strings.TrimSuffix(k, "/state")
		w.cfg.Requests("sweep-state")
		st, _, err := kv.Get(k, (&consul.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return nil, err
		}
		if st == nil {
			continue
		}
		var state controller.State
		if err := json.Unmarshal(st.Value, &state); err != nil {
			continue // a record being written by a newer gpujob: skip, not fail
		}
		w.cfg.Requests("sweep-spec")
		sp, _, err := kv.Get(root+"/spec", (&consul.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return nil, err
		}
		var rec sweepjob.Record
		if sp != nil {
			_ = json.Unmarshal(sp.Value, &rec)
		}
		out = append(out, sweepOf(&state, &rec))
	}
	return out, nil
}

func sweepOf(st *controller.State, rec *sweepjob.Record) Sweep {
	s := Sweep{Namespace: st.Namespace, Name: st.Sweep, Status: string(st.Status), MaxTrials: st.MaxTrials,
		TrialsByState: map[string]int{}, Objective: rec.Metric, Maximize: rec.Maximize(), Updated: st.Updated}
	for _, ts := range []controller.TrialState{controller.TrialPending, controller.TrialRunning, controller.TrialStopping,
		controller.TrialCompleted, controller.TrialStopped, controller.TrialFailed} {
		s.TrialsByState[string(ts)] = 0
	}
	for k, n := range st.Counts() {
		s.TrialsByState[string(k)] = n
	}
	for _, t := range st.Trials {
		s.Progress += t.Seen
		if t.State.Terminal() {
			s.Progress++
		}
	}
	if best := st.Best(s.Maximize); best != nil && best.Value != nil {
		v := *best.Value
		s.Best, s.BestTrial = &v, best.ID
	}
	return s
}

// errNoData is Snapshot's answer before the first query answered.
var errNoData = errors.New("no answer from Nomad yet")

// Snapshot implements Source.
func (w *Watcher) Snapshot(ctx context.Context) (*Snapshot, error) {
	w.mu.Lock()
	nodes, allocs, jobs := w.nodes, w.allocs, w.jobs
	sweeps := append([]Sweep(nil), w.sweeps...)
	losses := make(map[string][]RankLoss, len(w.losses))
	for k, v := range w.losses {
		losses[k] = v
	}
	var warnings []string
	for name, e := range w.errs {
		warnings = append(warnings, fmt.Sprintf("watching the %s: %s", name, e))
	}
	if w.sweepEr != "" {
		warnings = append(warnings, w.sweepEr)
	}
	w.mu.Unlock()
	if nodes == nil && allocs == nil && jobs == nil && len(warnings) > 0 {
		return nil, fmt.Errorf("%w: %s", errNoData, strings.Join(warnings, "; "))
	}
	queues, qwarnings := w.queues.records()
	warnings = append(warnings, qwarnings...)
	in := Inputs{Nodes: nodes, Allocs: allocs, Jobs: jobs, Sweeps: sweeps, Losses: losses, NodeID: w.cfg.NodeID,
		Now: w.cfg.Now(), Queues: queues}
	in.Stats, in.StatsErrs = w.readStats(ctx, in.StatsNodes())
	s := Assemble(in)
	s.Warnings = append(warnings, s.Warnings...)
	return s, nil
}

// readStats reads the host stats of the given nodes, at most
// StatsParallel at once.
func (w *Watcher) readStats(ctx context.Context, nodeIDs []string) (map[string]*api.HostStats, map[string]string) {
	stats := map[string]*api.HostStats{}
	errs := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, w.cfg.StatsParallel)
	for _, id := range nodeIDs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				mu.Lock()
				errs[id] = ctx.Err().Error()
				mu.Unlock()
				return
			}
			defer func() { <-sem }()
			w.cfg.Requests("node-stats")
			hs, err := statsWithTimeout(ctx, w.cfg.Nomad, id, w.cfg.StatsTimeout)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[id] = err.Error()
				return
			}
			stats[id] = hs
		}()
	}
	wg.Wait()
	return stats, errs
}

// statsWithTimeout bounds a stats request (the API call takes no context:
// a slow node's answer is abandoned, not waited for).
func statsWithTimeout(ctx context.Context, nomad nomadapi.API, nodeID string, d time.Duration) (*api.HostStats, error) {
	type result struct {
		hs  *api.HostStats
		err error
	}
	ch := make(chan result, 1)
	go func() {
		hs, err := nomad.NodeStats(nodeID)
		ch <- result{hs, err}
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.hs, r.err
	case <-t.C:
		return nil, fmt.Errorf("no stats within %s", d)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Elected reports whether the allocation allocID is, among the running
// allocations of job (namespace ns), the one on the lowest node ID: the
// exporter of a system job that reports the cluster-wide series. Every
// exporter sees the same allocation list, so they agree without talking;
// while the list changes, two may report for a moment, or none.
func (w *Watcher) Elected(ns, job, allocID string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	var best *api.AllocationListStub
	for _, a := range w.allocs {
		if a == nil || a.Namespace != ns || a.JobID != job || a.ClientStatus != "running" || a.DesiredStatus != "run" {
			continue
		}
		if best == nil || a.NodeID < best.NodeID || a.NodeID == best.NodeID && a.ID < best.ID {
			best = a
		}
	}
	return best != nil && best.ID == allocID
}
