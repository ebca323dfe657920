package gpu

import (
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/device"
	"github.com/hashicorp/nomad/plugins/shared/structs"

	"github.com/gpujob/gpujob/device/nvml"
)

func intAttr(v int64, unit string) *structs.Attribute { return structs.NewIntAttribute(v, unit) }
func strAttr(v string) *structs.Attribute             { return structs.NewStringAttribute(v) }

func attrString(m map[string]*structs.Attribute) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + "=" + m[k].GoString() + " ")
	}
	return b.String()
}

// a100s is a machine with two A100s that agree on everything but their bus
// and one T4.
func a100s() (*nvml.FakeLibrary, []*nvml.FakeDevice) {
	lib := newFakeLib(3, "NVIDIA A100-SXM4-80GB")
	devs := lib.Devices()
	for _, d := range devs[:2] {
		d.Update(func(d *nvml.FakeDevice) {
			d.Mem.Total = 80 << 30
			d.BAR1.Total = 128 << 30
			d.PowerLimitMW = 400000
			d.MaxSMClock, d.MaxMemClock = 1410, 1593
			d.PCIeGen, d.PCIeWidth = 4, 16
			d.CCMajor, d.CCMinor = 8, 0
			d.NUMA = 1
		})
	}
	devs[0].Update(func(d *nvml.FakeDevice) { d.NVLinks = map[int]string{0: devs[1].BusID, 1: devs[1].BusID} })
	devs[1].Update(func(d *nvml.FakeDevice) { d.NVLinks = map[int]string{0: devs[0].BusID, 1: devs[0].BusID} })
	devs[2].Update(func(d *nvml.FakeDevice) {
		d.NameValue = "Tesla T4"
		d.Mem.Total = 15360 << 20
		d.Display = true
	})
	return lib, devs
}

func TestFingerprintGroupsAndAttributes(t *testing.T) {
	lib, devs := a100s()
	p := newPlugin(t, testConfig(BackendNVML, "1h"), lib)
	groups := nextDevices(t, fingerprints(t, p), wait)
	if len(groups) != 2 {
		t.Fatalf("got %d groups, want 2 (one per model): %s", len(groups), describeGroups(groups))
	}
	a100, t4 := groups[0], groups[1]
	if a100.Name != "NVIDIA A100-SXM4-80GB" || t4.Name != "Tesla T4" {
		t.Fatalf("groups %q, %q", a100.Name, t4.Name)
	}
	for _, g := range groups {
		if g.Vendor != "nvidia" || g.Type != "gpu" {
			t.Errorf("group %q is %s/%s, want nvidia/gpu", g.Name, g.Vendor, g.Type)
		}
	}
	wantIDs := [][]string{{devs[0].UUIDValue, devs[1].UUIDValue}, {devs[2].UUIDValue}}
	for i, g := range groups {
		var ids []string
		for j, d := range g.Devices {
			ids = append(ids, d.ID)
			if !d.Healthy || d.HealthDesc != "" {
				t.Errorf("%s unhealthy: %q", d.ID, d.HealthDesc)
			}
			want := devs[i*2+j].BusID
			if d.HwLocality == nil || d.HwLocality.PciBusID != want {
				t.Errorf("%s HwLocality = %+v, want PciBusID %s", d.ID, d.HwLocality, want)
			}
		}
		if !reflect.DeepEqual(ids, wantIDs[i]) {
			t.Errorf("group %q IDs %v, want %v (the UUIDs in index order)", g.Name, ids, wantIDs[i])
		}
	}

	wantA100 := map[string]*structs.Attribute{
		"memory":              intAttr(81920, "MiB"),
		"bar1":                intAttr(131072, "MiB"),
		"power":               intAttr(400, "W"),
		"cores_clock":         intAttr(1410, "MHz"),
		"memory_clock":        intAttr(1593, "MHz"),
		"pci_bandwidth":       intAttr(1969*16, "MB/s"),
		"display_state":       strAttr("Disabled"),
		"persistence_mode":    strAttr("Enabled"),
		"driver_version":      strAttr("550.54.15"),
		"compute_capability":  strAttr("8.0"),
		"cuda_driver_version": strAttr("12.4"),
		"numa_node":           intAttr(1, ""),
		"nvlink_links":        intAttr(2, ""),
		"nvlink_peers":        intAttr(1, ""),
		// no pci_bus_id: the two A100s differ, a group cannot claim either
	}
	if !reflect.DeepEqual(a100.Attributes, wantA100) {
		t.Errorf("A100 attributes:\n got %s\nwant %s", attrString(a100.Attributes), attrString(wantA100))
	}
	wantT4 := map[string]*structs.Attribute{
		"memory":              intAttr(15360, "MiB"),
		"bar1":                intAttr(256, "MiB"),
		"power":               intAttr(70, "W"),
		"cores_clock":         intAttr(1590, "MHz"),
		"memory_clock":        intAttr(5001, "MHz"),
		"pci_bandwidth":       intAttr(985*16, "MB/s"),
		"display_state":       strAttr("Enabled"),
		"persistence_mode":    strAttr("Enabled"),
		"driver_version":      strAttr("550.54.15"),
		"compute_capability":  strAttr("7.5"),
		"cuda_driver_version": strAttr("12.4"),
		"numa_node":           intAttr(0, ""),
		"pci_bus_id":          strAttr(devs[2].BusID), // one device: uniform
		"nvlink_links":        intAttr(0, ""),
		"nvlink_peers":        intAttr(0, ""),
	}
	if !reflect.DeepEqual(t4.Attributes, wantT4) {
		t.Errorf("T4 attributes:\n got %s\nwant %s", attrString(t4.Attributes), attrString(wantT4))
	}
}

