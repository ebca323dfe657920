package nvml

import (
	"crypto/sha256"
	"fmt"
	"sync"
	"time"
)

// FakeSpec describes the GPUs of the "fake" backend.
type FakeSpec struct {
	Count     int
	Model     string
	MemoryMiB uint64
	// Seed makes the UUIDs differ between fake nodes on one machine; the same
	// seed always yields the same UUIDs, so allocations survive restarts.
	Seed string
	// ControlFile, when set, is a JSON file (see FakeControl) that drives the
	// GPUs' utilisation, memory, temperature, power, clock and health while
	// they run; ApplyControl reads it.
	ControlFile string
}

// FakeLibrary is an in-memory Library. It backs the explicit "fake" backend
// (machines without a GPU) and is the mock the unit tests drive: every field of
// every FakeDevice can be changed while the plugin runs, through Update.
type FakeLibrary struct {
	mu            sync.Mutex
	devices       []*FakeDevice
	driverVersion string
	cudaVersion   int
	initErr       error
	events        chan Event
	// control follows FakeSpec.ControlFile; nil without one.
	control *fakeControl
}

// NewFake returns a FakeLibrary holding spec.Count identical GPUs.
func NewFake(spec FakeSpec) *FakeLibrary {
	f := &FakeLibrary{driverVersion: "550.54.15", cudaVersion: 12040, events: make(chan Event, 64)}
	if spec.ControlFile != "" {
		f.control = newFakeControl(spec.ControlFile)
	}
	for i := 0; i < spec.Count; i++ {
		f.devices = append(f.devices, NewFakeDevice(spec, i))
	}
	return f
}

// NewFakeDevice returns fake GPU number i of spec, with plausible values for
// every query.
func NewFakeDevice(spec FakeSpec, i int) *FakeDevice {
	return &FakeDevice{
		UUIDValue:    fakeUUID(spec.Seed, i),
		NameValue:    spec.Model,
		Minor:        i,
		BusID:        fmt.Sprintf("00000000:%02X:00.0", 0x10+i),
		Mem:          Memory{Total: spec.MemoryMiB << 20},
		BAR1:         Memory{Total: 256 << 20, Used: 2 << 20},
		PowerLimitMW: 70000,
		PowerUsageMW: 27500,
		MaxSMClock:   1590,
		MaxMemClock:  5001,
		SMClockMHz:   300,
		PCIeGen:      3,
		PCIeWidth:    16,
		CCMajor:      7,
		CCMinor:      5,
		NUMA:         0,
		Temp:         34,
		NVLinks:      map[int]string{},
		Unsupported:  map[string]bool{},
		Persistent:   true,
	}
}

// fakeUUID derives a stable, well-formed GPU UUID from the seed and index.
func fakeUUID(seed string, i int) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("gpujob-fake/%s/%d", seed, i)))
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// SetInitError makes Init fail with err, as a missing library would.
func (f *FakeLibrary) SetInitError(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initErr = err
}

// Devices returns the fake devices so a test can Update them.
func (f *FakeLibrary) Devices() []*FakeDevice {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*FakeDevice(nil), f.devices...)
}

// SetDevices replaces the device set, as a hot-plug or a driver reload would.
func (f *FakeLibrary) SetDevices(ds []*FakeDevice) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.devices = ds
}

// Inject delivers an NVML event to every event set's Wait.
func (f *FakeLibrary) Inject(e Event) { f.events <- e }

func (f *FakeLibrary) Init() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.initErr
}

func (f *FakeLibrary) Shutdown() error { return nil }

func (f *FakeLibrary) DriverVersion() (string, error) { return f.driverVersion, nil }

func (f *FakeLibrary) CUDADriverVersion() (int, error) { return f.cudaVersion, nil }

func (f *FakeLibrary) DeviceCount() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.devices), nil
}

func (f *FakeLibrary) DeviceByIndex(i int) (Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i < 0 || i >= len(f.devices) {
		return nil, fmt.Errorf("nvml DeviceGetHandleByIndex(%d): invalid argument", i)
	}
	return f.devices[i], nil
}

func (f *FakeLibrary) NewEventSet() (EventSet, error) { return &fakeEventSet{lib: f}, nil }

type fakeEventSet struct{ lib *FakeLibrary }

func (s *fakeEventSet) Register(Device, uint64) error { return nil }

func (s *fakeEventSet) Wait(timeout time.Duration) (Event, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case e := <-s.lib.events:
		return e, nil
	case <-t.C:
		return Event{}, ErrTimeout
	}
}

func (s *fakeEventSet) Free() error { return nil }

// FakeDevice is one in-memory GPU (or MIG instance). Read and change its fields
// only through Update once a plugin is using it.
type FakeDevice struct {
	mu sync.Mutex

	UUIDValue        string
	NameValue        string
	Minor            int
	BusID            string
	Mem              Memory
	BAR1             Memory
	PowerLimitMW     uint32
	PowerUsageMW     uint32
	MaxSMClock       uint32
	MaxMemClock      uint32
	SMClockMHz       uint32
	PCIeGen          uint32
	PCIeWidth        uint32
	Display          bool
	Persistent       bool
	CCMajor, CCMinor int
	NUMA             int
	Util             Utilization
	Encoder, Decoder uint32
	Temp             uint32
	ECCCorrected     uint64
	ECCUncorrected   uint64
	PagesPending     bool
	Rows             RemappedRows
	Throttle         uint64
	// MIG holds the MIG instances; non-nil means MIG mode is on.
	MIG []*FakeDevice
	// NVLinks maps an active link index to the remote PCI bus ID.
	NVLinks map[int]string
	// Unsupported names methods (e.g. "BAR1Info") that answer ErrNotSupported.
	Unsupported map[string]bool
	// Lost makes every query answer ErrGPULost.
	Lost bool
	// Failing names methods that answer a generic error.
	Failing map[string]error
	// ControlUnhealthy is why the control file marks the device unhealthy
	// ("" when it does not); FakeHealth reads it for the plugin's health check.
	ControlUnhealthy string
}

