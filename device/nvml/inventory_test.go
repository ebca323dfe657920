package nvml

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// testSpec is a plain single-model machine.
var testSpec = FakeSpec{Count: 2, Model: "Tesla T4", MemoryMiB: 15360, Seed: "inventory-test"}

// libWith wraps a FakeLibrary so the library-wide queries can fail.
type libWith struct {
	*FakeLibrary
	driverErr, cudaErr, countErr error
	cuda                         int
}

func (l libWith) DriverVersion() (string, error) {
	if l.driverErr != nil {
		return "", l.driverErr
	}
	return l.FakeLibrary.DriverVersion()
}

func (l libWith) CUDADriverVersion() (int, error) {
	if l.cudaErr != nil {
		return 0, l.cudaErr
	}
	if l.cuda != 0 {
		return l.cuda, nil
	}
	return l.FakeLibrary.CUDADriverVersion()
}

func (l libWith) DeviceCount() (int, error) {
	if l.countErr != nil {
		return 0, l.countErr
	}
	return l.FakeLibrary.DeviceCount()
}

func mustCollect(t *testing.T, lib Library) Inventory {
	t.Helper()
	inv, err := Collect(lib)
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	return inv
}

func u64(v uint64) *uint64 { return &v }
func u32(v uint32) *uint32 { return &v }
func str(v string) *string { return &v }
func intp(v int) *int      { return &v }

