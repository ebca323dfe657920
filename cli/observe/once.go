package observe

import (
	"context"
	"sort"

	"github.com/hashicorp/nomad/api"
)

// Once reads the cluster once and assembles a snapshot, for a command that
// prints one view and exits (`gpujob gpus`): the same queries a Watcher
// keeps current (nodes, allocations and jobs, each one list request), then
// the GPU stats, one request per ready node with GPUs (none with
// cfg.NoStats). A failed list is an error; a node whose stats cannot be
// read is a warning, as in a Watcher's snapshots. cfg's Consul and
// LossInterval are not used: no sweeps and no losses are read.
func Once(ctx context.Context, cfg Config) (*Snapshot, error) {
	w := NewWatcher(cfg)
	w.cfg.Requests("nodes")
	nodes, _, err := w.cfg.Nomad.Nodes((&api.QueryOptions{Params: map[string]string{"resources": "true"}}).WithContext(ctx))
	if err != nil {
		return nil, err
	}
	w.cfg.Requests("allocations")
	allocs, _, err := w.cfg.Nomad.Allocations((&api.QueryOptions{Namespace: "*",
		Params: map[string]string{"resources": "true", "task_states": "true"}}).WithContext(ctx))
	if err != nil {
		return nil, err // nomadapi says what it was listing
	}
	w.cfg.Requests("jobs")
	jobs, _, err := w.cfg.Nomad.Jobs((&api.QueryOptions{Namespace: "*", Params: map[string]string{"meta": "true"}}).WithContext(ctx))
	if err != nil {
		return nil, err
	}
	in := Inputs{Nodes: nodes, Allocs: allocs, Jobs: jobs, Sweeps: []Sweep{}, NodeID: cfg.NodeID, Now: w.cfg.Now()}
	if !cfg.NoStats {
		in.Stats, in.StatsErrs = w.readStats(ctx, in.StatsNodes())
	}
	return Assemble(in), nil
}

// ModelTotal counts a GPU model's devices across the snapshot's nodes.
type ModelTotal struct {
	Model   string `json:"model"`
	Count   int    `json:"count"`
	Healthy int    `json:"healthy"`
	// InUse is how many are held (GPU.Holder: the HoldsDevices rule).
	InUse int `json:"in_use"`
	// Free is how many are healthy and held by none: what Nomad can place
	// on.
	Free int `json:"free"`
	// Fake counts the device plugin's fake GPUs.
	Fake int `json:"fake"`
}

// Totals counts the snapshot's GPUs by model, sorted by model name.
func (s *Snapshot) Totals() []ModelTotal {
	byModel := map[string]*ModelTotal{}
	for _, n := range s.Nodes {
		for _, g := range n.GPUs {
			t, ok := byModel[g.Model]
			if !ok {
				t = &ModelTotal{Model: g.Model}
				byModel[g.Model] = t
			}
			t.Count++
			if g.Healthy {
				t.Healthy++
			}
			if g.Holder != nil {
				t.InUse++
			} else if g.Healthy {
				t.Free++
			}
			if g.Fake {
				t.Fake++
			}
		}
	}
	out := make([]ModelTotal, 0, len(byModel))
	for _, t := range byModel {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}