// TestFingerprintAttributeUnits checks the units nomad-device-nvidia jobspecs
// rely on convert as they do there: ${device.attr.memory} >= 8 GiB.
func TestFingerprintAttributeUnits(t *testing.T) {
	lib, _ := a100s()
	groups := fingerprintOnce(t, newPlugin(t, testConfig(BackendNVML, "1h"), lib))
	mem := groups[0].Attributes["memory"]
	if cmp, ok := mem.Compare(structs.NewIntAttribute(8, structs.UnitGiB)); !ok || cmp <= 0 {
		t.Errorf("memory %s is not comparable and greater than 8 GiB (cmp %d ok %v)", mem.GoString(), cmp, ok)
	}
	if cmp, ok := mem.Compare(structs.NewIntAttribute(80, structs.UnitGiB)); !ok || cmp != 0 {
		t.Errorf("memory %s != 80 GiB", mem.GoString())
	}
	pw := groups[0].Attributes["power"]
	if cmp, ok := pw.Compare(structs.NewIntAttribute(400000, structs.UnitmW)); !ok || cmp != 0 {
		t.Errorf("power %s != 400000 mW", pw.GoString())
	}
}

func TestFingerprintPerDeviceDifferences(t *testing.T) {
	cases := []struct {
		name    string
		set     func(d *nvml.FakeDevice) // applied to device 1 of 2
		omitted []string
		kept    []string
	}{
		{"NUMA differs", func(d *nvml.FakeDevice) { d.NUMA = 1 }, []string{"numa_node", "pci_bus_id"}, []string{"memory", "power"}},
		{"power limit differs", func(d *nvml.FakeDevice) { d.PowerLimitMW = 60000 }, []string{"power"}, []string{"numa_node", "memory"}},
		{"BAR1 unsupported on one", func(d *nvml.FakeDevice) { d.Unsupported["BAR1Info"] = true }, []string{"bar1"}, []string{"memory"}},
		{"NVLinks on one", func(d *nvml.FakeDevice) { d.NVLinks = map[int]string{0: "00000000:99:00.0"} },
			[]string{"nvlink_links", "nvlink_peers"}, []string{"memory"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lib := newFakeLib(2, "Tesla T4")
			lib.Devices()[1].Update(tc.set)
			groups := fingerprintOnce(t, newPlugin(t, testConfig(BackendNVML, "1h"), lib))
			if len(groups) != 1 || len(groups[0].Devices) != 2 {
				t.Fatalf("want one group of 2: %s", describeGroups(groups))
			}
			for _, k := range tc.omitted {
				if v, ok := groups[0].Attributes[k]; ok {
					t.Errorf("%s = %s claimed for the group though the devices differ", k, v.GoString())
				}
			}
			for _, k := range tc.kept {
				if _, ok := groups[0].Attributes[k]; !ok {
					t.Errorf("%s missing though every device agrees", k)
				}
			}
		})
	}
}

