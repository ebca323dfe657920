package observe

import (
	"context"
	"strings"
	"sync"
	"time"

	consul "github.com/hashicorp/consul/api"

	internalconsul "github.com/gpujob/gpujob/internal/consul"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// queueMinGap paces the queue watches: the controller rewrites statuses
// every round, and a view needs no more than one read a second.
const queueMinGap = time.Second

// queueReadHint ends the log line and warning of a queue read that fails.
const queueReadHint = "no queue series meanwhile; with ACLs the token needs read on " + contract.QueuePrefix +
	"/ (gpujob acl policy consul-exporter)"

// statsName is the counters' key under the state tree.
var statsName = strings.TrimPrefix(contract.QueueStatsKey, contract.QueueStatePrefix+"/")

// queueState is what the queue watches last read.
type queueState struct {
	mu       sync.Mutex
	config   *queuekv.Record
	jobs     []QueuedJob
	statuses map[string]*admit.Status
	stats    *admit.Stats
	errs     map[string]string // by watch: why its last read failed
}

func (q *queueState) setErr(what, err string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err == "" {
		delete(q.errs, what)
	} else {
		q.errs[what] = err
	}
}

// records is a copy of the state to summarize, nil while the
// configuration is unknown or absent, and the warnings to show.
func (q *queueState) records() (*QueueRecords, []string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var warnings []string
	for _, what := range []string{"configuration", "jobs", "state", "stats"} {
		if e := q.errs[what]; e != "" {
			warnings = append(warnings, "reading the queues' "+what+" from Consul: "+e)
		}
	}
	if q.config == nil {
		return nil, warnings
	}
	return &QueueRecords{Config: q.config, Jobs: q.jobs, Statuses: q.statuses, Stats: q.stats}, warnings
}

// watchQueues follows the queues' tree with three blocking queries: the
// configuration, the queued jobs' records (which change when jobs are
// submitted or end) and the controller's state (statuses, counters),
// which changes every round. A read that fails (ACL-denied, Consul down)
// is logged, shows in the snapshots' warnings, and is retried; what was
// read before stands meanwhile.
func (w *Watcher) watchQueues(ctx context.Context) {
	prefix := strings.TrimSuffix(w.cfg.QueuePrefix, "/")
	c := w.cfg.Consul
	opts := func(what string) internalconsul.WatchOptions {
		return internalconsul.WatchOptions{WaitTime: w.cfg.WaitTime, MinGap: queueMinGap, Logf: w.cfg.Logf,
			What: "reading the queues' " + what + " from Consul", Note: " (" + queueReadHint + ")",
			OnFailing:   func(err error, _ int) { w.queues.setErr(what, err.Error()+" ("+queueReadHint+")") },
			OnRecovered: func(int) { w.queues.setErr(what, "") }}
	}
	counted := func(name string, q internalconsul.Query[consul.KVPairs]) internalconsul.Query[consul.KVPairs] {
		return func(o *consul.QueryOptions) (consul.KVPairs, *consul.QueryMeta, error) {
			w.cfg.Requests(name)
			return q(o)
		}
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		store := queuekv.New(c, prefix)
		_ = internalconsul.Watch(ctx, func(o *consul.QueryOptions) (*consul.KVPair, *consul.QueryMeta, error) {
			w.cfg.Requests("queue-config")
			return c.KV().Get(store.Key(), o)
		}, opts("configuration"), func(p *consul.KVPair, _ uint64) error {
			var r *queuekv.Record
			var bad string
			if p != nil {
				var err error
				if r, err = queuekv.Decode(p.Value); err != nil {
					bad = (&queuekv.InvalidError{Key: store.Key(), Err: err}).Error()
				}
			}
			w.queues.mu.Lock()
			w.queues.config = r
			w.queues.mu.Unlock()
			w.queues.setErr("configuration", bad)
			w.signal()
			return nil
		})
	}()
	go func() {
		defer wg.Done()
		jobsPrefix := prefix + "/jobs/"
		_ = internalconsul.Watch(ctx, counted("queue-jobs", internalconsul.PrefixQuery(c, jobsPrefix)), opts("jobs"),
			func(pairs consul.KVPairs, _ uint64) error {
				jobs := queuedJobs(pairs, jobsPrefix, w.cfg.Now())
				w.queues.mu.Lock()
				w.queues.jobs = jobs
				w.queues.mu.Unlock()
				w.signal()
				return nil
			})
	}()
	go func() {
		defer wg.Done()
		statePrefix := prefix + "/state/"
		_ = internalconsul.Watch(ctx, counted("queue-state", internalconsul.PrefixQuery(c, statePrefix)), opts("state"),
			func(pairs consul.KVPairs, _ uint64) error {
				statuses, stats, bad := queueStateOf(pairs, statePrefix)
				w.queues.mu.Lock()
				w.queues.statuses, w.queues.stats = statuses, stats
				w.queues.mu.Unlock()
				w.queues.setErr("stats", bad)
				w.signal()
				return nil
			})
	}()
	wg.Wait()
}

// queuedJobs decodes the records under jobsPrefix as strictly as the
// controller does; one it cannot read is counted as refused (the
// controller refuses it). Keys outside the layout are left out, as the
// controller leaves them.
func queuedJobs(pairs consul.KVPairs, jobsPrefix string, now time.Time) []QueuedJob {
	var out []QueuedJob
	for _, p := range pairs {
		ns, id, ok := strings.Cut(strings.TrimPrefix(p.Key, jobsPrefix), "/")
		if !ok || ns == "" || id == "" || strings.Contains(id, "/") {
			continue
		}
		// A record's submitted_at is the controller's to judge, not a
		// reader's: checked against a clock an hour ahead.
		rec, _, err := admit.DecodeJobRecord(p.Value, now.Add(time.Hour))
		j := QueuedJob{Namespace: ns, ID: id, RecordIndex: p.CreateIndex, Queue: admit.RecordQueue(rec, p.Value), Invalid: err != nil}
		if err == nil {
			j.GPUs, j.SubmittedAt = rec.Members*rec.PerMember.GPUs, rec.SubmittedAt
		}
		out = append(out, j)
	}
	return out
}

// queueStateOf decodes the controller's tree: the statuses (one that
// cannot be read is left out: the job counts as not answered yet) and the
// counters (fresh ones when none are stored; nil and why, when they
// cannot be read).
func queueStateOf(pairs consul.KVPairs, statePrefix string) (map[string]*admit.Status, *admit.Stats, string) {
	statuses := map[string]*admit.Status{}
	stats, bad := admit.NewStats(), ""
	for _, p := range pairs {
		rest := strings.TrimPrefix(p.Key, statePrefix)
		switch {
		case rest == statsName:
			s, err := admit.DecodeStats(p.Value)
			if err != nil {
				stats, bad = nil, p.Key+": "+err.Error()
				continue
			}
			stats = s
		case strings.HasPrefix(rest, "status/"):
			if st, err := admit.DecodeStatus(p.Value); err == nil {
				statuses[strings.TrimPrefix(rest, "status/")] = st
			}
		}
	}
	return statuses, stats, bad
}
