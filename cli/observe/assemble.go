package observe

import (
	"math"
	"sort"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/taskevent"
)

// Job kinds (Holder.Kind, Waiting.Kind), from the job meta gpujob renders.
const (
	KindTrain   = contract.KindTrain
	KindTrial   = "trial"
	KindService = contract.KindService
)

// Device attributes of the fingerprint: attrFake marks the device
// plugin's fake GPUs, attrMemory is the memory `gpu { min_memory }`
// constrains.
const (
	attrFake   = "fake"
	attrMemory = gpuMemoryAttr
)

// Inputs is what a snapshot is assembled from: the answers of the
// blocking queries and the stats read for it.
type Inputs struct {
	Nodes  []*api.NodeListStub
	Allocs []*api.AllocationListStub
	Jobs   []*api.JobListStub
	Sweeps []Sweep
	// Losses are the latest loss lines read, by "namespace/job".
	Losses map[string][]RankLoss
	// Stats by node ID, and why a node's could not be read.
	Stats     map[string]*api.HostStats
	StatsErrs map[string]string
	// NodeID limits the nodes to one ("" all).
	NodeID string
	Now    time.Time
	// Queues are the queues' records (nil: none read, or no queue
	// configuration).
	Queues *QueueRecords
}

// StatsNodes is the nodes whose stats a snapshot needs: the ready ones
// with GPUs (of NodeID's when set).
func (in Inputs) StatsNodes() []string {
	var out []string
	for _, n := range in.Nodes {
		if n == nil || n.Status != "ready" || (in.NodeID != "" && n.ID != in.NodeID) || !hasGPU(n) {
			continue
		}
		out = append(out, n.ID)
	}
	return out
}

func hasGPU(n *api.NodeListStub) bool {
	if n.NodeResources == nil {
		return false
	}
	for _, d := range n.NodeResources.Devices {
		if d != nil && d.Type == "gpu" && len(d.Instances) > 0 {
			return true
		}
	}
	return false
}

// JobKind is a job's gpujob kind from its meta: train, trial, service, or
// "" (not a gpujob job, or one of gpujob's helpers).
func JobKind(meta map[string]string) string {
	switch meta[contract.MetaKind] {
	case KindTrain:
		if meta[contract.MetaSweep] != "" {
			return KindTrial
		}
		return KindTrain
	case KindService:
		return KindService
	}
	return ""
}

