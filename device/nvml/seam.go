// Package nvml is gpujob's narrow window onto NVIDIA's Management Library.
//
// The plugin never calls go-nvml directly: it talks to the Library and Device
// interfaces below. New returns the real implementation (go-nvml, which
// dlopens libnvidia-ml.so.1 at run time); NewFake returns an in-memory one used
// by the "fake" backend on machines without a GPU and by the unit tests. Every
// method returns a Go error; ErrNotSupported and ErrGPULost are sentinels the
// callers branch on, so NVML's return codes never leak out of this package.
package nvml

import (
	"errors"
	"time"
)

var (
	// ErrNotSupported means the device or driver does not implement a query
	// (BAR1 on GH200, ECC on consumer cards, ...). Callers omit the value.
	ErrNotSupported = errors.New("not supported by this device")
	// ErrGPULost means NVML can no longer reach the device (fallen off the bus).
	ErrGPULost = errors.New("GPU is lost: NVML can no longer reach it")
	// ErrTimeout is returned by EventSet.Wait when no event arrived in time.
	ErrTimeout = errors.New("timed out waiting for an NVML event")
	// ErrLibraryNotFound means libnvidia-ml.so.1 could not be loaded.
	ErrLibraryNotFound = errors.New("NVML library libnvidia-ml.so.1 not found: is the NVIDIA driver installed?")
	// ErrDriverNotLoaded means the library loaded but the kernel driver is not running.
	ErrDriverNotLoaded = errors.New("NVIDIA kernel driver is not loaded")
)

// Event types a health watcher registers for. Values equal NVML's so the real
// implementation passes them through unchanged.
const (
	EventSingleBitECC uint64 = 1
	EventDoubleBitECC uint64 = 2
	EventXidCritical  uint64 = 8
)

// NVLinkMaxLinks bounds the NVLink link index (NVML_NVLINK_MAX_LINKS).
const NVLinkMaxLinks = 36

// Library is the process-wide part of NVML.
type Library interface {
	Init() error
	Shutdown() error
	DriverVersion() (string, error)
	// CUDADriverVersion is NVML's integer form, e.g. 12040 for 12.4.
	CUDADriverVersion() (int, error)
	DeviceCount() (int, error)
	DeviceByIndex(i int) (Device, error)
	NewEventSet() (EventSet, error)
}

// Memory is a used/total pair in bytes.
type Memory struct {
	Total uint64
	Used  uint64
}

// Utilization is the percentage of time the GPU and its memory were busy
// during NVML's last sample period.
type Utilization struct {
	GPU    uint32
	Memory uint32
}

// RemappedRows is NVML's row-remapping state (Ampere and later).
type RemappedRows struct {
	Correctable   int
	Uncorrectable int
	Pending       bool
	Failed        bool
}

// Device is one GPU or one MIG instance.
type Device interface {
	UUID() (string, error)
	Name() (string, error)
	// MinorNumber is N in /dev/nvidiaN.
	MinorNumber() (int, error)
	PCIBusID() (string, error)
	MemoryInfo() (Memory, error)
	BAR1Info() (Memory, error)
	// PowerLimit and PowerUsage are in milliwatts, as NVML reports them.
	PowerLimit() (uint32, error)
	PowerUsage() (uint32, error)
	// MaxClocks are the SM and memory clocks' maxima in MHz.
	MaxClocks() (sm, mem uint32, err error)
	SMClock() (uint32, error)
	// MaxPCIeLink is the maximum link generation and width.
	MaxPCIeLink() (gen, width uint32, err error)
	DisplayMode() (bool, error)
	PersistenceMode() (bool, error)
	ComputeCapability() (major, minor int, err error)
	NUMANode() (int, error)
	Utilization() (Utilization, error)
	EncoderUtilization() (uint32, error)
	DecoderUtilization() (uint32, error)
	// Temperature of the GPU die in degrees Celsius.
	Temperature() (uint32, error)
	// ECCErrors is the volatile count (since the last driver load) of
	// corrected or uncorrected errors.
	ECCErrors(uncorrected bool) (uint64, error)
	RetiredPagesPending() (bool, error)
	RemappedRows() (RemappedRows, error)
	// ThrottleReasons is NVML's bit mask of current clock event reasons.
	ThrottleReasons() (uint64, error)
	// MIGEnabled reports whether MIG mode is currently on.
	MIGEnabled() (bool, error)
	// MIGDevices lists the MIG instances of a MIG-enabled GPU.
	MIGDevices() ([]Device, error)
	// NVLinkRemoteBusID is the PCI bus ID at the far end of an active link;
	// ErrNotSupported (or any error) when the link is absent or down.
	NVLinkRemoteBusID(link int) (string, error)
}

// Event is one NVML event: which device, what kind, and for Xid events the Xid.
type Event struct {
	UUID string
	Type uint64
	Data uint64
}

// EventSet delivers events for the devices registered with it. Wait blocks in
// NVML itself, so a watcher is woken by the event, not by a polling tick.
type EventSet interface {
	Register(d Device, types uint64) error
	Wait(timeout time.Duration) (Event, error)
	Free() error
}
