package observe

import (
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/explain"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/nomadnode"
)

// ClusterGPUs reads every ready node's GPUs and who holds them, and what
// the node could give gpujob work when empty.
func ClusterGPUs(nomad nomadapi.API) ([]explain.Node, error) {
	stubs, _, err := nomad.Nodes(&api.QueryOptions{Params: map[string]string{"resources": "true"}})
	if err != nil {
		return nil, err
	}
	var nodes []explain.Node
	for _, s := range stubs {
		if s.Status != "ready" {
			continue
		}
		n := explain.Node{Name: s.Name, Pool: s.NodePool, Holds: map[string]int{}, Datacenter: s.Datacenter,
			Ineligible: s.SchedulingEligibility == api.NodeSchedulingIneligible, DriverProblem: nomadnode.DriverProblem(s.Drivers)}
		healthy := map[string]bool{}
		if s.NodeResources != nil {
			n.CPU, n.MemoryMiB = nomadnode.Allocatable(s)
			for _, g := range s.NodeResources.Devices {
				ids := nomadnode.HealthyGPUs(g)
				if len(ids) == 0 {
					continue
				}
				for _, id := range ids {
					healthy[id] = true
				}
				n.GPUs += len(ids)
				n.Devices = append(n.Devices, explain.Device{Model: g.Name, MemoryMiB: deviceMemoryMiB(g.Attributes[gpuMemoryAttr]), Healthy: len(ids)})
			}
		}
		n.Free = n.GPUs
		if n.GPUs > 0 {
			allocs, err := nomad.NodeAllocations(s.ID)
			if err != nil {
				return nil, err
			}
			for id, h := range DeviceHolders(AllocStubs(allocs), nil) {
				if healthy[id] {
					n.Free--
					n.Holds[h.JobID]++
				}
			}
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// gpuMemoryAttr is the device attribute `gpu { min_memory }` constrains.
const gpuMemoryAttr = "memory"

// deviceMemoryMiB reads a device group's memory attribute in MiB; 0 when it
// is missing or in a unit not known here.
func deviceMemoryMiB(a *api.Attribute) int64 {
	if a == nil || a.IntVal == nil {
		return 0
	}
	perMiB := map[string]float64{"": 1, "MiB": 1, "GiB": 1024, "TiB": 1 << 20, "MB": 1e6 / (1 << 20), "GB": 1e9 / (1 << 20)}
	f, ok := perMiB[a.Unit]
	if !ok {
		return 0
	}
	return int64(float64(*a.IntVal) * f)
}
