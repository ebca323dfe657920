package observe

import (
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/explain"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/contract"
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
			Ineligible: s.SchedulingEligibility == api.NodeSchedulingIneligible, DriverProblem: driverProblem(s.Drivers)}
		healthy := map[string]bool{}
		if s.NodeResources != nil {
			n.CPU, n.MemoryMiB = s.NodeResources.Cpu.CpuShares, s.NodeResources.Memory.MemoryMB
			if r := s.ReservedResources; r != nil {
				n.CPU = max(n.CPU-int64(min(r.Cpu.CpuShares, uint64(n.CPU))), 0)
				n.MemoryMiB = max(n.MemoryMiB-int64(min(r.Memory.MemoryMB, uint64(n.MemoryMiB))), 0)
			}
			for _, g := range s.NodeResources.Devices {
				if g.Vendor+"/"+g.Type != contract.GPUDevice {
					continue
				}
				d := explain.Device{Model: g.Name, MemoryMiB: deviceMemoryMiB(g.Attributes[gpuMemoryAttr])}
				for _, inst := range g.Instances {
					if inst.Healthy {
						healthy[inst.ID] = true
						n.GPUs++
						d.Healthy++
					}
				}
				if d.Healthy > 0 {
					n.Devices = append(n.Devices, d)
				}
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

// driverProblem says why a node cannot run the gpujob driver, from its
// fingerprinted drivers; "" when it can, or when the node lists no drivers
// at all (then nothing is known to refuse on).
func driverProblem(drivers map[string]*api.DriverInfo) string {
	if drivers == nil {
		return ""
	}
	d := drivers[contract.DriverName]
	switch {
	case d == nil || !d.Detected:
		return "no gpujob driver"
	case !d.Healthy:
		if d.HealthDescription != "" {
			return "gpujob driver unhealthy: " + d.HealthDescription
		}
		return "gpujob driver unhealthy"
	}
	return ""
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