func TestCollectNormalGPU(t *testing.T) {
	lib := NewFake(testSpec)
	d0 := lib.Devices()[0]
	d0.Update(func(d *FakeDevice) {
		d.Mem = Memory{Total: 15360<<20 + 12345, Used: 1 << 30} // not MiB aligned: truncated
		d.BAR1 = Memory{Total: 256 << 20}
		d.PowerLimitMW = 70000
		d.MaxSMClock, d.MaxMemClock = 1590, 5001
		d.PCIeGen, d.PCIeWidth = 3, 16
		d.Display, d.Persistent = false, true
		d.CCMajor, d.CCMinor = 7, 5
		d.NUMA = 1
		d.NVLinks = map[int]string{0: "00000000:11:00.0", 3: "00000000:12:00.0"}
	})

	inv := mustCollect(t, lib)
	if inv.DriverVersion != "550.54.15" {
		t.Errorf("DriverVersion = %q, want 550.54.15", inv.DriverVersion)
	}
	if inv.CUDADriverVersion != "12.4" {
		t.Errorf("CUDADriverVersion = %q, want 12.4 (from 12040)", inv.CUDADriverVersion)
	}
	if len(inv.Devices) != 2 || len(inv.Unreachable) != 0 {
		t.Fatalf("got %d devices, %d unreachable; want 2, 0", len(inv.Devices), len(inv.Unreachable))
	}
	got := inv.Devices[0]
	want := DeviceInfo{
		Handle:            d0,
		GPU:               d0,
		Index:             0,
		UUID:              d0.UUIDValue,
		Name:              "Tesla T4",
		Minor:             0,
		PCIBusID:          "00000000:10:00.0",
		MemoryMiB:         u64(15360),
		BAR1MiB:           u64(256),
		PowerW:            u32(70),
		CoresClockMHz:     u32(1590),
		MemoryClockMHz:    u32(5001),
		PCIBandwidthMBps:  u32(985 * 16),
		DisplayState:      str("Disabled"),
		PersistenceMode:   str("Enabled"),
		ComputeCapability: str("7.5"),
		NUMANode:          intp(1),
		NVLinkPeers:       []string{"00000000:11:00.0", "00000000:12:00.0"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("device 0:\n got %s\nwant %s", dump(got), dump(want))
	}
	if d1 := inv.Devices[1]; d1.Index != 1 || d1.Minor != 1 || d1.UUID == got.UUID || d1.NVLinkPeers != nil {
		t.Errorf("device 1 = index %d minor %d uuid %s peers %v", d1.Index, d1.Minor, d1.UUID, d1.NVLinkPeers)
	}
}

// dump prints a DeviceInfo's pointers as values.
func dump(d DeviceInfo) string {
	p := func(v any) string {
		rv := reflect.ValueOf(v)
		if rv.IsNil() {
			return "nil"
		}
		return fmt.Sprint(rv.Elem().Interface())
	}
	return fmt.Sprintf("{%s %q idx=%d minor=%d bus=%s parent=%q mig=%q mem=%s bar1=%s W=%s clk=%s/%s pci=%s disp=%s pers=%s cc=%s numa=%s peers=%v warn=%v}",
		d.UUID, d.Name, d.Index, d.Minor, d.PCIBusID, d.ParentUUID, d.MIGProfile, p(d.MemoryMiB), p(d.BAR1MiB),
		p(d.PowerW), p(d.CoresClockMHz), p(d.MemoryClockMHz), p(d.PCIBandwidthMBps), p(d.DisplayState),
		p(d.PersistenceMode), p(d.ComputeCapability), p(d.NUMANode), d.NVLinkPeers, d.Warnings)
}

func TestCollectConversions(t *testing.T) {
	cases := []struct {
		name  string
		set   func(d *FakeDevice)
		check func(t *testing.T, d DeviceInfo)
	}{
		{"memory bytes to MiB", func(d *FakeDevice) { d.Mem.Total = 80 << 30 }, func(t *testing.T, d DeviceInfo) {
			if d.MemoryMiB == nil || *d.MemoryMiB != 81920 {
				t.Errorf("MemoryMiB = %v, want 81920", d.MemoryMiB)
			}
		}},
		{"power mW to W", func(d *FakeDevice) { d.PowerLimitMW = 400000 }, func(t *testing.T, d DeviceInfo) {
			if d.PowerW == nil || *d.PowerW != 400 {
				t.Errorf("PowerW = %v, want 400", d.PowerW)
			}
		}},
		{"PCIe gen4 x16", func(d *FakeDevice) { d.PCIeGen, d.PCIeWidth = 4, 16 }, func(t *testing.T, d DeviceInfo) {
			if d.PCIBandwidthMBps == nil || *d.PCIBandwidthMBps != 1969*16 {
				t.Errorf("PCIBandwidthMBps = %v, want %d", d.PCIBandwidthMBps, 1969*16)
			}
		}},
		{"PCIe gen5 x8", func(d *FakeDevice) { d.PCIeGen, d.PCIeWidth = 5, 8 }, func(t *testing.T, d DeviceInfo) {
			if d.PCIBandwidthMBps == nil || *d.PCIBandwidthMBps != 3938*8 {
				t.Errorf("PCIBandwidthMBps = %v, want %d", d.PCIBandwidthMBps, 3938*8)
			}
		}},
		{"PCIe unknown generation omitted", func(d *FakeDevice) { d.PCIeGen = 9 }, func(t *testing.T, d DeviceInfo) {
			if d.PCIBandwidthMBps != nil {
				t.Errorf("PCIBandwidthMBps = %d, want nil", *d.PCIBandwidthMBps)
			}
		}},
		{"compute capability 9.0", func(d *FakeDevice) { d.CCMajor, d.CCMinor = 9, 0 }, func(t *testing.T, d DeviceInfo) {
			if d.ComputeCapability == nil || *d.ComputeCapability != "9.0" {
				t.Errorf("ComputeCapability = %v, want 9.0", d.ComputeCapability)
			}
		}},
		{"display on, persistence off", func(d *FakeDevice) { d.Display, d.Persistent = true, false }, func(t *testing.T, d DeviceInfo) {
			if d.DisplayState == nil || *d.DisplayState != "Enabled" || d.PersistenceMode == nil || *d.PersistenceMode != "Disabled" {
				t.Errorf("display %v persistence %v, want Enabled/Disabled", d.DisplayState, d.PersistenceMode)
			}
		}},
		{"NUMA node unknown (-1) omitted", func(d *FakeDevice) { d.NUMA = -1 }, func(t *testing.T, d DeviceInfo) {
			if d.NUMANode != nil {
				t.Errorf("NUMANode = %d, want nil", *d.NUMANode)
			}
		}},
		{"NVLink peers in link order", func(d *FakeDevice) {
			d.NVLinks = map[int]string{35: "c", 0: "a", 17: "b", 36: "beyond the last link"}
		}, func(t *testing.T, d DeviceInfo) {
			if !reflect.DeepEqual(d.NVLinkPeers, []string{"a", "b", "c"}) {
				t.Errorf("NVLinkPeers = %v, want [a b c]", d.NVLinkPeers)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lib := NewFake(FakeSpec{Count: 1, Model: "m", MemoryMiB: 1024})
			lib.Devices()[0].Update(tc.set)
			inv := mustCollect(t, lib)
			if len(inv.Devices) != 1 {
				t.Fatalf("got %d devices, want 1", len(inv.Devices))
			}
			if len(inv.Devices[0].Warnings) != 0 {
				t.Errorf("warnings %v", inv.Devices[0].Warnings)
			}
			tc.check(t, inv.Devices[0])
		})
	}
}

func TestCollectCUDAVersion(t *testing.T) {
	cases := []struct {
		v    int
		err  error
		want string
	}{
		{12040, nil, "12.4"},
		{11020, nil, "11.2"},
		{12000, nil, "12.0"},
		{12090, nil, "12.9"},
		{0, errors.New("function not found"), ""},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.v), func(t *testing.T) {
			lib := libWith{FakeLibrary: NewFake(testSpec), cuda: tc.v, cudaErr: tc.err}
			inv := mustCollect(t, lib)
			if inv.CUDADriverVersion != tc.want {
				t.Errorf("CUDADriverVersion = %q, want %q", inv.CUDADriverVersion, tc.want)
			}
			if len(inv.Devices) != 2 {
				t.Errorf("got %d devices, want 2 (a CUDA version failure hides nothing)", len(inv.Devices))
			}
		})
	}
}