// TestFingerprintUnsupportedOmitted: a field NVML does not support (or fails
// to read) on every device is absent, never a zero.
func TestFingerprintUnsupportedOmitted(t *testing.T) {
	cases := []struct {
		method  string
		failing bool
		attrs   []string
	}{
		{"BAR1Info", false, []string{"bar1"}},
		{"PowerLimit", false, []string{"power"}},
		{"MaxClocks", false, []string{"cores_clock", "memory_clock"}},
		{"MaxPCIeLink", false, []string{"pci_bandwidth"}},
		{"DisplayMode", false, []string{"display_state"}},
		{"PersistenceMode", false, []string{"persistence_mode"}},
		{"ComputeCapability", false, []string{"compute_capability"}},
		{"NUMANode", false, []string{"numa_node"}},
		{"MemoryInfo", true, []string{"memory"}},
		{"PowerLimit", true, []string{"power"}},
	}
	for _, tc := range cases {
		name := tc.method
		if tc.failing {
			name += "/failing"
		}
		t.Run(name, func(t *testing.T) {
			lib := newFakeLib(2, "NVIDIA GH200 480GB")
			for _, d := range lib.Devices() {
				d.Update(func(d *nvml.FakeDevice) {
					if tc.failing {
						d.Failing = map[string]error{tc.method: errors.New("nvml: unknown error")}
					} else {
						d.Unsupported[tc.method] = true
					}
				})
			}
			logger, logs := captureLogger()
			p := New(logger, func(string, nvml.FakeSpec) nvml.Library { return lib })
			if err := p.SetConfig(encode(t, testConfig(BackendNVML, "1h"))); err != nil {
				t.Fatal(err)
			}
			groups := fingerprintOnce(t, p)
			if countDevices(groups) != 2 {
				t.Fatalf("devices hidden: %s", describeGroups(groups))
			}
			warned := strings.Contains(logs.String(), "attribute omitted") && strings.Contains(logs.String(), "unknown error")
			if warned != tc.failing {
				t.Errorf("warning logged = %v, want %v (only for failures, not for unsupported):\n%s", warned, tc.failing, logs)
			}
			for _, k := range tc.attrs {
				if v, ok := groups[0].Attributes[k]; ok {
					t.Errorf("%s = %s reported though unsupported", k, v.GoString())
				}
			}
			if _, ok := groups[0].Attributes["driver_version"]; !ok {
				t.Errorf("other attributes lost: %s", attrString(groups[0].Attributes))
			}
		})
	}
}

func TestFingerprintFakeBackendSaysSo(t *testing.T) {
	for _, tc := range []struct {
		backend string
		want    bool
	}{{BackendFake, true}, {BackendNVML, false}} {
		t.Run(tc.backend, func(t *testing.T) {
			groups := fingerprintOnce(t, newPlugin(t, testConfig(tc.backend, "1h"), newFakeLib(2, "Tesla T4")))
			a, ok := groups[0].Attributes["fake"]
			if tc.want && (!ok || a.Bool == nil || !*a.Bool) {
				t.Errorf("fake attribute = %v, want true", a)
			}
			if !tc.want && ok {
				t.Errorf("fake attribute %s on the nvml backend", a.GoString())
			}
		})
	}
}