// Update changes the device under its lock.
func (d *FakeDevice) Update(fn func(d *FakeDevice)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fn(d)
}

// read runs fn under the lock unless the method is unsupported, failing or the
// device is lost.
func (d *FakeDevice) read(method string, fn func()) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.Lost:
		return ErrGPULost
	case d.Unsupported[method]:
		return ErrNotSupported
	case d.Failing[method] != nil:
		return d.Failing[method]
	}
	fn()
	return nil
}

func (d *FakeDevice) UUID() (v string, err error) {
	err = d.read("UUID", func() { v = d.UUIDValue })
	return
}

func (d *FakeDevice) Name() (v string, err error) {
	err = d.read("Name", func() { v = d.NameValue })
	return
}

func (d *FakeDevice) MinorNumber() (v int, err error) {
	err = d.read("MinorNumber", func() { v = d.Minor })
	return
}

func (d *FakeDevice) PCIBusID() (v string, err error) {
	err = d.read("PCIBusID", func() { v = d.BusID })
	return
}

func (d *FakeDevice) MemoryInfo() (v Memory, err error) {
	err = d.read("MemoryInfo", func() { v = d.Mem })
	return
}

func (d *FakeDevice) BAR1Info() (v Memory, err error) {
	err = d.read("BAR1Info", func() { v = d.BAR1 })
	return
}

func (d *FakeDevice) PowerLimit() (v uint32, err error) {
	err = d.read("PowerLimit", func() { v = d.PowerLimitMW })
	return
}

func (d *FakeDevice) PowerUsage() (v uint32, err error) {
	err = d.read("PowerUsage", func() { v = d.PowerUsageMW })
	return
}

func (d *FakeDevice) MaxClocks() (sm, mem uint32, err error) {
	err = d.read("MaxClocks", func() { sm, mem = d.MaxSMClock, d.MaxMemClock })
	return
}

func (d *FakeDevice) SMClock() (v uint32, err error) {
	err = d.read("SMClock", func() { v = d.SMClockMHz })
	return
}

func (d *FakeDevice) MaxPCIeLink() (gen, width uint32, err error) {
	err = d.read("MaxPCIeLink", func() { gen, width = d.PCIeGen, d.PCIeWidth })
	return
}

func (d *FakeDevice) DisplayMode() (v bool, err error) {
	err = d.read("DisplayMode", func() { v = d.Display })
	return
}

func (d *FakeDevice) PersistenceMode() (v bool, err error) {
	err = d.read("PersistenceMode", func() { v = d.Persistent })
	return
}

func (d *FakeDevice) ComputeCapability() (major, minor int, err error) {
	err = d.read("ComputeCapability", func() { major, minor = d.CCMajor, d.CCMinor })
	return
}

func (d *FakeDevice) NUMANode() (v int, err error) {
	err = d.read("NUMANode", func() { v = d.NUMA })
	return
}

func (d *FakeDevice) Utilization() (v Utilization, err error) {
	err = d.read("Utilization", func() { v = d.Util })
	return
}

func (d *FakeDevice) EncoderUtilization() (v uint32, err error) {
	err = d.read("EncoderUtilization", func() { v = d.Encoder })
	return
}

func (d *FakeDevice) DecoderUtilization() (v uint32, err error) {
	err = d.read("DecoderUtilization", func() { v = d.Decoder })
	return
}

func (d *FakeDevice) Temperature() (v uint32, err error) {
	err = d.read("Temperature", func() { v = d.Temp })
	return
}

func (d *FakeDevice) ECCErrors(uncorrected bool) (v uint64, err error) {
	err = d.read("ECCErrors", func() {
		v = d.ECCCorrected
		if uncorrected {
			v = d.ECCUncorrected
		}
	})
	return
}

func (d *FakeDevice) RetiredPagesPending() (v bool, err error) {
	err = d.read("RetiredPagesPending", func() { v = d.PagesPending })
	return
}

func (d *FakeDevice) RemappedRows() (v RemappedRows, err error) {
	err = d.read("RemappedRows", func() { v = d.Rows })
	return
}

func (d *FakeDevice) ThrottleReasons() (v uint64, err error) {
	err = d.read("ThrottleReasons", func() { v = d.Throttle })
	return
}

func (d *FakeDevice) MIGEnabled() (v bool, err error) {
	err = d.read("MIGEnabled", func() { v = d.MIG != nil })
	return
}

func (d *FakeDevice) MIGDevices() (v []Device, err error) {
	err = d.read("MIGDevices", func() {
		for _, m := range d.MIG {
			v = append(v, m)
		}
	})
	return
}

func (d *FakeDevice) NVLinkRemoteBusID(link int) (v string, err error) {
	var active bool
	err = d.read("NVLinkRemoteBusID", func() { v, active = d.NVLinks[link] })
	if err == nil && !active {
		err = ErrNotSupported
	}
	return
}
