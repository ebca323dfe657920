package nvml

import (
	"errors"
	"fmt"
	"strings"
)

// Inventory is one look at the machine's GPUs: what a fingerprint reports.
type Inventory struct {
	DriverVersion string
	// CUDADriverVersion is the highest CUDA version the driver supports, "12.4".
	CUDADriverVersion string
	Devices           []DeviceInfo
	// Unreachable lists the GPUs NVML enumerates but cannot identify or read.
	Unreachable []Unreachable
}

// Unreachable is a GPU NVML counts but cannot read, by NVML index.
type Unreachable struct {
	Index int
	Err   error
}

// DeviceInfo is the static description of one schedulable device: a whole GPU,
// or a MIG instance of a MIG-enabled GPU (whose parent is then not listed).
// Pointer fields are nil when the device does not support the query.
type DeviceInfo struct {
	// Handle queries the device again for stats and health.
	Handle Device
	// GPU is the physical GPU's handle (the parent of a MIG instance), the one
	// NVML delivers events for.
	GPU Device
	// Index is the NVML index of the physical GPU (the parent for MIG).
	Index      int
	UUID       string
	Name       string
	ParentUUID string // MIG instances only
	MIGProfile string // MIG instances only, e.g. "1g.10gb"
	// Minor is N of /dev/nvidiaN (the parent's for MIG); -1 when unknown.
	Minor             int
	PCIBusID          string
	MemoryMiB         *uint64
	BAR1MiB           *uint64
	PowerW            *uint32
	CoresClockMHz     *uint32
	MemoryClockMHz    *uint32
	PCIBandwidthMBps  *uint32
	DisplayState      *string
	PersistenceMode   *string
	ComputeCapability *string
	NUMANode          *int
	// NVLinkPeers are the PCI bus IDs at the far end of the active NVLinks.
	NVLinkPeers []string
	// Warnings are queries that failed for a reason other than "not supported";
	// the value is omitted and the plugin logs why.
	Warnings []string
}

// pcieLaneMBps is the usable per-lane bandwidth of each PCIe generation in
// MB/s, after line encoding.
var pcieLaneMBps = map[uint32]uint32{1: 250, 2: 500, 3: 985, 4: 1969, 5: 3938, 6: 7563}

