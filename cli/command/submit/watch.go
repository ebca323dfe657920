package submit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
)

// watcher follows a job through Nomad blocking queries on its allocations
// and prints each change once: placements, the driver's rendezvous and
// restart events, state changes, and the end.
type watcher struct {
	api     nomadapi.API
	out     io.Writer
	job     string
	workers int
	now     func() time.Time

	start  time.Time
	seen   map[string]*memberSeen // by allocation ID
	rounds map[int]map[string]bool
	told   map[int]bool // rounds announced complete
}

// memberSeen is what was already printed of one allocation.
type memberSeen struct {
	status string
	events int
}

// outcome is how the job ended.
type outcome struct {
	ok     bool
	reason string
}

var joinedRound = regexp.MustCompile(`^joined round (\d+) as node \d+ of (\d+) \((?:ranks? [\d-]+) of (\d+), master (\S+)\)`)

func (w *watcher) run(ctx context.Context) (outcome, error) {
	w.start = w.now()
	w.seen = map[string]*memberSeen{}
	w.rounds = map[int]map[string]bool{}
	w.told = map[int]bool{}
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
		sort.Slice(allocs, func(i, j int) bool { return allocs[i].CreateIndex < allocs[j].CreateIndex })
		for _, a := range allocs {
			w.report(a)
		}
		if done, o := w.finished(allocs); done {
			w.result(allocs, o)
			return o, nil
		}
	}
}

// report prints what is new about one allocation.
func (w *watcher) report(a *api.AllocationListStub) {
	s, ok := w.seen[a.ID]
	if !ok {
		s = &memberSeen{}
		w.seen[a.ID] = s
		w.printf("placed %s on node %s", a.Name, a.NodeName)
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
	msg := e.DisplayMessage
	if msg == "" {
		msg = e.Message
	}
	switch e.Type {
	case "Driver":
		w.printf("%s: %s", a.Name, msg)
		if m := joinedRound.FindStringSubmatch(msg); m != nil {
			round, _ := strconv.Atoi(m[1])
			nodes, _ := strconv.Atoi(m[2])
			if w.rounds[round] == nil {
				w.rounds[round] = map[string]bool{}
			}
			w.rounds[round][a.ID] = true
			if len(w.rounds[round]) == nodes && !w.told[round] {
				w.told[round] = true
				w.printf("rendezvous round %d complete: %d member(s), world size %s, master %s; training", round, nodes, m[3], m[4])
			}
		}
	case api.TaskDriverFailure, api.TaskSetupFailure, api.TaskFailedValidation, api.TaskKilled, api.TaskNotRestarting:
		w.printf("%s: %s: %s", a.Name, e.Type, msg)
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
			msg := e.DisplayMessage
			if msg == "" {
				msg = e.Message
			}
			return ": " + msg
		}
	}
	return ""
}

// result prints how the job ended and the training result if rank 0
// printed one.
func (w *watcher) result(allocs []*api.AllocationListStub, o outcome) {
	took := w.now().Sub(w.start).Round(100 * time.Millisecond)
	if !o.ok {
		w.printf("failed after %s: %s", took, o.reason)
	} else {
		w.printf("complete in %s", took)
	}
	for _, a := range allocs {
		r, ok := w.trainingResult(a.ID)
		if !ok {
			continue
		}
		fmt.Fprintf(w.out, "result: accuracy %.4f, F1 %.4f, wall time %.1fs, world size %d, restarts %d\n",
			r.Accuracy, r.F1, r.WallSeconds, r.WorldSize, r.RestartCount)
		break
	}
	fmt.Fprintf(w.out, "look further: gpujob status %s · gpujob logs %s · %s/ui/jobs/%s\n", w.job, w.job, w.api.Address(), w.job)
}

// trainingResult is the workload's last line.
type trainingResult struct {
	Accuracy     float64 `json:"accuracy"`
	F1           float64 `json:"f1"`
	WallSeconds  float64 `json:"wall_seconds"`
	WorldSize    int     `json:"world_size"`
	RestartCount int     `json:"restart_count"`
}

func (w *watcher) trainingResult(allocID string) (trainingResult, bool) {
	alloc, err := w.api.Allocation(allocID)
	if err != nil {
		return trainingResult{}, false
	}
	cancel := make(chan struct{})
	defer close(cancel)
	log, err := readAll(w.api.Logs(alloc, "train", "stdout", false, cancel))
	if err != nil {
		return trainingResult{}, false
	}
	i := strings.LastIndex(log, "gpujob-result: ")
	if i < 0 {
		return trainingResult{}, false
	}
	line := strings.SplitN(log[i+len("gpujob-result: "):], "\n", 2)[0]
	var r trainingResult
	return r, json.Unmarshal([]byte(line), &r) == nil
}

func (w *watcher) printf(format string, args ...any) {
	elapsed := w.now().Sub(w.start).Round(100 * time.Millisecond)
	fmt.Fprintf(w.out, "%7s  %s\n", elapsed, fmt.Sprintf(format, args...))
}