func TestCollectLibraryFailures(t *testing.T) {
	boom := errors.New("boom")
	cases := []struct {
		name string
		lib  libWith
		want string
	}{
		{"driver version", libWith{driverErr: boom}, "driver version"},
		{"device count", libWith{countErr: boom}, "counting GPUs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.lib.FakeLibrary = NewFake(testSpec)
			_, err := Collect(tc.lib)
			if err == nil || !errors.Is(err, boom) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Collect error = %v, want one wrapping boom and saying %q", err, tc.want)
			}
		})
	}
}

// TestCollectMissingFields: a query the device does not support leaves its
// field nil (omitted, not zero) silently; one that fails otherwise leaves it
// nil with a warning naming the query.
func TestCollectMissingFields(t *testing.T) {
	cases := []struct {
		method  string
		warning string
		missing func(d DeviceInfo) bool
	}{
		{"MinorNumber", "minor number", func(d DeviceInfo) bool { return d.Minor == -1 }},
		{"PCIBusID", "PCI bus ID", func(d DeviceInfo) bool { return d.PCIBusID == "" }},
		{"MemoryInfo", "memory", func(d DeviceInfo) bool { return d.MemoryMiB == nil }},
		{"BAR1Info", "BAR1", func(d DeviceInfo) bool { return d.BAR1MiB == nil }},
		{"PowerLimit", "power limit", func(d DeviceInfo) bool { return d.PowerW == nil }},
		{"MaxClocks", "max clocks", func(d DeviceInfo) bool { return d.CoresClockMHz == nil && d.MemoryClockMHz == nil }},
		{"MaxPCIeLink", "PCIe link", func(d DeviceInfo) bool { return d.PCIBandwidthMBps == nil }},
		{"DisplayMode", "display mode", func(d DeviceInfo) bool { return d.DisplayState == nil }},
		{"PersistenceMode", "persistence mode", func(d DeviceInfo) bool { return d.PersistenceMode == nil }},
		{"ComputeCapability", "compute capability", func(d DeviceInfo) bool { return d.ComputeCapability == nil }},
		{"NUMANode", "NUMA node", func(d DeviceInfo) bool { return d.NUMANode == nil }},
	}
	for _, tc := range cases {
		for _, mode := range []string{"unsupported", "failing"} {
			t.Run(tc.method+"/"+mode, func(t *testing.T) {
				lib := NewFake(testSpec)
				lib.Devices()[0].Update(func(d *FakeDevice) {
					if mode == "unsupported" {
						d.Unsupported[tc.method] = true
					} else {
						d.Failing = map[string]error{tc.method: errors.New("nvml: unknown error")}
					}
				})
				inv := mustCollect(t, lib)
				if len(inv.Devices) != 2 || len(inv.Unreachable) != 0 {
					t.Fatalf("got %d devices, %d unreachable; an optional field must not hide the GPU", len(inv.Devices), len(inv.Unreachable))
				}
				d := inv.Devices[0]
				if !tc.missing(d) {
					t.Errorf("field of %s still set: %s", tc.method, dump(d))
				}
				if full := inv.Devices[1]; tc.missing(full) {
					t.Errorf("the other device lost the field too: %s", dump(full))
				}
				switch mode {
				case "unsupported":
					if len(d.Warnings) != 0 {
						t.Errorf("Warnings = %v, want none for an unsupported query", d.Warnings)
					}
				case "failing":
					if len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], tc.warning) || !strings.Contains(d.Warnings[0], "unknown error") {
						t.Errorf("Warnings = %q, want one naming %q and the error", d.Warnings, tc.warning)
					}
				}
			})
		}
	}
}

