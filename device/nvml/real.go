package nvml

import (
	"fmt"
	"strings"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// New returns the Library backed by the real NVML. Nothing is loaded until
// Init, so constructing it on a machine without a driver is harmless.
func New() Library { return &realLibrary{lib: gonvml.New()} }

type realLibrary struct{ lib gonvml.Interface }

// wrap turns an NVML return code into a Go error, mapping the codes callers
// branch on to this package's sentinels and naming the call otherwise.
func wrap(call string, r gonvml.Return) error {
	switch r {
	case gonvml.SUCCESS:
		return nil
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND:
		return ErrNotSupported
	case gonvml.ERROR_GPU_IS_LOST:
		return ErrGPULost
	case gonvml.ERROR_TIMEOUT:
		return ErrTimeout
	case gonvml.ERROR_LIBRARY_NOT_FOUND:
		return ErrLibraryNotFound
	case gonvml.ERROR_DRIVER_NOT_LOADED:
		return ErrDriverNotLoaded
	}
	return fmt.Errorf("nvml %s: %s", call, r.Error())
}

func (l *realLibrary) Init() (err error) {
	// go-nvml panics when the shared library loads but lacks a symbol it
	// binds eagerly (very old drivers); report it instead of crashing the
	// Nomad client that hosts the plugin.
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("loading NVML: %v (driver too old for go-nvml?)", p)
		}
	}()
	return wrap("Init", l.lib.Init())
}

func (l *realLibrary) Shutdown() error { return wrap("Shutdown", l.lib.Shutdown()) }

func (l *realLibrary) DriverVersion() (string, error) {
	v, r := l.lib.SystemGetDriverVersion()
	return v, wrap("SystemGetDriverVersion", r)
}

func (l *realLibrary) CUDADriverVersion() (int, error) {
	v, r := l.lib.SystemGetCudaDriverVersion()
	return v, wrap("SystemGetCudaDriverVersion", r)
}

func (l *realLibrary) DeviceCount() (int, error) {
	n, r := l.lib.DeviceGetCount()
	return n, wrap("DeviceGetCount", r)
}

func (l *realLibrary) DeviceByIndex(i int) (Device, error) {
	d, r := l.lib.DeviceGetHandleByIndex(i)
	if err := wrap("DeviceGetHandleByIndex", r); err != nil {
		return nil, err
	}
	return realDevice{d: d}, nil
}

func (l *realLibrary) NewEventSet() (EventSet, error) {
	s, r := l.lib.EventSetCreate()
	if err := wrap("EventSetCreate", r); err != nil {
		return nil, err
	}
	return realEventSet{s: s}, nil
}

type realDevice struct{ d gonvml.Device }

func (d realDevice) UUID() (string, error) {
	v, r := d.d.GetUUID()
	return v, wrap("DeviceGetUUID", r)
}

func (d realDevice) Name() (string, error) {
	v, r := d.d.GetName()
	return v, wrap("DeviceGetName", r)
}

func (d realDevice) MinorNumber() (int, error) {
	v, r := d.d.GetMinorNumber()
	return v, wrap("DeviceGetMinorNumber", r)
}

func (d realDevice) PCIBusID() (string, error) {
	p, r := d.d.GetPciInfo()
	if err := wrap("DeviceGetPciInfo", r); err != nil {
		return "", err
	}
	return busID(p), nil
}

// busID converts NVML's NUL-terminated C string to Go.
func busID(p gonvml.PciInfo) string {
	var b strings.Builder
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}

func (d realDevice) MemoryInfo() (Memory, error) {
	m, r := d.d.GetMemoryInfo()
	return Memory{Total: m.Total, Used: m.Used}, wrap("DeviceGetMemoryInfo", r)
}

func (d realDevice) BAR1Info() (Memory, error) {
	m, r := d.d.GetBAR1MemoryInfo()
	return Memory{Total: m.Bar1Total, Used: m.Bar1Used}, wrap("DeviceGetBAR1MemoryInfo", r)
}

func (d realDevice) PowerLimit() (uint32, error) {
	v, r := d.d.GetPowerManagementLimit()
	return v, wrap("DeviceGetPowerManagementLimit", r)
}

func (d realDevice) PowerUsage() (uint32, error) {
	v, r := d.d.GetPowerUsage()
	return v, wrap("DeviceGetPowerUsage", r)
}

func (d realDevice) MaxClocks() (uint32, uint32, error) {
	sm, r := d.d.GetMaxClockInfo(gonvml.CLOCK_SM)
	if err := wrap("DeviceGetMaxClockInfo(SM)", r); err != nil {
		return 0, 0, err
	}
	mem, r := d.d.GetMaxClockInfo(gonvml.CLOCK_MEM)
	return sm, mem, wrap("DeviceGetMaxClockInfo(MEM)", r)
}

func (d realDevice) SMClock() (uint32, error) {
	v, r := d.d.GetClockInfo(gonvml.CLOCK_SM)
	return v, wrap("DeviceGetClockInfo(SM)", r)
}

func (d realDevice) MaxPCIeLink() (uint32, uint32, error) {
	gen, r := d.d.GetMaxPcieLinkGeneration()
	if err := wrap("DeviceGetMaxPcieLinkGeneration", r); err != nil {
		return 0, 0, err
	}
	width, r := d.d.GetMaxPcieLinkWidth()
	return uint32(gen), uint32(width), wrap("DeviceGetMaxPcieLinkWidth", r)
}

func (d realDevice) DisplayMode() (bool, error) {
	v, r := d.d.GetDisplayMode()
	return v == gonvml.FEATURE_ENABLED, wrap("DeviceGetDisplayMode", r)
}