// Assemble builds a snapshot; it makes no request.
func Assemble(in Inputs) *Snapshot {
	s := &Snapshot{Taken: in.Now, Nodes: []Node{}, Jobs: []TrainJob{}, Queue: []Waiting{}, Sweeps: in.Sweeps,
		Warnings: []string{}}
	if s.Sweeps == nil {
		s.Sweeps = []Sweep{}
	}
	kinds := map[string]string{}  // namespace/job → kind
	queues := map[string]string{} // namespace/job → queue, of gpujob's jobs
	for _, j := range in.Jobs {
		if j != nil {
			kinds[j.Namespace+"/"+j.ID] = JobKind(j.Meta)
			if kinds[j.Namespace+"/"+j.ID] != "" {
				queues[j.Namespace+"/"+j.ID] = j.Meta[contract.MetaQueue]
			}
		}
	}
	holders := DeviceHolders(in.Allocs, kinds)
	for _, h := range holders {
		h.Queue = queues[h.Namespace+"/"+h.JobID]
	}
	for _, n := range in.Nodes {
		if n == nil || (in.NodeID != "" && n.ID != in.NodeID) || !hasGPU(n) {
			continue
		}
		node := Node{ID: n.ID, Name: n.Name, Status: n.Status, GPUs: gpusOf(n, holders, in.Stats[n.ID])}
		switch {
		case n.Status != "ready":
			node.StatsErr = "node is " + n.Status
		case in.StatsErrs[n.ID] != "":
			node.StatsErr = in.StatsErrs[n.ID]
			s.Warnings = append(s.Warnings, "node "+n.Name+": "+node.StatsErr)
		}
		s.Nodes = append(s.Nodes, node)
	}
	sort.Slice(s.Nodes, func(i, j int) bool { return s.Nodes[i].Name < s.Nodes[j].Name })

	byJob := map[string][]*api.AllocationListStub{}
	for _, a := range in.Allocs {
		if a != nil {
			byJob[a.Namespace+"/"+a.JobID] = append(byJob[a.Namespace+"/"+a.JobID], a)
		}
	}
	for _, j := range in.Jobs {
		if j == nil {
			continue
		}
		kind := JobKind(j.Meta)
		if kind == KindTrain {
			s.Jobs = append(s.Jobs, trainJob(j, byJob[j.Namespace+"/"+j.ID], in.Losses[j.Namespace+"/"+j.ID]))
		}
		if kind != "" && j.Status != "dead" && !j.Stop && j.JobSummary != nil {
			queued := 0
			for _, tg := range j.JobSummary.Summary {
				queued += tg.Queued
			}
			if queued > 0 {
				s.Queue = append(s.Queue, Waiting{Namespace: j.Namespace, JobID: j.ID, Kind: kind, Queue: j.Meta[contract.MetaQueue],
					Queued: queued, Since: time.Unix(0, j.SubmitTime)})
			}
		}
	}
	sort.Slice(s.Jobs, func(i, k int) bool {
		if s.Jobs[i].Namespace != s.Jobs[k].Namespace {
			return s.Jobs[i].Namespace < s.Jobs[k].Namespace
		}
		return s.Jobs[i].ID < s.Jobs[k].ID
	})
	sort.Slice(s.Queue, func(i, k int) bool { return s.Queue[i].Since.Before(s.Queue[k].Since) })
	s.Queues = SummarizeQueues(in.Queues, in.Jobs, in.Allocs)
	sort.Slice(s.Sweeps, func(i, k int) bool {
		if s.Sweeps[i].Namespace != s.Sweeps[k].Namespace {
			return s.Sweeps[i].Namespace < s.Sweeps[k].Namespace
		}
		return s.Sweeps[i].Name < s.Sweeps[k].Name
	})
	return s
}

// gpusOf lists a node's GPUs by UUID, numbered from 0: DCGM's "gpu"
// label. (Nomad's API gives no PCI bus ID, nvidia-smi's order; UUIDs keep
// the number stable across restarts, which dashboards need more.)
func gpusOf(n *api.NodeListStub, holders map[string]*Holder, hs *api.HostStats) []GPU {
	var gpus []GPU
	for _, d := range n.NodeResources.Devices {
		if d == nil || d.Type != "gpu" {
			continue
		}
		fake := gpujobs.AttrBool(d.Attributes[attrFake])
		mem := gpujobs.AttrInt(d.Attributes[attrMemory])
		for _, inst := range d.Instances {
			if inst == nil {
				continue
			}
			g := GPU{UUID: inst.ID, Vendor: d.Vendor, Model: d.Name, Fake: fake, Healthy: inst.Healthy,
				HealthDescription: inst.HealthDescription, MemoryMiB: mem, Holder: holders[inst.ID]}
			if ds := gpujobs.InstanceStats(hs, d.Vendor, d.Name, inst.ID); ds != nil && ds.Stats != nil {
				applyStats(&g, ds.Stats.Attributes)
			}
			gpus = append(gpus, g)
		}
	}
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].UUID < gpus[j].UUID })
	for i := range gpus {
		gpus[i].Index = i
	}
	return gpus
}