// TestFingerprintDefaultLibraryFake runs the production factory's fake
// backend end to end.
func TestFingerprintDefaultLibraryFake(t *testing.T) {
	p := New(log.NewNullLogger(), DefaultLibrary)
	cfg := Config{Enabled: true, Backend: BackendFake, Fake: &FakeConfig{Count: 4, Model: "Tesla T4", MemoryMiB: 15360, IDSeed: "n1"}}
	if err := p.SetConfig(encode(t, cfg)); err != nil {
		t.Fatal(err)
	}
	groups := fingerprintOnce(t, p)
	if len(groups) != 1 || len(groups[0].Devices) != 4 {
		t.Fatalf("want 4 Tesla T4s: %s", describeGroups(groups))
	}
	if m := groups[0].Attributes["memory"]; m == nil || *m.Int != 15360 {
		t.Errorf("memory = %v", m)
	}
	seen := map[string]bool{}
	for _, d := range groups[0].Devices {
		if !strings.HasPrefix(d.ID, "GPU-") || seen[d.ID] || !d.Healthy {
			t.Errorf("device %+v", d)
		}
		seen[d.ID] = true
	}
}

func TestFingerprintMIG(t *testing.T) {
	lib := newFakeLib(2, "NVIDIA A100-SXM4-40GB")
	devs := lib.Devices()
	mig := func(uuid, profile string, mib uint64) *nvml.FakeDevice {
		d := nvml.NewFakeDevice(nvml.FakeSpec{Model: "NVIDIA A100-SXM4-40GB MIG " + profile, MemoryMiB: mib}, 0)
		d.UUIDValue = uuid
		return d
	}
	devs[0].Update(func(d *nvml.FakeDevice) {
		d.MIG = []*nvml.FakeDevice{mig("MIG-a", "1g.5gb", 4864), mig("MIG-b", "1g.5gb", 4864), mig("MIG-c", "3g.20gb", 19968)}
	})
	p := newPlugin(t, testConfig(BackendNVML, "1h"), lib)
	ch := fingerprints(t, p)
	groups := nextDevices(t, ch, wait)
	if len(groups) != 3 {
		t.Fatalf("want 3 groups (whole A100, 1g.5gb, 3g.20gb): %s", describeGroups(groups))
	}
	if d, _ := findDevice(groups, devs[0].UUIDValue); d != nil {
		t.Errorf("MIG parent listed")
	}
	whole, small, big := groups[0], groups[1], groups[2]
	if whole.Name != "NVIDIA A100-SXM4-40GB" || len(whole.Devices) != 1 || whole.Devices[0].ID != devs[1].UUIDValue {
		t.Errorf("whole-GPU group: %s", describeGroups([]*device.DeviceGroup{whole}))
	}
	if _, ok := whole.Attributes["mig_profile"]; ok {
		t.Errorf("mig_profile on a whole GPU")
	}
	for _, tc := range []struct {
		g       *device.DeviceGroup
		ids     []string
		profile string
		mib     int64
	}{
		{small, []string{"MIG-a", "MIG-b"}, "1g.5gb", 4864},
		{big, []string{"MIG-c"}, "3g.20gb", 19968},
	} {
		var ids []string
		for _, d := range tc.g.Devices {
			ids = append(ids, d.ID)
			if d.HwLocality == nil || d.HwLocality.PciBusID != devs[0].BusID {
				t.Errorf("%s HwLocality %+v, want the parent's bus %s", d.ID, d.HwLocality, devs[0].BusID)
			}
		}
		if !reflect.DeepEqual(ids, tc.ids) {
			t.Errorf("group %q IDs %v, want %v", tc.g.Name, ids, tc.ids)
		}
		a := tc.g.Attributes
		if !reflect.DeepEqual(a["mig_profile"], strAttr(tc.profile)) || !reflect.DeepEqual(a["memory"], intAttr(tc.mib, "MiB")) {
			t.Errorf("group %q: %s", tc.g.Name, attrString(a))
		}
		if !reflect.DeepEqual(a["pci_bus_id"], strAttr(devs[0].BusID)) {
			t.Errorf("group %q: pci_bus_id %v, want the parent's", tc.g.Name, a["pci_bus_id"])
		}
		if _, ok := a["nvlink_links"]; ok {
			t.Errorf("group %q: NVLink attributes on MIG instances", tc.g.Name)
		}
	}
}

