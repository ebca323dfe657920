// Package nomadnode is how gpujob counts what a Nomad client node offers
// its work: whether the node can run the gpujob driver, its CPU and memory
// less what it reserves for itself, and its healthy GPUs. The CLI's views
// of the cluster (cli/observe: gpujob gpus, submit's capacity check, queue
// status) and the queue's admission controller (internal/queue/nomadseam)
// both count by these rules, so that what a user is shown and what the
// controller admits against agree.
package nomadnode

import (
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/contract"
)

// DriverProblem says why a node cannot run the gpujob driver, from its
// fingerprinted drivers; "" when it can, or when the node lists no drivers
// at all (then nothing is known to refuse on).
func DriverProblem(drivers map[string]*api.DriverInfo) string {
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

// Allocatable is the CPU (MHz) and memory (MiB) a node offers allocations:
// its resources less what it reserves, never below 0; both 0 when the
// stub carries no resources (listed without resources=true).
func Allocatable(s *api.NodeListStub) (cpuMHz, memoryMiB int64) {
	if s == nil || s.NodeResources == nil {
		return 0, 0
	}
	cpuMHz, memoryMiB = s.NodeResources.Cpu.CpuShares, s.NodeResources.Memory.MemoryMB
	if r := s.ReservedResources; r != nil {
		cpuMHz = max(cpuMHz-int64(min(r.Cpu.CpuShares, uint64(max(cpuMHz, 0)))), 0)
		memoryMiB = max(memoryMiB-int64(min(r.Memory.MemoryMB, uint64(max(memoryMiB, 0)))), 0)
	}
	return cpuMHz, memoryMiB
}

// IsGPU reports whether a device of this vendor and type is a GPU gpujob
// schedules (contract.GPUDevice): a node's device group or an allocation's
// device.
func IsGPU(vendor, typ string) bool { return vendor+"/"+typ == contract.GPUDevice }

// HealthyGPUs are the IDs of a device group's healthy instances when the
// group is GPUs (IsGPU), else nil.
func HealthyGPUs(g *api.NodeDeviceResource) []string {
	if g == nil || !IsGPU(g.Vendor, g.Type) {
		return nil
	}
	var ids []string
	for _, inst := range g.Instances {
		if inst != nil && inst.Healthy {
			ids = append(ids, inst.ID)
		}
	}
	return ids
}