func (d realDevice) PersistenceMode() (bool, error) {
	v, r := d.d.GetPersistenceMode()
	return v == gonvml.FEATURE_ENABLED, wrap("DeviceGetPersistenceMode", r)
}

func (d realDevice) ComputeCapability() (int, int, error) {
	major, minor, r := d.d.GetCudaComputeCapability()
	return major, minor, wrap("DeviceGetCudaComputeCapability", r)
}

func (d realDevice) NUMANode() (int, error) {
	v, r := d.d.GetNumaNodeId()
	return v, wrap("DeviceGetNumaNodeId", r)
}

func (d realDevice) Utilization() (Utilization, error) {
	u, r := d.d.GetUtilizationRates()
	return Utilization{GPU: u.Gpu, Memory: u.Memory}, wrap("DeviceGetUtilizationRates", r)
}

func (d realDevice) EncoderUtilization() (uint32, error) {
	v, _, r := d.d.GetEncoderUtilization()
	return v, wrap("DeviceGetEncoderUtilization", r)
}

func (d realDevice) DecoderUtilization() (uint32, error) {
	v, _, r := d.d.GetDecoderUtilization()
	return v, wrap("DeviceGetDecoderUtilization", r)
}

func (d realDevice) Temperature() (uint32, error) {
	v, r := d.d.GetTemperature(gonvml.TEMPERATURE_GPU)
	return v, wrap("DeviceGetTemperature", r)
}

func (d realDevice) ECCErrors(uncorrected bool) (uint64, error) {
	kind := gonvml.MEMORY_ERROR_TYPE_CORRECTED
	if uncorrected {
		kind = gonvml.MEMORY_ERROR_TYPE_UNCORRECTED
	}
	v, r := d.d.GetTotalEccErrors(kind, gonvml.VOLATILE_ECC)
	return v, wrap("DeviceGetTotalEccErrors", r)
}

func (d realDevice) RetiredPagesPending() (bool, error) {
	v, r := d.d.GetRetiredPagesPendingStatus()
	return v == gonvml.FEATURE_ENABLED, wrap("DeviceGetRetiredPagesPendingStatus", r)
}

func (d realDevice) RemappedRows() (RemappedRows, error) {
	corr, unc, pending, failed, r := d.d.GetRemappedRows()
	return RemappedRows{Correctable: corr, Uncorrectable: unc, Pending: pending, Failed: failed},
		wrap("DeviceGetRemappedRows", r)
}

func (d realDevice) ThrottleReasons() (uint64, error) {
	v, r := d.d.GetCurrentClocksEventReasons()
	if r == gonvml.ERROR_FUNCTION_NOT_FOUND {
		// Drivers before r535 only have the older name.
		v, r = d.d.GetCurrentClocksThrottleReasons()
	}
	return v, wrap("DeviceGetCurrentClocksEventReasons", r)
}

func (d realDevice) MIGEnabled() (bool, error) {
	current, _, r := d.d.GetMigMode()
	return current == gonvml.DEVICE_MIG_ENABLE, wrap("DeviceGetMigMode", r)
}

func (d realDevice) MIGDevices() ([]Device, error) {
	n, r := d.d.GetMaxMigDeviceCount()
	if err := wrap("DeviceGetMaxMigDeviceCount", r); err != nil {
		return nil, err
	}
	var out []Device
	for i := 0; i < n; i++ {
		m, r := d.d.GetMigDeviceHandleByIndex(i)
		if r == gonvml.ERROR_NOT_FOUND {
			continue // an unused MIG slot
		}
		if err := wrap("DeviceGetMigDeviceHandleByIndex", r); err != nil {
			return nil, err
		}
		out = append(out, realDevice{d: m})
	}
	return out, nil
}

func (d realDevice) NVLinkRemoteBusID(link int) (string, error) {
	state, r := d.d.GetNvLinkState(link)
	if err := wrap("DeviceGetNvLinkState", r); err != nil {
		return "", err
	}
	if state != gonvml.FEATURE_ENABLED {
		return "", ErrNotSupported
	}
	p, r := d.d.GetNvLinkRemotePciInfo(link)
	if err := wrap("DeviceGetNvLinkRemotePciInfo", r); err != nil {
		return "", err
	}
	return busID(p), nil
}

type realEventSet struct{ s gonvml.EventSet }

func (s realEventSet) Register(d Device, types uint64) error {
	rd, ok := d.(realDevice)
	if !ok {
		return fmt.Errorf("nvml: cannot register a %T with a real event set", d)
	}
	// NVML refuses the whole request if one type is unsupported (no ECC
	// events on GeForce cards), which would lose the Xid events too: ask
	// only for what the card can deliver.
	supported, r := rd.d.GetSupportedEventTypes()
	if err := wrap("DeviceGetSupportedEventTypes", r); err != nil {
		return err
	}
	if types&supported == 0 {
		return ErrNotSupported
	}
	return wrap("DeviceRegisterEvents", rd.d.RegisterEvents(types&supported, s.s))
}

func (s realEventSet) Wait(timeout time.Duration) (Event, error) {
	e, r := s.s.Wait(uint32(timeout / time.Millisecond))
	if err := wrap("EventSetWait", r); err != nil {
		return Event{}, err
	}
	ev := Event{Type: e.EventType, Data: e.EventData}
	if e.Device != nil {
		ev.UUID, _ = e.Device.GetUUID()
	}
	return ev, nil
}

func (s realEventSet) Free() error { return wrap("EventSetFree", s.s.Free()) }
