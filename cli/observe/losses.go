package observe

import (
	"context"
	"sort"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs"
)

// lossTailBytes is how much of a member's log end is read for its loss
// lines (what `gpujob status` reads).
const lossTailBytes = 64 << 10

// readLosses reads, every LossInterval, the end of each running training
// member's stdout for its ranks' latest loss lines: one allocation read and
// one log read per member, never per GPU. The workloads print their loss
// to their log; nothing else records it.
func (w *Watcher) readLosses(ctx context.Context) {
	t := time.NewTicker(w.cfg.LossInterval)
	defer t.Stop()
	for {
		w.mu.Lock()
		allocs, jobs := w.allocs, w.jobs
		w.mu.Unlock()
		next := map[string][]RankLoss{}
		for _, j := range jobs {
			if j == nil || JobKind(j.Meta) != KindTrain || j.Status == "dead" {
				continue
			}
			key := j.Namespace + "/" + j.ID
			if l := w.jobLosses(ctx, j, allocs); len(l) > 0 {
				next[key] = l
			}
		}
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		w.losses = next
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (w *Watcher) jobLosses(ctx context.Context, j *api.JobListStub, allocs []*api.AllocationListStub) []RankLoss {
	task := gpujobs.TaskName(&api.Job{Meta: j.Meta})
	byRank := map[int]RankLoss{}
	for _, a := range allocs {
		if a == nil || a.Namespace != j.Namespace || a.JobID != j.ID || a.ClientStatus != "running" ||
			!gpujobs.Started(a.TaskStates, task) {
			continue
		}
		p := gpujobs.ParseEvents(taskEvents(a, task))
		w.cfg.Requests("allocation")
		full, err := w.cfg.Nomad.Allocation(a.ID)
		if err != nil {
			continue
		}
		w.cfg.Requests("logs")
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		text, _ := gpujobs.ReadLog(rctx, w.cfg.Nomad, full, task, "stdout", lossTailBytes)
		cancel()
		losses, _ := gpujobs.Scan(text)
		now := w.cfg.Now()
		for _, l := range losses {
			rank := l.Rank
			if rank < 0 && p.Joined && p.FirstRank == p.LastRank {
				rank = p.FirstRank // one process per member: its lines may not say
			}
			if rank < 0 {
				continue
			}
			if old, ok := byRank[rank]; !ok || l.Step >= old.Step {
				byRank[rank] = RankLoss{Rank: rank, Step: l.Step, Loss: l.Loss, Time: now}
			}
		}
	}
	out := make([]RankLoss, 0, len(byRank))
	for _, l := range byRank {
		out = append(out, l)
	}
	sort.Slice(out, func(i, k int) bool { return out[i].Rank < out[k].Rank })
	return out
}

func taskEvents(a *api.AllocationListStub, task string) []*api.TaskEvent {
	if ts := a.TaskStates[task]; ts != nil {
		return ts.Events
	}
	return nil
}