func TestFingerprintIgnoredGPUs(t *testing.T) {
	lib := newFakeLib(3, "Tesla T4")
	devs := lib.Devices()
	cfg := testConfig(BackendNVML, "1h")
	cfg.IgnoredGPUIDs = []string{devs[1].UUIDValue, "GPU-not-on-this-node"}
	groups := fingerprintOnce(t, newPlugin(t, cfg, lib))
	if countDevices(groups) != 2 {
		t.Fatalf("want 2 devices: %s", describeGroups(groups))
	}
	if d, _ := findDevice(groups, devs[1].UUIDValue); d != nil {
		t.Errorf("ignored GPU %s listed", d.ID)
	}
}

func TestFingerprintIgnoredMIGParent(t *testing.T) {
	lib := newFakeLib(2, "NVIDIA A100-SXM4-40GB")
	devs := lib.Devices()
	inst := nvml.NewFakeDevice(nvml.FakeSpec{Model: "NVIDIA A100-SXM4-40GB MIG 1g.5gb", MemoryMiB: 4864}, 0)
	inst.UUIDValue = "MIG-x"
	devs[0].Update(func(d *nvml.FakeDevice) { d.MIG = []*nvml.FakeDevice{inst} })
	cfg := testConfig(BackendNVML, "1h")
	cfg.IgnoredGPUIDs = []string{devs[0].UUIDValue}
	groups := fingerprintOnce(t, newPlugin(t, cfg, lib))
	if countDevices(groups) != 1 || groups[0].Devices[0].ID != devs[1].UUIDValue {
		t.Errorf("ignoring a MIG parent must hide its instances: %s", describeGroups(groups))
	}
}

// TestFingerprintNoChangeNoResend: Nomad re-evaluates the node on every
// fingerprint, so an unchanged machine sends exactly one.
func TestFingerprintNoChangeNoResend(t *testing.T) {
	lib, _ := a100s()
	// A GPU whose values churn between reads (power draw, clocks, usage) must
	// not cause a resend: they are stats, not fingerprint.
	p := newPlugin(t, testConfig(BackendNVML, "10ms"), lib)
	ch := fingerprints(t, p)
	nextDevices(t, ch, wait)
	for i, d := range lib.Devices() {
		d.Update(func(d *nvml.FakeDevice) {
			d.PowerUsageMW += 1000
			d.SMClockMHz = uint32(900 + i)
			d.Mem.Used = 1 << 30
			d.Temp = 80
			d.ECCCorrected = 5
		})
	}
	quiet(t, ch, 250*time.Millisecond) // 25 periods
}

