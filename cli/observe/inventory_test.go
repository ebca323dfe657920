package observe

import (
	"testing"

	"github.com/hashicorp/nomad/api"
)

// The holder rule is Nomad v1.6.3's (see HoldsDevices): only the client
// status frees a GPU, whatever the desired status.
func TestHoldsDevices(t *testing.T) {
	for _, tc := range []struct {
		desired, client string
		holds           bool
	}{
		{"run", "pending", true},
		{"run", "running", true},
		{"run", "complete", false},
		{"run", "failed", false},
		{"run", "lost", false},
		{"run", "unknown", true}, // a disconnected client may still run it
		{"stop", "running", true},
		{"stop", "pending", true},
		{"stop", "complete", false},
		{"evict", "running", true},
		{"evict", "failed", false},
	} {
		a := &api.AllocationListStub{ID: "a1", Name: "j.g[0]", Namespace: "ns", JobID: "j",
			DesiredStatus: tc.desired, ClientStatus: tc.client,
			AllocatedResources: &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{
				"train": {Devices: []*api.AllocatedDeviceResource{{Vendor: "nvidia", Type: "gpu", Name: "H100", DeviceIDs: []string{"GPU-1", "GPU-2"}}}},
			}}}
		if got := HoldsDevices(tc.client); got != tc.holds {
			t.Errorf("HoldsDevices(%q) (desired %q) = %v, want %v", tc.client, tc.desired, got, tc.holds)
		}
		holders := DeviceHolders([]*api.AllocationListStub{a}, map[string]string{"ns/j": KindTrain})
		if !tc.holds {
			if len(holders) != 0 {
				t.Errorf("desired %s, client %s: holders %v, want none", tc.desired, tc.client, holders)
			}
			continue
		}
		want := Holder{Namespace: "ns", JobID: "j", AllocID: "a1", AllocName: "j.g[0]", Task: "train", Kind: KindTrain}
		for _, id := range []string{"GPU-1", "GPU-2"} {
			if h := holders[id]; h == nil || *h != want {
				t.Errorf("desired %s, client %s: holder of %s = %+v, want %+v", tc.desired, tc.client, id, h, want)
			}
		}
		// A full allocation (what `gpujob gpus` lists) gives the same holders.
		full := &api.Allocation{ID: a.ID, Name: a.Name, Namespace: a.Namespace, JobID: a.JobID,
			DesiredStatus: a.DesiredStatus, ClientStatus: a.ClientStatus, AllocatedResources: a.AllocatedResources}
		if h := DeviceHolders(AllocStubs([]*api.Allocation{full, nil}), map[string]string{"ns/j": KindTrain})["GPU-1"]; h == nil || *h != want {
			t.Errorf("desired %s, client %s: full allocation's holder %+v, want %+v", tc.desired, tc.client, h, want)
		}
	}
}

// An allocation without resources, or a task without devices, holds nothing.
func TestDeviceHoldersWithoutDevices(t *testing.T) {
	allocs := []*api.AllocationListStub{
		nil,
		{ID: "a", ClientStatus: "running"},
		{ID: "b", ClientStatus: "running", AllocatedResources: &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{"t": nil, "u": {}}}},
	}
	if h := DeviceHolders(allocs, nil); len(h) != 0 {
		t.Errorf("holders %v, want none", h)
	}
}