func applyStats(g *GPU, at map[string]*api.StatValue) {
	g.Stats = at
	g.UtilPct, _ = gpujobs.StatNum(at[contract.StatGPUUtil])
	g.MemUtilPct, _ = gpujobs.StatNum(at[contract.StatMemUtil])
	g.MemUsedMiB, g.MemTotalMiB = gpujobs.StatNum(at[contract.StatMemory])
	g.TempC, _ = gpujobs.StatNum(at[contract.StatTemperature])
	g.PowerW, g.PowerLimitW = gpujobs.StatNum(at[contract.StatPower])
	g.SMClockMHz, _ = gpujobs.StatNum(at[contract.StatSMClock])
	g.ECCCorrected, _ = gpujobs.StatNum(at[contract.StatECCCorrected])
	g.ECCUncorrected, _ = gpujobs.StatNum(at[contract.StatECCUncorrected])
	g.XidErrors, _ = gpujobs.StatNum(at[contract.StatXidCount])
	g.LastXid, _ = gpujobs.StatNum(at[contract.StatXidLast])
}

// trainJob folds a training job's allocations into its members, round and
// restarts.
func trainJob(j *api.JobListStub, stubs []*api.AllocationListStub, losses []RankLoss) TrainJob {
	t := TrainJob{Namespace: j.Namespace, ID: j.ID, Status: j.Status, Workers: gpujobs.MetaInt(j.Meta, contract.MetaWorkers),
		MembersByState: map[string]int{"pending": 0, "running": 0, "complete": 0, "failed": 0, "lost": 0},
		Members:        []Member{}, MaxRestarts: -1, Losses: losses}
	if t.Losses == nil {
		t.Losses = []RankLoss{}
	}
	task := gpujobs.TaskName(&api.Job{Meta: j.Meta})
	// The list stub has no version: the newest allocation's stands for it.
	members := gpujobs.SelectMembers(stubs, math.MaxUint64, task)
	var roundStart, roundEnd time.Time
	for _, m := range members {
		t.MembersByState[m.State()]++
		p := m.Progress
		mem := Member{AllocID: m.Stub.ID, AllocName: m.Stub.Name, NodeID: m.Stub.NodeID, NodeName: m.Stub.NodeName,
			State: m.State(), Round: p.Round, FirstRank: p.FirstRank, LastRank: p.LastRank, GPUs: []string{}}
		if m.Stub.AllocatedResources != nil {
			if tr := m.Stub.AllocatedResources.Tasks[task]; tr != nil {
				for _, d := range tr.Devices {
					if d != nil && d.Type == "gpu" {
						mem.GPUs = append(mem.GPUs, d.DeviceIDs...)
					}
				}
			}
		}
		t.Members = append(t.Members, mem)
		t.Restarts = max(t.Restarts, p.Restarts)
		if p.MaxRestarts >= 0 {
			t.MaxRestarts = p.MaxRestarts
		}
		if p.Round > t.Round {
			t.Round, roundStart, roundEnd = p.Round, time.Time{}, time.Time{}
		}
	}
	// The latest round's gathering time: from the earliest moment one of
	// its members entered it (its task started, or the restart that led
	// to it) to the last join.
	for _, m := range members {
		ts := m.Stub.TaskStates[task]
		if ts == nil || t.Round == 0 {
			continue
		}
		var entered time.Time
		for _, e := range ts.Events {
			if e == nil {
				continue
			}
			if e.Type == api.TaskStarted {
				entered = time.Unix(0, e.Time)
				continue
			}
			d, ok := gpujobs.DriverEvent(e)
			if !ok {
				continue
			}
			switch {
			case d.Kind == taskevent.Restarting:
				entered = d.Time
			case d.Kind == taskevent.Joined && d.Round == t.Round:
				if !entered.IsZero() && (roundStart.IsZero() || entered.Before(roundStart)) {
					roundStart = entered
				}
				if d.Time.After(roundEnd) {
					roundEnd = d.Time
				}
			}
		}
	}
	if !roundStart.IsZero() && !roundEnd.Before(roundStart) {
		sec := roundEnd.Sub(roundStart).Seconds()
		t.RoundSeconds = &sec
	}
	return t
}