func TestFingerprintDeviceSetChange(t *testing.T) {
	lib := newFakeLib(3, "Tesla T4")
	devs := lib.Devices()
	p := newPlugin(t, testConfig(BackendNVML, "20ms"), lib)
	ch := fingerprints(t, p)
	if n := countDevices(nextDevices(t, ch, wait)); n != 3 {
		t.Fatalf("first fingerprint has %d devices", n)
	}

	lib.SetDevices(devs[:2])
	groups := nextDevices(t, ch, wait)
	if countDevices(groups) != 2 {
		t.Fatalf("after removing a GPU: %s", describeGroups(groups))
	}
	if d, _ := findDevice(groups, devs[2].UUIDValue); d != nil {
		t.Errorf("removed GPU still listed")
	}

	extra := nvml.NewFakeDevice(nvml.FakeSpec{Model: "NVIDIA L4", MemoryMiB: 23034, Seed: "hotplug"}, 5)
	lib.SetDevices([]*nvml.FakeDevice{devs[0], devs[1], extra})
	groups = nextDevices(t, ch, wait)
	if d, g := findDevice(groups, extra.UUIDValue); d == nil || g.Name != "NVIDIA L4" {
		t.Errorf("added GPU missing: %s", describeGroups(groups))
	}
	quiet(t, ch, 100*time.Millisecond)
}

// TestFingerprintAttributeChange: a changed attribute (driver reload with a
// new power limit) is a change too.
func TestFingerprintAttributeChange(t *testing.T) {
	lib := newFakeLib(1, "Tesla T4")
	p := newPlugin(t, testConfig(BackendNVML, "20ms"), lib)
	ch := fingerprints(t, p)
	nextDevices(t, ch, wait)
	lib.Devices()[0].Update(func(d *nvml.FakeDevice) { d.PowerLimitMW = 60000 })
	groups := nextDevices(t, ch, wait)
	if p := groups[0].Attributes["power"]; p == nil || *p.Int != 60 {
		t.Errorf("power = %v, want 60 W", p)
	}
}

func TestFingerprintInitFailure(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want []string
	}{
		{"library missing", nvml.ErrLibraryNotFound, []string{"libnvidia-ml.so.1", `backend "nvml"`, `backend = "fake"`}},
		{"driver not loaded", nvml.ErrDriverNotLoaded, []string{"kernel driver is not loaded"}},
		{"driver mismatch", errors.New("nvml Init: Driver/library version mismatch"), []string{"version mismatch"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lib := newFakeLib(2, "Tesla T4")
			lib.SetInitError(tc.err)
			p := newPlugin(t, testConfig(BackendNVML, "1h"), lib) // SetConfig itself succeeds
			ch := fingerprints(t, p)
			r := next(t, ch, wait)
			if r.Error == nil {
				t.Fatalf("fingerprint without NVML: %s", describeGroups(r.Devices))
			}
			if !errors.Is(r.Error, tc.err) {
				t.Errorf("error %v does not wrap %v", r.Error, tc.err)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.Error.Error(), w) {
					t.Errorf("error %q does not say %q", r.Error, w)
				}
			}
			select {
			case _, ok := <-ch:
				if ok {
					t.Errorf("a second response after the error")
				}
			case <-time.After(wait):
				t.Errorf("channel not closed after the error")
			}

			sch, err := p.Stats(t.Context(), time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			select {
			case s := <-sch:
				if s == nil || s.Error == nil || !errors.Is(s.Error, tc.err) {
					t.Errorf("stats = %+v, want the init error", s)
				}
			case <-time.After(wait):
				t.Fatal("no stats response")
			}
			if r, err := p.Reserve([]string{lib.Devices()[0].UUIDValue}); err == nil {
				t.Errorf("Reserve without NVML succeeded: %+v", r)
			}
		})
	}
}

// TestSetConfigRecovers: a SetConfig after NVML became usable (driver
// installed, plugin reconfigured) fingerprints normally.
func TestSetConfigRecovers(t *testing.T) {
	lib := newFakeLib(2, "Tesla T4")
	lib.SetInitError(nvml.ErrLibraryNotFound)
	p := newPlugin(t, testConfig(BackendNVML, "1h"), lib)
	if r := next(t, fingerprints(t, p), wait); r.Error == nil {
		t.Fatal("want an error first")
	}
	lib.SetInitError(nil)
	if err := p.SetConfig(encode(t, testConfig(BackendNVML, "1h"))); err != nil {
		t.Fatal(err)
	}
	if n := countDevices(fingerprintOnce(t, p)); n != 2 {
		t.Errorf("%d devices after recovery, want 2", n)
	}
}