// Collect reads the inventory. It fails only when NVML itself cannot answer
// (count or driver version); a GPU that cannot be read is listed in
// Unreachable so one bad card never hides the others.
func Collect(lib Library) (Inventory, error) {
	var inv Inventory
	var err error
	if inv.DriverVersion, err = lib.DriverVersion(); err != nil {
		return inv, fmt.Errorf("reading the driver version: %w", err)
	}
	if v, err := lib.CUDADriverVersion(); err == nil {
		inv.CUDADriverVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	n, err := lib.DeviceCount()
	if err != nil {
		return inv, fmt.Errorf("counting GPUs: %w", err)
	}
	for i := 0; i < n; i++ {
		devs, err := collectGPU(lib, i)
		if err != nil {
			inv.Unreachable = append(inv.Unreachable, Unreachable{Index: i, Err: err})
			continue
		}
		inv.Devices = append(inv.Devices, devs...)
	}
	return inv, nil
}

// collectGPU describes physical GPU i, or its MIG instances when MIG is on.
func collectGPU(lib Library, i int) ([]DeviceInfo, error) {
	h, err := lib.DeviceByIndex(i)
	if err != nil {
		return nil, err
	}
	gpu, err := describe(h, i)
	if err != nil {
		return nil, err
	}
	if on, err := h.MIGEnabled(); err != nil || !on {
		return []DeviceInfo{gpu}, nil
	}
	migs, err := h.MIGDevices()
	if err != nil {
		return nil, fmt.Errorf("listing MIG instances of %s: %w", gpu.UUID, err)
	}
	out := make([]DeviceInfo, 0, len(migs))
	for _, m := range migs {
		mi, err := describeMIG(m, gpu)
		if err != nil {
			return nil, fmt.Errorf("MIG instance of %s: %w", gpu.UUID, err)
		}
		out = append(out, mi)
	}
	return out, nil
}

// identify reads what a device cannot be listed without.
func identify(h Device) (uuid, name string, err error) {
	if uuid, err = h.UUID(); err != nil {
		return "", "", fmt.Errorf("reading UUID: %w", err)
	}
	if name, err = h.Name(); err != nil {
		return "", "", fmt.Errorf("reading the name of %s: %w", uuid, err)
	}
	return uuid, name, nil
}

func describe(h Device, index int) (DeviceInfo, error) {
	uuid, name, err := identify(h)
	if err != nil {
		return DeviceInfo{}, err
	}
	d := DeviceInfo{Handle: h, GPU: h, Index: index, UUID: uuid, Name: name, Minor: -1}
	opt := optional{d: &d}

	if v, ok := opt.int("minor number", h.MinorNumber); ok {
		d.Minor = v
	}
	d.PCIBusID, _ = opt.str("PCI bus ID", h.PCIBusID)
	if m, err := h.MemoryInfo(); opt.ok("memory", err) {
		d.MemoryMiB = ptr(m.Total >> 20)
	}
	if m, err := h.BAR1Info(); opt.ok("BAR1", err) {
		d.BAR1MiB = ptr(m.Total >> 20)
	}
	if mw, err := h.PowerLimit(); opt.ok("power limit", err) {
		d.PowerW = ptr(mw / 1000)
	}
	if sm, mem, err := h.MaxClocks(); opt.ok("max clocks", err) {
		d.CoresClockMHz, d.MemoryClockMHz = ptr(sm), ptr(mem)
	}
	if gen, width, err := h.MaxPCIeLink(); opt.ok("PCIe link", err) {
		if lane, known := pcieLaneMBps[gen]; known {
			d.PCIBandwidthMBps = ptr(lane * width)
		}
	}
	if on, err := h.DisplayMode(); opt.ok("display mode", err) {
		d.DisplayState = ptr(enabled(on))
	}
	if on, err := h.PersistenceMode(); opt.ok("persistence mode", err) {
		d.PersistenceMode = ptr(enabled(on))
	}
	if major, minor, err := h.ComputeCapability(); opt.ok("compute capability", err) {
		d.ComputeCapability = ptr(fmt.Sprintf("%d.%d", major, minor))
	}
	if v, ok := opt.int("NUMA node", h.NUMANode); ok && v >= 0 {
		d.NUMANode = ptr(v)
	}
	for link := 0; link < NVLinkMaxLinks; link++ {
		peer, err := h.NVLinkRemoteBusID(link)
		if err != nil {
			if errors.Is(err, ErrGPULost) {
				return DeviceInfo{}, err
			}
			continue // absent or inactive link
		}
		d.NVLinkPeers = append(d.NVLinkPeers, peer)
	}
	if opt.lost != nil {
		return DeviceInfo{}, fmt.Errorf("%s: %w", uuid, opt.lost)
	}
	return d, nil
}

// describeMIG describes a MIG instance. What MIG handles do not answer
// (clocks, power, PCIe) is the parent GPU's, since the instance shares them.
func describeMIG(h Device, parent DeviceInfo) (DeviceInfo, error) {
	uuid, name, err := identify(h)
	if err != nil {
		return DeviceInfo{}, err
	}
	d := parent
	d.Handle, d.UUID, d.Name, d.ParentUUID = h, uuid, name, parent.UUID
	d.MIGProfile = migProfile(name)
	d.NVLinkPeers = nil
	d.Warnings = nil
	d.MemoryMiB, d.BAR1MiB = nil, nil
	opt := optional{d: &d}
	if m, err := h.MemoryInfo(); opt.ok("memory", err) {
		d.MemoryMiB = ptr(m.Total >> 20)
	}
	if opt.lost != nil {
		return DeviceInfo{}, fmt.Errorf("%s: %w", uuid, opt.lost)
	}
	return d, nil
}

// migProfile extracts "1g.10gb" from "NVIDIA H100 80GB HBM3 MIG 1g.10gb".
func migProfile(name string) string {
	if i := strings.LastIndex(name, "MIG "); i >= 0 {
		return strings.TrimSpace(name[i+len("MIG "):])
	}
	return ""
}

// optional sorts the error of an optional query: not supported is silent,
// lost is fatal for the device, anything else becomes a warning.
type optional struct {
	d    *DeviceInfo
	lost error
}

func (o *optional) ok(what string, err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrNotSupported):
	case errors.Is(err, ErrGPULost):
		o.lost = err
	default:
		o.d.Warnings = append(o.d.Warnings, fmt.Sprintf("%s: %v", what, err))
	}
	return false
}

func (o *optional) int(what string, f func() (int, error)) (int, bool) {
	v, err := f()
	return v, o.ok(what, err)
}

func (o *optional) str(what string, f func() (string, error)) (string, bool) {
	v, err := f()
	return v, o.ok(what, err)
}

func enabled(on bool) string {
	if on {
		return "Enabled"
	}
	return "Disabled"
}

func ptr[T any](v T) *T { return &v }
