package explain

import (
	"fmt"
	"strings"
	"testing"
)

func TestEmptyCapacity(t *testing.T) {
	gpuNode := func(name string, gpus int) Node {
		return Node{Name: name, Datacenter: "eu-west-1", CPU: 8000, MemoryMiB: 32768,
			Devices: []Device{{Model: "Tesla T4", MemoryMiB: 15360, Healthy: gpus}}}
	}
	cases := []struct {
		name  string
		ask   Ask
		nodes []Node
		want  int
		words string
	}{
		{"GPUs bound", Ask{GPUsPerWorker: 2, CPU: 1000, MemoryMiB: 2048}, []Node{gpuNode("a", 4), gpuNode("b", 3)}, 3,
			"2 ready node(s): a 2 (GPUs), b 1 (GPUs)"},
		{"nothing reported: no bound", Ask{CPU: 1000, MemoryMiB: 2048}, []Node{{Name: "a"}}, Unbounded,
			"1 ready node(s): a any number"},
		{"datacenter wildcard", Ask{GPUsPerWorker: 1, Datacenters: []string{"eu-*"}}, []Node{gpuNode("a", 4)}, 4, "a 4 (GPUs)"},
		{"datacenter elsewhere", Ask{GPUsPerWorker: 1, Datacenters: []string{"us-*", "dc1"}}, []Node{gpuNode("a", 4)}, 0,
			"a 0 (datacenter eu-west-1)"},
		{"pool all", Ask{GPUsPerWorker: 1, NodePool: "all"}, []Node{gpuNode("a", 1)}, 1, "a 1 (GPUs)"},
		{"model and memory", Ask{GPUsPerWorker: 1, Model: "Tesla T4", MinGPUMemoryMiB: 16384}, []Node{gpuNode("a", 4)}, 0,
			"a 0 (no matching GPU)"},
		{"unknown GPU memory is no reason to refuse", Ask{GPUsPerWorker: 1, MinGPUMemoryMiB: 16384},
			[]Node{{Name: "a", Devices: []Device{{Model: "x", Healthy: 2}}}}, 2, "a 2 (GPUs)"},
		{"huge node", Ask{CPU: 1, MemoryMiB: 10}, []Node{{Name: "a", CPU: 1 << 62, MemoryMiB: 1 << 62}, {Name: "b", CPU: 1 << 62}}, Unbounded, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := EmptyCapacity(c.ask, c.nodes)
			if got.Workers != c.want || !strings.Contains(got.String(), c.words) {
				t.Errorf("EmptyCapacity = %d (%s), want %d (%s)", got.Workers, got, c.want, c.words)
			}
		})
	}
}

func TestCapacityStringNamesAFewNodes(t *testing.T) {
	var nodes []Node
	for i := 0; i < 20; i++ {
		nodes = append(nodes, Node{Name: fmt.Sprintf("n%02d", i), CPU: int64(1000 * (i + 1))})
	}
	s := EmptyCapacity(Ask{CPU: 1000}, nodes).String()
	if !strings.HasPrefix(s, "20 ready node(s): n19 20 (CPU), n18 19 (CPU)") || !strings.HasSuffix(s, ", and 12 more") {
		t.Errorf("String() = %q", s)
	}
}