// TestCollectUnreachable: a GPU that cannot be identified, or is lost, is
// listed in Unreachable by index while every other GPU is still described.
func TestCollectUnreachable(t *testing.T) {
	lostMidway := fmt.Errorf("BAR1: %w", ErrGPULost)
	cases := []struct {
		name   string
		set    func(d *FakeDevice)
		wantIs error
		want   string
	}{
		{"lost", func(d *FakeDevice) { d.Lost = true }, ErrGPULost, "lost"},
		{"UUID fails", func(d *FakeDevice) { d.Failing = map[string]error{"UUID": errors.New("corrupted infoROM")} }, nil, "reading UUID"},
		{"name fails", func(d *FakeDevice) { d.Failing = map[string]error{"Name": errors.New("corrupted infoROM")} }, nil, "reading the name"},
		{"lost while reading BAR1", func(d *FakeDevice) { d.Failing = map[string]error{"BAR1Info": lostMidway} }, ErrGPULost, "lost"},
		{"lost while reading NVLinks", func(d *FakeDevice) { d.Failing = map[string]error{"NVLinkRemoteBusID": ErrGPULost} }, ErrGPULost, "lost"},
		{"MIG listing fails", func(d *FakeDevice) {
			d.MIG = []*FakeDevice{}
			d.Failing = map[string]error{"MIGDevices": errors.New("insufficient permissions")}
		}, nil, "MIG instances"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lib := NewFake(FakeSpec{Count: 3, Model: "m", MemoryMiB: 1024})
			devs := lib.Devices()
			devs[1].Update(tc.set)
			inv := mustCollect(t, lib)
			if len(inv.Devices) != 2 || inv.Devices[0].UUID != devs[0].UUIDValue || inv.Devices[1].UUID != devs[2].UUIDValue {
				t.Fatalf("devices = %v, want GPUs 0 and 2 still listed", inv.Devices)
			}
			if inv.Devices[1].Index != 2 {
				t.Errorf("GPU 2 listed with index %d", inv.Devices[1].Index)
			}
			if len(inv.Unreachable) != 1 || inv.Unreachable[0].Index != 1 {
				t.Fatalf("Unreachable = %v, want index 1", inv.Unreachable)
			}
			err := inv.Unreachable[0].Err
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("error %v is not %v", err, tc.wantIs)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func newMIG(uuid, name string, memMiB uint64) *FakeDevice {
	d := NewFakeDevice(FakeSpec{Model: name, MemoryMiB: memMiB}, 0)
	d.UUIDValue = uuid
	d.Minor = 99          // MIG handles have no minor of their own
	d.BusID = "bogus"     // nor a PCI address
	d.PowerLimitMW = 1000 // nor power
	return d
}

func TestCollectMIG(t *testing.T) {
	lib := NewFake(FakeSpec{Count: 2, Model: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, Seed: "mig"})
	devs := lib.Devices()
	parent := devs[0]
	small := newMIG("MIG-aaaa", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 4864)
	big := newMIG("MIG-bbbb", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 19968)
	parent.Update(func(d *FakeDevice) {
		d.MIG = []*FakeDevice{small, big}
		d.NVLinks = map[int]string{0: "00000000:11:00.0"}
		d.PowerLimitMW = 400000
	})

	inv := mustCollect(t, lib)
	if len(inv.Devices) != 3 {
		t.Fatalf("got %d devices, want 2 MIG instances + 1 whole GPU", len(inv.Devices))
	}
	for _, d := range inv.Devices {
		if d.UUID == parent.UUIDValue {
			t.Errorf("MIG parent %s is listed; it must be hidden", d.UUID)
		}
	}
	cases := []struct {
		got     DeviceInfo
		handle  *FakeDevice
		uuid    string
		profile string
		mem     uint64
	}{
		{inv.Devices[0], small, "MIG-aaaa", "1g.5gb", 4864},
		{inv.Devices[1], big, "MIG-bbbb", "3g.20gb", 19968},
	}
	for _, tc := range cases {
		d := tc.got
		if d.UUID != tc.uuid || d.MIGProfile != tc.profile || d.ParentUUID != parent.UUIDValue {
			t.Errorf("MIG device = %s, want uuid %s profile %s parent %s", dump(d), tc.uuid, tc.profile, parent.UUIDValue)
		}
		if d.Handle != Device(tc.handle) || d.GPU != Device(parent) {
			t.Errorf("%s: Handle must be the instance and GPU the parent", d.UUID)
		}
		if d.Index != 0 || d.Minor != 0 || d.PCIBusID != parent.BusID {
			t.Errorf("%s: index %d minor %d bus %q; want the parent's 0, 0, %q", d.UUID, d.Index, d.Minor, d.PCIBusID, parent.BusID)
		}
		if d.MemoryMiB == nil || *d.MemoryMiB != tc.mem {
			t.Errorf("%s: memory %v, want the instance's %d MiB", d.UUID, d.MemoryMiB, tc.mem)
		}
		if d.PowerW == nil || *d.PowerW != 400 {
			t.Errorf("%s: power %v, want the parent's 400 W", d.UUID, d.PowerW)
		}
		if d.NVLinkPeers != nil {
			t.Errorf("%s: NVLink peers %v on a MIG instance", d.UUID, d.NVLinkPeers)
		}
	}
	if whole := inv.Devices[2]; whole.UUID != devs[1].UUIDValue || whole.ParentUUID != "" || whole.MIGProfile != "" || whole.Index != 1 {
		t.Errorf("whole GPU = %s", dump(whole))
	}
}

func TestCollectMIGInstanceProblems(t *testing.T) {
	t.Run("memory unsupported", func(t *testing.T) {
		lib := NewFake(FakeSpec{Count: 1, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920})
		inst := newMIG("MIG-1", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9856)
		inst.Unsupported["MemoryInfo"] = true
		lib.Devices()[0].Update(func(d *FakeDevice) { d.MIG = []*FakeDevice{inst} })
		inv := mustCollect(t, lib)
		if len(inv.Devices) != 1 || inv.Devices[0].MemoryMiB != nil {
			t.Fatalf("want one MIG device without memory (not the parent's 81920), got %v", inv.Devices)
		}
		if len(inv.Devices[0].Warnings) != 0 {
			t.Errorf("warnings %v", inv.Devices[0].Warnings)
		}
	})
	t.Run("memory failing", func(t *testing.T) {
		lib := NewFake(FakeSpec{Count: 1, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920})
		inst := newMIG("MIG-1", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9856)
		inst.Failing = map[string]error{"MemoryInfo": errors.New("nvml: unknown error")}
		lib.Devices()[0].Update(func(d *FakeDevice) {
			d.MIG = []*FakeDevice{inst}
			d.Failing = map[string]error{"BAR1Info": errors.New("parent warning must not be inherited")}
		})
		inv := mustCollect(t, lib)
		if len(inv.Devices) != 1 || inv.Devices[0].MemoryMiB != nil {
			t.Fatalf("want one MIG device without memory, got %v", inv.Devices)
		}
		if w := inv.Devices[0].Warnings; len(w) != 1 || !strings.Contains(w[0], "memory") {
			t.Errorf("Warnings = %q, want just the instance's memory warning", w)
		}
	})
	t.Run("instance lost", func(t *testing.T) {
		lib := NewFake(FakeSpec{Count: 2, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920})
		inst := newMIG("MIG-1", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9856)
		inst.Lost = true
		lib.Devices()[0].Update(func(d *FakeDevice) { d.MIG = []*FakeDevice{inst} })
		inv := mustCollect(t, lib)
		if len(inv.Devices) != 1 || inv.Devices[0].Index != 1 {
			t.Fatalf("want only GPU 1 listed, got %v", inv.Devices)
		}
		if len(inv.Unreachable) != 1 || inv.Unreachable[0].Index != 0 || !errors.Is(inv.Unreachable[0].Err, ErrGPULost) {
			t.Errorf("Unreachable = %v, want GPU 0 lost", inv.Unreachable)
		}
	})
}

func TestMIGProfile(t *testing.T) {
	cases := map[string]string{
		"NVIDIA A100-SXM4-40GB MIG 1g.5gb":     "1g.5gb",
		"NVIDIA A100-SXM4-40GB MIG 3g.20gb":    "3g.20gb",
		"NVIDIA H100 80GB HBM3 MIG 1g.10gb":    "1g.10gb",
		"NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb": "1c.3g.20gb",
		"NVIDIA A30 MIG 2g.12gb ":              "2g.12gb",
		"Tesla T4":                             "",
		"":                                     "",
	}
	for name, want := range cases {
		if got := migProfile(name); got != want {
			t.Errorf("migProfile(%q) = %q, want %q", name, got, want)
		}
	}
}
