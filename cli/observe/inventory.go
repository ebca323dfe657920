package observe

import "github.com/hashicorp/nomad/api"

// HoldsDevices reports whether an allocation holds the devices Nomad
// reserved to it, from its client status: it does until its client reports
// it complete, failed or lost.
//
// This is the rule of Nomad v1.6.3's scheduler, which every view of who
// holds a GPU (`gpujob gpus`, `status`, `top`, the exporter, `submit`'s
// capacity check) must share so they agree with each other and with where
// Nomad will place the next job: scheduler.EvalContext.ProposedAllocs
// keeps every allocation of the node that is not ClientTerminalStatus, and
// structs.DeviceAccounter.AddAllocs counts the devices of each allocation
// that is not ClientTerminalStatus. An allocation whose desired status is
// stop or evict still holds its GPUs while its client runs it (its process
// still uses the GPU, and Nomad places nothing there until the client
// reports it stopped); one still pending holds them too, since Nomad
// reserved them when it placed it.
func HoldsDevices(clientStatus string) bool {
	switch clientStatus {
	case api.AllocClientStatusComplete, api.AllocClientStatusFailed, api.AllocClientStatusLost:
		return false
	}
	return true
}

// DeviceHolders maps each device ID (a GPU's UUID) to the allocation task
// holding it (HoldsDevices). kinds maps "namespace/job" to the job's
// gpujob kind (JobKind) for Holder.Kind; it may be nil.
func DeviceHolders(allocs []*api.AllocationListStub, kinds map[string]string) map[string]*Holder {
	out := map[string]*Holder{}
	for _, a := range allocs {
		if a == nil || a.AllocatedResources == nil || !HoldsDevices(a.ClientStatus) {
			continue
		}
		for task, tr := range a.AllocatedResources.Tasks {
			if tr == nil {
				continue
			}
			for _, d := range tr.Devices {
				if d == nil {
					continue
				}
				for _, id := range d.DeviceIDs {
					out[id] = &Holder{Namespace: a.Namespace, JobID: a.JobID, AllocID: a.ID, AllocName: a.Name,
						Task: task, Kind: kinds[a.Namespace+"/"+a.JobID]}
				}
			}
		}
	}
	return out
}

// AllocStub is the part of a full allocation DeviceHolders reads, for
// callers that listed a node's allocations in full.
func AllocStub(a *api.Allocation) *api.AllocationListStub {
	if a == nil {
		return nil
	}
	return &api.AllocationListStub{ID: a.ID, Name: a.Name, Namespace: a.Namespace, JobID: a.JobID,
		NodeID: a.NodeID, ClientStatus: a.ClientStatus, DesiredStatus: a.DesiredStatus,
		AllocatedResources: a.AllocatedResources}
}

// AllocStubs is AllocStub of each allocation.
func AllocStubs(allocs []*api.Allocation) []*api.AllocationListStub {
	out := make([]*api.AllocationListStub, 0, len(allocs))
	for _, a := range allocs {
		if a != nil {
			out = append(out, AllocStub(a))
		}
	}
	return out
}
