package gpu

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"time"

	"github.com/hashicorp/nomad/plugins/device"
	"github.com/hashicorp/nomad/plugins/shared/structs"

	"github.com/gpujob/gpujob/device/nvml"
)

// Attribute names. The first nine are nomad-device-nvidia's, with its units,
// so jobspecs written for it (${device.attr.memory} >= 8 GiB) schedule
// unchanged; the rest are ours.
const (
	AttrMemory            = "memory"
	AttrPower             = "power"
	AttrBAR1              = "bar1"
	AttrDriverVersion     = "driver_version"
	AttrCoresClock        = "cores_clock"
	AttrMemoryClock       = "memory_clock"
	AttrPCIBandwidth      = "pci_bandwidth"
	AttrDisplayState      = "display_state"
	AttrPersistenceMode   = "persistence_mode"
	AttrComputeCapability = "compute_capability"
	AttrCUDADriverVersion = "cuda_driver_version"
	AttrNUMANode          = "numa_node"
	AttrPCIBusID          = "pci_bus_id"
	AttrMIGProfile        = "mig_profile"
	AttrNVLinkLinks       = "nvlink_links"
	AttrNVLinkPeers       = "nvlink_peers"
	AttrFake              = "fake"
)

// fingerprintLoop reads the GPUs every period, and at once when the health
// watcher reports an event, and sends a fingerprint only when the devices or
// their health changed: Nomad re-evaluates the node on every one it gets.
func (p *Plugin) fingerprintLoop(ctx context.Context, lib nvml.Library, cfg settings, out chan<- *device.FingerprintResponse) {
	defer close(out)
	var watcher *healthWatcher
	if cfg.healthEnabled {
		watcher = p.startHealthWatcher(ctx, lib, cfg)
	}
	send := func(r *device.FingerprintResponse) bool {
		select {
		case out <- r:
			return true
		case <-ctx.Done():
			return false
		}
	}

	ticker := time.NewTicker(cfg.fingerprintPeriod)
	defer ticker.Stop()
	var poll <-chan time.Time // the fake's control file, checked between passes
	if _, ok := lib.(nvml.Controllable); ok && cfg.backend == BackendFake && cfg.fake.ControlFile != "" {
		t := time.NewTicker(controlPoll)
		defer t.Stop()
		poll = t.C
	}
	var last []*device.DeviceGroup
	sent := false
	for {
		groups, fresh, err := p.refresh(lib, cfg)
		switch {
		case err != nil && !sent:
			// Never fingerprinted: there is nothing to mark unhealthy, and the
			// error is the most useful thing an operator can read.
			send(device.NewFingerprintError(err))
			return
		case err != nil:
			// NVML failed after a fingerprint that listed no GPUs: there is
			// nothing to mark unhealthy; keep the last report and say why.
			p.logger.Error("reading GPUs through NVML failed", "error", err)
		case !sent || !reflect.DeepEqual(groups, last):
			if !send(device.NewFingerprint(groups...)) {
				return
			}
			last, sent = groups, true
		}
		if watcher != nil {
			watcher.register(fresh)
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				break wait
			case <-p.changed:
				break wait
			case <-poll:
				if p.applyControl(lib) {
					break wait
				}
			}
		}
	}
}

// refresh collects the inventory, updates p.devices with health, and returns
// the device groups plus the devices seen this time.
func (p *Plugin) refresh(lib nvml.Library, cfg settings) ([]*device.DeviceGroup, []nvml.DeviceInfo, error) {
	p.applyControl(lib)
	inv, err := nvml.Collect(lib)

	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if len(p.devices) == 0 {
			return nil, nil, fmt.Errorf("reading GPUs through NVML: %w", err)
		}
		// NVML stopped answering after it worked: every GPU we know is now
		// unfit, and saying so keeps jobs off them.
		p.logger.Error("NVML stopped answering; marking every GPU unhealthy", "error", err)
		for _, d := range p.devices {
			d.healthy, d.healthDesc = false, "NVML stopped answering: "+err.Error()
		}
		return p.groups(inv.DriverVersion, inv.CUDADriverVersion, cfg), nil, nil
	}

	devices := make(map[string]*deviceState, len(inv.Devices))
	byIndex := map[int][]string{}
	var fresh []nvml.DeviceInfo
	for _, info := range inv.Devices {
		if cfg.ignoredGPUs[info.UUID] || cfg.ignoredGPUs[info.ParentUUID] {
			continue
		}
		for _, w := range info.Warnings {
			p.logger.Warn("GPU query failed; attribute omitted", "uuid", info.UUID, "query", w)
		}
		reason := p.events[info.UUID]
		if reason == "" && cfg.healthEnabled {
			// ECC, page retirement and row remapping belong to the physical
			// GPU (MIG handles do not answer them): check the parent.
			reason = nvml.CheckHealth(info.GPU)
			if reason == "" {
				reason = nvml.FakeHealth(info.GPU) // the fake's control file
			}
		}
		devices[info.UUID] = &deviceState{info: info, healthy: reason == "", healthDesc: reason}
		byIndex[info.Index] = append(byIndex[info.Index], info.UUID)
		fresh = append(fresh, info)
	}
	// A GPU NVML still counts but can no longer read keeps its place, marked
	// unhealthy, so allocations holding it see why.
	for _, u := range inv.Unreachable {
		for _, id := range p.byIndex[u.Index] {
			old, ok := p.devices[id]
			if !ok {
				continue
			}
			devices[id] = &deviceState{info: old.info, healthDesc: "NVML cannot read the GPU: " + u.Err.Error()}
			byIndex[u.Index] = append(byIndex[u.Index], id)
		}
		if len(p.byIndex[u.Index]) == 0 {
			p.logger.Error("NVML cannot read a GPU it has never identified", "index", u.Index, "error", u.Err)
		}
	}
	p.devices, p.byIndex = devices, byIndex
	return p.groups(inv.DriverVersion, inv.CUDADriverVersion, cfg), fresh, nil
}