// brokenLib answers Init but not the inventory.
type brokenLib struct {
	*nvml.FakeLibrary
	mu  chan struct{}
	err error
}

func (b *brokenLib) DriverVersion() (string, error) {
	<-b.mu
	err := b.err
	b.mu <- struct{}{}
	if err != nil {
		return "", err
	}
	return b.FakeLibrary.DriverVersion()
}

func (b *brokenLib) set(err error) {
	<-b.mu
	b.err = err
	b.mu <- struct{}{}
}

func newBrokenLib(lib *nvml.FakeLibrary, err error) *brokenLib {
	b := &brokenLib{FakeLibrary: lib, mu: make(chan struct{}, 1), err: err}
	b.mu <- struct{}{}
	return b
}

func TestFingerprintNVMLFailsFromTheStart(t *testing.T) {
	lib := newBrokenLib(newFakeLib(2, "Tesla T4"), errors.New("nvml: GPU access blocked by the operating system"))
	p := newPlugin(t, testConfig(BackendNVML, "1h"), lib)
	r := next(t, fingerprints(t, p), wait)
	if r.Error == nil || !strings.Contains(r.Error.Error(), "access blocked") {
		t.Fatalf("fingerprint = %+v, want the NVML error", r)
	}
}

// TestFingerprintNVMLStopsAnswering: after a good fingerprint, NVML failing
// as a whole marks every known GPU unhealthy rather than dropping them.
func TestFingerprintNVMLStopsAnswering(t *testing.T) {
	lib := newBrokenLib(newFakeLib(2, "Tesla T4"), nil)
	p := newPlugin(t, testConfig(BackendNVML, "20ms"), lib)
	ch := fingerprints(t, p)
	if n := countDevices(nextDevices(t, ch, wait)); n != 2 {
		t.Fatalf("%d devices", n)
	}
	lib.set(errors.New("nvml: unknown error"))
	groups := nextDevices(t, ch, wait)
	if countDevices(groups) != 2 {
		t.Fatalf("GPUs dropped: %s", describeGroups(groups))
	}
	for _, d := range groups[0].Devices {
		if d.Healthy || !strings.Contains(d.HealthDesc, "NVML stopped answering") {
			t.Errorf("%s: healthy %v %q", d.ID, d.Healthy, d.HealthDesc)
		}
	}
	quiet(t, ch, 100*time.Millisecond) // the failure is reported once
	lib.set(nil)
	groups = nextDevices(t, ch, wait)
	for _, d := range groups[0].Devices {
		if !d.Healthy {
			t.Errorf("%s still unhealthy after NVML recovered: %q", d.ID, d.HealthDesc)
		}
	}
}

// TestFingerprintRealBackendWithoutDriver: the production nvml backend on a
// machine without NVIDIA's library keeps the plugin up and says what is
// missing (skipped on a GPU machine, where it works).
func TestFingerprintRealBackendWithoutDriver(t *testing.T) {
	if err := nvml.New().Init(); err == nil {
		t.Skip("this machine has NVML")
	}
	p := New(log.NewNullLogger(), DefaultLibrary)
	if err := p.SetConfig(encode(t, Config{Enabled: true, Backend: BackendNVML})); err != nil {
		t.Fatalf("SetConfig must succeed without NVML: %v", err)
	}
	r := next(t, fingerprints(t, p), wait)
	if r.Error == nil {
		t.Fatalf("fingerprint without NVML: %s", describeGroups(r.Devices))
	}
	for _, w := range []string{"NVIDIA", `backend = "fake"`} {
		if !strings.Contains(r.Error.Error(), w) {
			t.Errorf("error %q does not say %q", r.Error, w)
		}
	}
}
