package nvml

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestWrap(t *testing.T) {
	cases := []struct {
		r    gonvml.Return
		is   error
		text string
	}{
		{gonvml.SUCCESS, nil, ""},
		{gonvml.ERROR_NOT_SUPPORTED, ErrNotSupported, ""},
		{gonvml.ERROR_FUNCTION_NOT_FOUND, ErrNotSupported, ""},
		{gonvml.ERROR_GPU_IS_LOST, ErrGPULost, ""},
		{gonvml.ERROR_TIMEOUT, ErrTimeout, ""},
		{gonvml.ERROR_LIBRARY_NOT_FOUND, ErrLibraryNotFound, "libnvidia-ml.so.1"},
		{gonvml.ERROR_DRIVER_NOT_LOADED, ErrDriverNotLoaded, "driver"},
		{gonvml.ERROR_NO_PERMISSION, nil, "nvml DeviceGetFoo:"},
		{gonvml.ERROR_UNKNOWN, nil, "nvml DeviceGetFoo:"},
	}
	for _, tc := range cases {
		err := wrap("DeviceGetFoo", tc.r)
		switch {
		case tc.r == gonvml.SUCCESS:
			if err != nil {
				t.Errorf("wrap(SUCCESS) = %v", err)
			}
			continue
		case err == nil:
			t.Errorf("wrap(%d) = nil", tc.r)
			continue
		case tc.is != nil && !errors.Is(err, tc.is):
			t.Errorf("wrap(%d) = %v, want %v", tc.r, err, tc.is)
		}
		if tc.is == nil && (errors.Is(err, ErrNotSupported) || errors.Is(err, ErrGPULost)) {
			t.Errorf("wrap(%d) = %v: a generic failure mapped to a sentinel", tc.r, err)
		}
		if !strings.Contains(err.Error(), tc.text) {
			t.Errorf("wrap(%d) = %q, want it to contain %q", tc.r, err, tc.text)
		}
	}
}

func TestBusID(t *testing.T) {
	var p gonvml.PciInfo
	for i, c := range "00000000:3B:00.0" {
		p.BusId[i] = int8(c)
	}
	if got := busID(p); got != "00000000:3B:00.0" {
		t.Errorf("busID = %q", got)
	}
	if got := busID(gonvml.PciInfo{}); got != "" {
		t.Errorf("busID(empty) = %q", got)
	}
}

// TestRealNVML runs the real backend. Without a driver (CI) Init must fail
// with an error that says what is missing; with one, the inventory, a sample
// and the health of every GPU must be readable and well-formed.
func TestRealNVML(t *testing.T) {
	lib := New()
	if err := lib.Init(); err != nil {
		if !errors.Is(err, ErrLibraryNotFound) && !errors.Is(err, ErrDriverNotLoaded) {
			t.Fatalf("Init without a usable driver = %v, want ErrLibraryNotFound or ErrDriverNotLoaded", err)
		}
		t.Skipf("no NVIDIA driver here (%v): real-GPU checks skipped", err)
	}
	defer lib.Shutdown()
	inv, err := Collect(lib)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("driver %s, CUDA %s, %d devices, %d unreachable", inv.DriverVersion, inv.CUDADriverVersion, len(inv.Devices), len(inv.Unreachable))
	if inv.DriverVersion == "" || !regexp.MustCompile(`^\d+\.\d+$`).MatchString(inv.CUDADriverVersion) {
		t.Errorf("driver %q CUDA %q", inv.DriverVersion, inv.CUDADriverVersion)
	}
	if len(inv.Devices) == 0 {
		t.Errorf("NVML works but lists no device")
	}
	for _, u := range inv.Unreachable {
		t.Errorf("GPU %d unreachable: %v", u.Index, u.Err)
	}
	for _, d := range inv.Devices {
		t.Logf("device %s", dump(d))
		if !strings.HasPrefix(d.UUID, "GPU-") && !strings.HasPrefix(d.UUID, "MIG-") {
			t.Errorf("UUID %q", d.UUID)
		}
		if d.MemoryMiB == nil || *d.MemoryMiB == 0 || d.Minor < 0 || d.PCIBusID == "" || d.ComputeCapability == nil {
			t.Errorf("%s lacks basic facts", d.UUID)
		}
		s := Read(d.Handle)
		t.Logf("sample %s", sampleString(s))
		if s.MemTotalMiB == nil || s.TemperatureC == nil && d.ParentUUID == "" {
			t.Errorf("%s: sample lacks memory or temperature", d.UUID)
		}
		t.Logf("health %q", CheckHealth(d.GPU))
	}
	set, err := lib.NewEventSet()
	if err != nil {
		t.Fatalf("NewEventSet: %v", err)
	}
	defer set.Free()
	for _, d := range inv.Devices {
		if d.ParentUUID == "" {
			if err := set.Register(d.GPU, EventXidCritical|EventDoubleBitECC); err != nil {
				t.Logf("%s: Register(Xid|DBE) = %v", d.UUID, err)
			}
		}
	}
	if _, err := set.Wait(10 * time.Millisecond); err != nil && !errors.Is(err, ErrTimeout) {
		t.Errorf("Wait = %v, want a timeout on a quiet GPU", err)
	}
}