// groups builds Nomad's device groups from p.devices: one group per model
// (per MIG profile for MIG instances), sorted so two fingerprints of the same
// machine compare equal. Caller holds p.mu.
func (p *Plugin) groups(driver, cuda string, cfg settings) []*device.DeviceGroup {
	byName := map[string][]*deviceState{}
	for _, d := range p.devices {
		byName[d.info.Name] = append(byName[d.info.Name], d)
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)

	common := map[string]*structs.Attribute{}
	if driver != "" {
		common[AttrDriverVersion] = structs.NewStringAttribute(driver)
	}
	if cuda != "" {
		common[AttrCUDADriverVersion] = structs.NewStringAttribute(cuda)
	}
	if cfg.backend == BackendFake {
		common[AttrFake] = structs.NewBoolAttribute(true)
	}

	out := make([]*device.DeviceGroup, 0, len(names))
	for _, name := range names {
		members := byName[name]
		sort.Slice(members, func(i, j int) bool {
			a, b := members[i].info, members[j].info
			if a.Index != b.Index {
				return a.Index < b.Index
			}
			return a.UUID < b.UUID
		})
		g := &device.DeviceGroup{Vendor: vendor, Type: deviceType, Name: name}
		perDevice := make([]map[string]*structs.Attribute, len(members))
		for i, m := range members {
			g.Devices = append(g.Devices, &device.Device{
				ID:         m.info.UUID,
				Healthy:    m.healthy,
				HealthDesc: m.healthDesc,
				HwLocality: &device.DeviceLocality{PciBusID: m.info.PCIBusID},
			})
			perDevice[i] = attributes(m.info)
		}
		g.Attributes = shared(perDevice)
		for k, v := range common {
			g.Attributes[k] = v
		}
		out = append(out, g)
	}
	return out
}

// attributes turns one device's description into Nomad attributes; what the
// device does not support is absent.
func attributes(d nvml.DeviceInfo) map[string]*structs.Attribute {
	a := map[string]*structs.Attribute{}
	intAttr := func(name string, v *uint64, unit string) {
		if v != nil {
			a[name] = structs.NewIntAttribute(int64(*v), unit)
		}
	}
	u32 := func(v *uint32) *uint64 {
		if v == nil {
			return nil
		}
		w := uint64(*v)
		return &w
	}
	intAttr(AttrMemory, d.MemoryMiB, structs.UnitMiB)
	intAttr(AttrBAR1, d.BAR1MiB, structs.UnitMiB)
	intAttr(AttrPower, u32(d.PowerW), structs.UnitW)
	intAttr(AttrCoresClock, u32(d.CoresClockMHz), structs.UnitMHz)
	intAttr(AttrMemoryClock, u32(d.MemoryClockMHz), structs.UnitMHz)
	intAttr(AttrPCIBandwidth, u32(d.PCIBandwidthMBps), structs.UnitMBPerS)
	strAttr := func(name string, v *string) {
		if v != nil {
			a[name] = structs.NewStringAttribute(*v)
		}
	}
	strAttr(AttrDisplayState, d.DisplayState)
	strAttr(AttrPersistenceMode, d.PersistenceMode)
	strAttr(AttrComputeCapability, d.ComputeCapability)
	if d.NUMANode != nil {
		a[AttrNUMANode] = structs.NewIntAttribute(int64(*d.NUMANode), "")
	}
	if d.PCIBusID != "" {
		a[AttrPCIBusID] = structs.NewStringAttribute(d.PCIBusID)
	}
	if d.MIGProfile != "" {
		a[AttrMIGProfile] = structs.NewStringAttribute(d.MIGProfile)
	}
	if d.ParentUUID == "" {
		a[AttrNVLinkLinks] = structs.NewIntAttribute(int64(len(d.NVLinkPeers)), "")
		peers := append([]string(nil), d.NVLinkPeers...)
		sort.Strings(peers)
		a[AttrNVLinkPeers] = structs.NewIntAttribute(int64(len(dedupe(peers))), "")
	}
	return a
}

// shared keeps the attributes every device of a group has with the same
// value. Nomad attributes are per group, so a value that differs between
// devices (PCI bus ID, NUMA node of a two-socket machine) cannot be claimed
// for the group: it is left out rather than reported wrong for some devices.
// Per-device placement data stays in each device's HwLocality.
func shared(perDevice []map[string]*structs.Attribute) map[string]*structs.Attribute {
	out := map[string]*structs.Attribute{}
	if len(perDevice) == 0 {
		return out
	}
	for k, v := range perDevice[0] {
		same := true
		for _, other := range perDevice[1:] {
			if !reflect.DeepEqual(other[k], v) {
				same = false
				break
			}
		}
		if same {
			out[k] = v
		}
	}
	return out
}

func dedupe(sorted []string) []string {
	out := sorted[:0]
	for i, s := range sorted {
		if i == 0 || s != sorted[i-1] {
			out = append(out, s)
		}
	}
	return out
}
