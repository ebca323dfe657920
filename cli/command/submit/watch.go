package submit

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/taskevent"
)

// watcher follows a job through Nomad blocking queries on its allocations
// and prints each change once: placements, the driver's rendezvous and
// restart events, state changes, and the end.
type watcher struct {
	api     nomadapi.API
	out     io.Writer
	job     string
	workers int
	// since is the registration's index: allocations created before it
	// belong to an earlier run of a job of the same name.
	since uint64
	now   func() time.Time
	logs  bool // stream each member's stdout as well
	// requeued, when set, is asked once every allocation has ended: true
	// when the queue preempted the job (it is queued again), so its end
	// is not the job's outcome.
	requeued func() bool

	streams sync.WaitGroup
	stop    context.CancelFunc
	mu      sync.Mutex
	printed map[string]int // bytes of each member's stdout already shown

	start  time.Time
	seen   map[string]*memberSeen // by allocation ID
	rounds map[int]map[string]bool
	told   map[int]bool // rounds announced complete
}

// memberSeen is what was already printed of one allocation.
type memberSeen struct {
	status    string
	events    int
	following bool
}

// outcome is how the job ended.
type outcome struct {
	ok     bool
	reason string
	// requeued: the queue preempted the job; it waits to be admitted again.
	requeued bool
}

func (w *watcher) run(ctx context.Context) (outcome, error) {
	w.start = w.now()
	w.seen = map[string]*memberSeen{}
	w.rounds = map[int]map[string]bool{}
	w.told = map[int]bool{}
	w.printed = map[string]int{}
	streamCtx, stop := context.WithCancel(ctx)
	w.stop = stop
	defer func() {
		stop()
		w.streams.Wait()
	}()
	var index uint64
	for {
		q := (&api.QueryOptions{WaitIndex: index, WaitTime: 30 * time.Second}).WithContext(ctx)
		allocs, meta, err := w.api.JobAllocations(w.job, q)
		if ctx.Err() != nil {
			return outcome{}, ctx.Err()
		}
		if err != nil {
			return outcome{}, err
		}
		index = meta.LastIndex
		allocs = slices.DeleteFunc(allocs, func(a *api.AllocationListStub) bool { return a.CreateIndex < w.since })
		sort.Slice(allocs, func(i, j int) bool { return allocs[i].CreateIndex < allocs[j].CreateIndex })
		for _, a := range allocs {
			w.report(streamCtx, a)
		}
		if done, o := w.finished(allocs); done {
			// A follow stream lags its task: stop them and print what each
			// member wrote after the last line shown.
			stop()
			w.streams.Wait()
			w.catchUp(ctx)
			if w.requeued != nil && w.requeued() {
				return outcome{requeued: true}, nil
			}
			w.result(ctx, allocs, o)
			return o, nil
		}
	}
}

// report prints what is new about one allocation.
func (w *watcher) report(ctx context.Context, a *api.AllocationListStub) {
	s, ok := w.seen[a.ID]
	if !ok {
		s = &memberSeen{}
		w.seen[a.ID] = s
		w.printf("placed %s on node %s", a.Name, a.NodeName)
	}
	// Follow a member's log once its task runs: before that Nomad has no
	// log file to stream.
	if w.logs && !s.following && a.ClientStatus == api.AllocClientStatusRunning {
		s.following = true
		w.follow(ctx, a)
	}
	if ts := a.TaskStates["train"]; ts != nil {
		for _, e := range ts.Events[min(s.events, len(ts.Events)):] {
			w.event(a, e)
		}
		s.events = len(ts.Events)
	}
	if a.ClientStatus != s.status {
		s.status = a.ClientStatus
		if a.ClientStatus != api.AllocClientStatusPending {
			w.printf("%s %s", a.Name, a.ClientStatus)
		}
	}
}

// event prints the driver's milestones and task failures; Nomad's
// bookkeeping events (received, task setup) are left out.
func (w *watcher) event(a *api.AllocationListStub, e *api.TaskEvent) {
	msg := gpujobs.EventText(e)
	switch e.Type {
	case "Driver":
		w.printf("%s: %s", a.Name, msg)
		if p, ok := gpujobs.DriverEvent(e); ok && p.Kind == taskevent.Joined {
			if w.rounds[p.Round] == nil {
				w.rounds[p.Round] = map[string]bool{}
			}
			w.rounds[p.Round][a.ID] = true
			if len(w.rounds[p.Round]) == p.NNodes && !w.told[p.Round] {
				w.told[p.Round] = true
				w.printf("rendezvous round %d complete: %d member(s), world size %d, master %s; training",
					p.Round, p.NNodes, p.WorldSize, p.Master)
			}
		}
	case api.TaskDriverFailure, api.TaskSetupFailure, api.TaskFailedValidation, api.TaskKilled, api.TaskNotRestarting:
		w.printf("%s: %s: %s", a.Name, e.Type, msg)
	}
}

