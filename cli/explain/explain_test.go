package explain

import (
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"
)

func TestPlacement(t *testing.T) {
	cases := []struct {
		name   string
		ask    Ask
		metric *api.AllocationMetric
		nodes  []Node
		want   []string
	}{
		{
			name:   "placed",
			ask:    Ask{Workers: 2, GPUsPerWorker: 1},
			metric: nil,
			want:   []string{""},
		},
		{
			name: "GPUs held by another job",
			ask:  Ask{Workers: 4, GPUsPerWorker: 1},
			metric: &api.AllocationMetric{NodesEvaluated: 1, NodesInPool: 1, NodesExhausted: 1, CoalescedFailures: 1,
				DimensionExhausted: map[string]int{"devices: no devices match request": 1}},
			nodes: []Node{{Name: "gpu-1", GPUs: 4, Free: 2, Holds: map[string]int{"bert-a": 2}}},
			want: []string{"needs 4 × 1 nvidia/gpu (4 GPUs)", "2 of 4 could be placed now, 2 cannot",
				"node gpu-1 has 2 of 4 free, 2 held by job bert-a"},
		},
		{
			name:   "too many GPUs per worker",
			ask:    Ask{Workers: 1, GPUsPerWorker: 8},
			metric: &api.AllocationMetric{NodesEvaluated: 2, NodesInPool: 2},
			nodes:  []Node{{Name: "a", GPUs: 4, Free: 4}, {Name: "b", GPUs: 2, Free: 2}},
			want:   []string{"none of them can be placed now", "no node holds 8 GPUs (the most is 4)"},
		},
		{
			name:   "no GPU nodes",
			ask:    Ask{Workers: 1, GPUsPerWorker: 1},
			metric: &api.AllocationMetric{NodesEvaluated: 1, NodesInPool: 1},
			nodes:  []Node{{Name: "cpu-1"}},
			want:   []string{"no node has a healthy nvidia/gpu device"},
		},
		{
			name:   "empty node pool",
			ask:    Ask{Workers: 1, GPUsPerWorker: 1, NodePool: "gpu"},
			metric: &api.AllocationMetric{},
			want:   []string{`no ready client node in node pool "gpu"`},
		},
		{
			name: "constraint and memory",
			ask:  Ask{Workers: 2, GPUsPerWorker: 0},
			metric: &api.AllocationMetric{NodesEvaluated: 3, NodesInPool: 3, CoalescedFailures: 1,
				ConstraintFiltered: map[string]int{"${attr.kernel.name} = windows": 2},
				DimensionExhausted: map[string]int{"memory": 1}},
			nodes: []Node{{Name: "a"}, {Name: "b"}, {Name: "c"}},
			want: []string{"needs 2 worker(s), no GPU", "2 node(s) ruled out by constraint ${attr.kernel.name} = windows",
				"1 node(s) out of memory"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Placement(c.ask, c.metric, c.nodes)
			for _, w := range c.want {
				if w == "" && got != "" || !strings.Contains(got, w) {
					t.Errorf("explanation %q lacks %q", got, w)
				}
			}
		})
	}
}
