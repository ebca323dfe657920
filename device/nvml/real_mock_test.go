package nvml

import (
	"errors"
	"fmt"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// dgxH100 is go-nvml's simulated DGX H100 (8 GPUs) with the queries its
// server leaves unset answered the way a real H100 answers them, so the real
// adapter (real.go), not the fake, is what Collect, Read and CheckHealth run
// through.
func dgxH100(t testing.TB) (*realLibrary, []*server.Device) {
	t.Helper()
	srv := dgxh100.New()
	var devs []*server.Device
	for i, d := range srv.Devices {
		sd := d.(*server.Device)
		i := i
		sd.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) {
			var p gonvml.PciInfo
			for j, c := range fmt.Sprintf("00000000:%02X:00.0", 0x18+i) {
				p.BusId[j] = int8(c)
			}
			return p, gonvml.SUCCESS
		}
		sd.GetBAR1MemoryInfoFunc = func() (gonvml.BAR1Memory, gonvml.Return) {
			return gonvml.BAR1Memory{Bar1Total: 128 << 30, Bar1Used: 1 << 20}, gonvml.SUCCESS
		}
		sd.GetPowerManagementLimitFunc = func() (uint32, gonvml.Return) { return 700000, gonvml.SUCCESS }
		sd.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return 112345, gonvml.SUCCESS }
		sd.GetMaxClockInfoFunc = func(c gonvml.ClockType) (uint32, gonvml.Return) {
			if c == gonvml.CLOCK_SM {
				return 1980, gonvml.SUCCESS
			}
			return 2619, gonvml.SUCCESS
		}
		sd.GetClockInfoFunc = func(gonvml.ClockType) (uint32, gonvml.Return) { return 1755, gonvml.SUCCESS }
		sd.GetMaxPcieLinkGenerationFunc = func() (int, gonvml.Return) { return 5, gonvml.SUCCESS }
		sd.GetMaxPcieLinkWidthFunc = func() (int, gonvml.Return) { return 16, gonvml.SUCCESS }
		sd.GetDisplayModeFunc = func() (gonvml.EnableState, gonvml.Return) { return gonvml.FEATURE_DISABLED, gonvml.SUCCESS }
		sd.GetPersistenceModeFunc = func() (gonvml.EnableState, gonvml.Return) { return gonvml.FEATURE_ENABLED, gonvml.SUCCESS }
		sd.GetNumaNodeIdFunc = func() (int, gonvml.Return) { return i / 4, gonvml.SUCCESS }
		// 18 NVLinks to the NVSwitches; the rest absent.
		sd.GetNvLinkStateFunc = func(link int) (gonvml.EnableState, gonvml.Return) {
			if link < 18 {
				return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
			}
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		}
		sd.GetNvLinkRemotePciInfoFunc = func(link int) (gonvml.PciInfo, gonvml.Return) {
			var p gonvml.PciInfo
			for j, c := range fmt.Sprintf("00000000:%02X:00.0", 0xA0+link%4) {
				p.BusId[j] = int8(c)
			}
			return p, gonvml.SUCCESS
		}
		sd.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) {
			return gonvml.Utilization{Gpu: 87, Memory: 41}, gonvml.SUCCESS
		}
		sd.GetEncoderUtilizationFunc = func() (uint32, uint32, gonvml.Return) { return 0, 0, gonvml.ERROR_NOT_SUPPORTED }
		sd.GetDecoderUtilizationFunc = func() (uint32, uint32, gonvml.Return) { return 3, 167000, gonvml.SUCCESS }
		sd.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 61, gonvml.SUCCESS }
		sd.GetTotalEccErrorsFunc = func(gonvml.MemoryErrorType, gonvml.EccCounterType) (uint64, gonvml.Return) {
			return 0, gonvml.SUCCESS
		}
		sd.GetRetiredPagesPendingStatusFunc = func() (gonvml.EnableState, gonvml.Return) {
			return 0, gonvml.ERROR_NOT_SUPPORTED // Hopper remaps rows instead
		}
		sd.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 0, false, false, gonvml.SUCCESS }
		sd.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) { return 0x4, gonvml.SUCCESS }
		devs = append(devs, sd)
	}
	return &realLibrary{lib: srv}, devs
}