// follow prints a member's stdout, each line prefixed with its name, until
// ctx ends (the job ended or the user stopped watching).
func (w *watcher) follow(ctx context.Context, a *api.AllocationListStub) {
	w.streams.Add(1)
	go func() {
		defer w.streams.Done()
		alloc, err := w.api.Allocation(a.ID)
		if err != nil {
			return
		}
		w.stream(ctx, alloc, a.Name, true)
	}()
}

// stream prints a member's stdout lines from the first one not yet shown.
func (w *watcher) stream(ctx context.Context, alloc *api.Allocation, name string, follow bool) {
	w.mu.Lock()
	skip := w.printed[alloc.ID]
	w.mu.Unlock()
	seen := 0
	_ = gpujobs.StreamLines(ctx, w.api, alloc, "train", "stdout", follow, func(line string) {
		seen += len(line) + 1
		if seen <= skip {
			return
		}
		w.mu.Lock()
		w.printed[alloc.ID] = seen
		w.mu.Unlock()
		fmt.Fprintln(w.out, "["+name+"] "+line)
	})
}

// catchUp prints the rest of every followed member's stdout.
func (w *watcher) catchUp(ctx context.Context) {
	if !w.logs {
		return
	}
	ids := make([]string, 0, len(w.seen))
	for id := range w.seen {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		alloc, err := w.api.Allocation(id)
		if err != nil {
			continue
		}
		w.stream(ctx, alloc, alloc.Name, false)
	}
}

// finished reports whether no allocation is pending or running any more
// and every worker has one; the job failed if any ended failed or lost.
func (w *watcher) finished(allocs []*api.AllocationListStub) (bool, outcome) {
	terminal := 0
	o := outcome{ok: true}
	for _, a := range allocs {
		switch a.ClientStatus {
		case api.AllocClientStatusPending, api.AllocClientStatusRunning:
			return false, o
		case api.AllocClientStatusComplete:
		default:
			o.ok = false
			if o.reason == "" {
				o.reason = fmt.Sprintf("%s %s%s", a.Name, a.ClientStatus, lastDriverEvent(a))
			}
		}
		terminal++
	}
	if terminal < w.workers && o.ok {
		return false, o // some workers are still queued
	}
	return terminal > 0, o
}

func lastDriverEvent(a *api.AllocationListStub) string {
	ts := a.TaskStates["train"]
	if ts == nil {
		return ""
	}
	for i := len(ts.Events) - 1; i >= 0; i-- {
		if e := ts.Events[i]; e.Type == "Driver" || e.Type == api.TaskDriverFailure || e.Type == api.TaskFailedValidation {
			return ": " + gpujobs.EventText(e)
		}
	}
	return ""
}

// result prints how the job ended and the training result if rank 0
// printed one.
func (w *watcher) result(ctx context.Context, allocs []*api.AllocationListStub, o outcome) {
	took := w.now().Sub(w.start).Round(100 * time.Millisecond)
	if !o.ok {
		w.printf("failed after %s: %s", took, o.reason)
	} else {
		w.printf("complete in %s", took)
	}
	for _, a := range allocs {
		r, ok := w.trainingResult(ctx, a.ID)
		if !ok {
			continue
		}
		num := func(k string) float64 { v, _ := gpujobs.ResultNumber(r, k); return v }
		fmt.Fprintf(w.out, "result: accuracy %.4f, F1 %.4f, wall time %.1fs, world size %d, restarts %d\n",
			num("accuracy"), num("f1"), num("wall_seconds"), int(num("world_size")), int(num("restart_count")))
		break
	}
	fmt.Fprintf(w.out, "look further: gpujob status %s · gpujob logs %s · %s/ui/jobs/%s\n", w.job, w.job, w.api.Address(), w.job)
}

// trainingResult reads rank 0's result line from an allocation's log.
func (w *watcher) trainingResult(ctx context.Context, allocID string) (map[string]any, bool) {
	alloc, err := w.api.Allocation(allocID)
	if err != nil {
		return nil, false
	}
	log, err := gpujobs.ReadLog(ctx, w.api, alloc, "train", "stdout", 64<<10)
	if err != nil {
		return nil, false
	}
	_, result := gpujobs.Scan(log)
	return result, result != nil
}

func (w *watcher) printf(format string, args ...any) {
	elapsed := w.now().Sub(w.start).Round(100 * time.Millisecond)
	fmt.Fprintf(w.out, "%7s  %s\n", elapsed, fmt.Sprintf(format, args...))
}
