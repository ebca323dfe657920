package nomadnode

import (
	"testing"

	"github.com/hashicorp/nomad/api"
)

func TestDriverProblem(t *testing.T) {
	for _, tc := range []struct {
		drivers map[string]*api.DriverInfo
		want    string
	}{
		{nil, ""},
		{map[string]*api.DriverInfo{"gpujob": {Detected: true, Healthy: true}}, ""},
		{map[string]*api.DriverInfo{"raw_exec": {Detected: true, Healthy: true}}, "no gpujob driver"},
		{map[string]*api.DriverInfo{"gpujob": {Detected: false, Healthy: true}}, "no gpujob driver"},
		{map[string]*api.DriverInfo{"gpujob": {Detected: true}}, "gpujob driver unhealthy"},
		{map[string]*api.DriverInfo{"gpujob": {Detected: true, HealthDescription: "no consul"}}, "gpujob driver unhealthy: no consul"},
	} {
		if got := DriverProblem(tc.drivers); got != tc.want {
			t.Errorf("DriverProblem(%v) = %q, want %q", tc.drivers, got, tc.want)
		}
	}
}

func TestAllocatableAndGPUs(t *testing.T) {
	s := &api.NodeListStub{NodeResources: &api.NodeResources{Cpu: api.NodeCpuResources{CpuShares: 4000}, Memory: api.NodeMemoryResources{MemoryMB: 8192}},
		ReservedResources: &api.NodeReservedResources{Cpu: api.NodeReservedCpuResources{CpuShares: 500}, Memory: api.NodeReservedMemoryResources{MemoryMB: 10000}}}
	if cpu, mem := Allocatable(s); cpu != 3500 || mem != 0 {
		t.Errorf("Allocatable = %d MHz, %d MiB; want 3500, 0 (a reservation never makes it negative)", cpu, mem)
	}
	if cpu, mem := Allocatable(&api.NodeListStub{}); cpu != 0 || mem != 0 {
		t.Errorf("no resources: %d, %d", cpu, mem)
	}
	g := &api.NodeDeviceResource{Vendor: "nvidia", Type: "gpu", Instances: []*api.NodeDevice{{ID: "a", Healthy: true}, {ID: "b"}, {ID: "c", Healthy: true}}}
	if ids := HealthyGPUs(g); len(ids) != 2 || ids[0] != "a" || ids[1] != "c" {
		t.Errorf("HealthyGPUs = %v, want [a c]", ids)
	}
	g.Type = "fpga"
	if ids := HealthyGPUs(g); ids != nil {
		t.Errorf("an FPGA group's GPUs: %v", ids)
	}
}