func TestRealAdapterOnSimulatedDGXH100(t *testing.T) {
	lib, devs := dgxH100(t)
	if err := lib.Init(); err != nil {
		t.Fatalf("Init: %v", err)
	}
	inv, err := Collect(lib)
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	if inv.DriverVersion != "550.54.15" || inv.CUDADriverVersion != "12.4" {
		t.Errorf("driver %q CUDA %q, want 550.54.15 and 12.4", inv.DriverVersion, inv.CUDADriverVersion)
	}
	if len(inv.Devices) != 8 || len(inv.Unreachable) != 0 {
		t.Fatalf("%d devices, %d unreachable; want 8 and 0", len(inv.Devices), len(inv.Unreachable))
	}
	d := inv.Devices[5]
	checks := []struct {
		name      string
		got, want any
	}{
		{"name", d.Name, "NVIDIA H100 80GB HBM3"},
		{"uuid", d.UUID, devs[5].UUID},
		{"minor", d.Minor, devs[5].Minor},
		{"bus id (C string to Go)", d.PCIBusID, "00000000:1D:00.0"},
		{"memory MiB", *d.MemoryMiB, devs[5].MemoryInfo.Total >> 20},
		{"BAR1 MiB", *d.BAR1MiB, uint64(128 << 10)},
		{"power W from mW", *d.PowerW, uint32(700)},
		{"SM clock", *d.CoresClockMHz, uint32(1980)},
		{"memory clock", *d.MemoryClockMHz, uint32(2619)},
		{"PCIe gen5 x16 MB/s", *d.PCIBandwidthMBps, uint32(3938 * 16)},
		{"display", *d.DisplayState, "Disabled"},
		{"persistence", *d.PersistenceMode, "Enabled"},
		{"compute capability", *d.ComputeCapability, "9.0"},
		{"numa", *d.NUMANode, 1},
		{"nvlinks", len(d.NVLinkPeers), 18},
	}
	for _, c := range checks {
		if fmt.Sprint(c.got) != fmt.Sprint(c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if len(d.Warnings) != 0 {
		t.Errorf("warnings on a healthy H100: %v", d.Warnings)
	}

	s := Read(d.Handle)
	if s.GPUUtilPct == nil || *s.GPUUtilPct != 87 || s.PowerW == nil || *s.PowerW != 112.345 {
		t.Errorf("sample: util %v power %v, want 87 %% and 112.345 W", s.GPUUtilPct, s.PowerW)
	}
	if s.EncoderUtilPct != nil {
		t.Errorf("encoder utilisation NVML does not support read as %d, want N/A", *s.EncoderUtilPct)
	}
	if s.DecoderUtilPct == nil || *s.DecoderUtilPct != 3 {
		t.Errorf("decoder utilisation = %v, want 3", s.DecoderUtilPct)
	}
	if got := ThrottleReasonNames(*s.ThrottleReasons); len(got) != 1 || got[0] != "sw_power_cap" {
		t.Errorf("throttle reasons = %v, want [sw_power_cap]", got)
	}
	if why := CheckHealth(d.Handle); why != "" {
		t.Errorf("healthy H100 reported unhealthy: %s", why)
	}
}

func TestRealAdapterMapsNVMLFailures(t *testing.T) {
	lib, devs := dgxH100(t)
	// GPU 2 has fallen off the bus; GPU 3 does not support BAR1 (GH200-like);
	// GPU 4 has uncorrectable ECC errors; GPU 6's PCIe query fails oddly.
	devs[2].GetUUIDFunc = func() (string, gonvml.Return) { return "", gonvml.ERROR_GPU_IS_LOST }
	devs[3].GetBAR1MemoryInfoFunc = func() (gonvml.BAR1Memory, gonvml.Return) {
		return gonvml.BAR1Memory{}, gonvml.ERROR_NOT_SUPPORTED
	}
	devs[4].GetTotalEccErrorsFunc = func(kind gonvml.MemoryErrorType, _ gonvml.EccCounterType) (uint64, gonvml.Return) {
		if kind == gonvml.MEMORY_ERROR_TYPE_UNCORRECTED {
			return 2, gonvml.SUCCESS
		}
		return 40, gonvml.SUCCESS
	}
	devs[6].GetMaxPcieLinkGenerationFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN }

	inv, err := Collect(lib)
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	if len(inv.Unreachable) != 1 || inv.Unreachable[0].Index != 2 || !errors.Is(inv.Unreachable[0].Err, ErrGPULost) {
		t.Fatalf("unreachable = %+v, want GPU 2 lost", inv.Unreachable)
	}
	if len(inv.Devices) != 7 {
		t.Fatalf("%d devices listed, want the 7 that answer", len(inv.Devices))
	}
	byUUID := map[string]DeviceInfo{}
	for _, d := range inv.Devices {
		byUUID[d.UUID] = d
	}
	if d := byUUID[devs[3].UUID]; d.BAR1MiB != nil || len(d.Warnings) != 0 {
		t.Errorf("unsupported BAR1: value %v warnings %v; want omitted silently", d.BAR1MiB, d.Warnings)
	}
	if d := byUUID[devs[6].UUID]; d.PCIBandwidthMBps != nil || len(d.Warnings) != 1 {
		t.Errorf("failing PCIe query: value %v warnings %v; want omitted with one warning", d.PCIBandwidthMBps, d.Warnings)
	}
	if why := CheckHealth(byUUID[devs[4].UUID].Handle); why == "" {
		t.Errorf("GPU with 2 uncorrectable ECC errors reported healthy")
	}
}
