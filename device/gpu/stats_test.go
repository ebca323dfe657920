package gpu

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/nomad/plugins/device"
	"github.com/hashicorp/nomad/plugins/shared/structs"

	"github.com/gpujob/gpujob/device/nvml"
)

// statString prints a StatValue as Nomad would show it.
func statString(v *structs.StatValue) string {
	if v == nil {
		return "<missing>"
	}
	switch {
	case v.StringVal != nil:
		return *v.StringVal
	case v.FloatNumeratorVal != nil && v.FloatDenominatorVal != nil:
		return fmt.Sprintf("%g/%g %s", *v.FloatNumeratorVal, *v.FloatDenominatorVal, v.Unit)
	case v.FloatNumeratorVal != nil:
		return fmt.Sprintf("%g %s", *v.FloatNumeratorVal, v.Unit)
	case v.IntNumeratorVal != nil && v.IntDenominatorVal != nil:
		return fmt.Sprintf("%d/%d %s", *v.IntNumeratorVal, *v.IntDenominatorVal, v.Unit)
	case v.IntNumeratorVal != nil:
		return fmt.Sprintf("%d %s", *v.IntNumeratorVal, v.Unit)
	}
	return "<empty>"
}

func busy(d *nvml.FakeDevice) {
	d.Util = nvml.Utilization{GPU: 93, Memory: 40}
	d.Encoder, d.Decoder = 2, 4
	d.Mem.Used = 3 << 30
	d.Temp = 67
	d.PowerUsageMW, d.PowerLimitMW = 27500, 70000
	d.SMClockMHz = 1410
	d.ECCCorrected, d.ECCUncorrected = 12, 0
	d.Throttle = 0x4 | 0x40
}

var busyStats = map[string]string{
	StatGPUUtil:        "93 %",
	StatMemUtil:        "40 %",
	StatEncoderUtil:    "2 %",
	StatDecoderUtil:    "4 %",
	StatTemperature:    "67 C",
	StatMemory:         "3072/16384 MiB",
	StatBAR1:           "2/256 MiB",
	StatPower:          "27.5/70 W",
	StatSMClock:        "1410 MHz",
	StatECCCorrected:   "12 #",
	StatECCUncorrected: "0 #",
	StatThrottle:       "sw_power_cap,hw_thermal_slowdown",
	StatXidCount:       "0 #",
	StatXidLast:        "0 ",
}

// statsFor fingerprints lib, applies change, and collects stats once.
func statsFor(t *testing.T, lib *nvml.FakeLibrary, cfg Config, change func()) []*device.DeviceGroupStats {
	t.Helper()
	p := newPlugin(t, cfg, lib)
	fingerprintOnce(t, p)
	if change != nil {
		change()
	}
	return p.collectStats(time.Unix(1700000000, 0))
}

func instance(t *testing.T, groups []*device.DeviceGroupStats, uuid string) *device.DeviceStats {
	t.Helper()
	for _, g := range groups {
		if s, ok := g.InstanceStats[uuid]; ok {
			return s
		}
	}
	t.Fatalf("no stats for %s", uuid)
	return nil
}

func TestStatsValues(t *testing.T) {
	lib := newFakeLib(2, "Tesla T4")
	devs := lib.Devices()
	for _, d := range devs {
		d.Update(busy)
	}
	groups := statsFor(t, lib, testConfig(BackendNVML, "1h"), nil)
	if len(groups) != 1 {
		t.Fatalf("%d groups", len(groups))
	}
	g := groups[0]
	if g.Vendor != "nvidia" || g.Type != "gpu" || g.Name != "Tesla T4" || len(g.InstanceStats) != 2 {
		t.Fatalf("group %s/%s/%s with %d instances", g.Vendor, g.Type, g.Name, len(g.InstanceStats))
	}
	for _, d := range devs {
		s := instance(t, groups, d.UUIDValue)
		if !s.Timestamp.Equal(time.Unix(1700000000, 0)) {
			t.Errorf("timestamp %v", s.Timestamp)
		}
		if got := statString(s.Summary); got != "3072/16384 MiB" {
			t.Errorf("summary %q", got)
		}
		if len(s.Stats.Attributes) != len(busyStats) {
			t.Errorf("%d stats, want %d", len(s.Stats.Attributes), len(busyStats))
		}
		for name, want := range busyStats {
			if got := statString(s.Stats.Attributes[name]); got != want {
				t.Errorf("%s: %s = %q, want %q", d.UUIDValue, name, got, want)
			}
		}
	}
	pw := instance(t, groups, devs[0].UUIDValue).Stats.Attributes[StatPower]
	if *pw.FloatNumeratorVal != 27.5 || pw.Unit != "W" {
		t.Errorf("power %v %s, want 27.5 W (NVML's 27500 mW)", *pw.FloatNumeratorVal, pw.Unit)
	}
}

// TestStatsNotAvailable: a value one device cannot give is N/A for that
// device only.
func TestStatsNotAvailable(t *testing.T) {
	cases := []struct {
		name string
		set  func(d *nvml.FakeDevice)
		na   []string
	}{
		{"no temperature", func(d *nvml.FakeDevice) { d.Unsupported["Temperature"] = true }, []string{StatTemperature}},
		{"no ECC", func(d *nvml.FakeDevice) { d.Unsupported["ECCErrors"] = true }, []string{StatECCCorrected, StatECCUncorrected}},
		{"no utilisation", func(d *nvml.FakeDevice) { d.Unsupported["Utilization"] = true }, []string{StatGPUUtil, StatMemUtil}},
		{"no BAR1", func(d *nvml.FakeDevice) { d.Unsupported["BAR1Info"] = true }, []string{StatBAR1}},
		{"no power reading", func(d *nvml.FakeDevice) { d.Unsupported["PowerUsage"] = true }, []string{StatPower}},
		{"no throttle reasons", func(d *nvml.FakeDevice) { d.Unsupported["ThrottleReasons"] = true }, []string{StatThrottle}},
		{"memory query failing", func(d *nvml.FakeDevice) {
			d.Failing = map[string]error{"MemoryInfo": fmt.Errorf("nvml: unknown error")}
		}, []string{StatMemory}},
		{"lost after fingerprint", func(d *nvml.FakeDevice) { d.Lost = true }, nil}, // nil: all
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lib := newFakeLib(3, "Tesla T4")
			devs := lib.Devices()
			for _, d := range devs {
				d.Update(busy)
			}
			groups := statsFor(t, lib, testConfig(BackendNVML, "1h"), func() { devs[1].Update(tc.set) })
			if len(groups) != 1 || len(groups[0].InstanceStats) != 3 {
				t.Fatalf("the group must still hold every device: %+v", groups)
			}
			na := map[string]bool{}
			for _, n := range tc.na {
				na[n] = true
			}
			sick := instance(t, groups, devs[1].UUIDValue)
			for name, want := range busyStats {
				got := statString(sick.Stats.Attributes[name])
				// The Xid counts are the plugin's, not the device's: a lost
				// device keeps them.
				pluginOwn := name == StatXidCount || name == StatXidLast
				if tc.na == nil && !pluginOwn || na[name] {
					want = "N/A"
				}
				if got != want {
					t.Errorf("device 1 %s = %q, want %q", name, got, want)
				}
			}
			if tc.na == nil || na[StatMemory] {
				if got := statString(sick.Summary); got != "N/A" {
					t.Errorf("summary %q, want N/A", got)
				}
			}
			for _, d := range []*nvml.FakeDevice{devs[0], devs[2]} {
				s := instance(t, groups, d.UUIDValue)
				for name, want := range busyStats {
					if got := statString(s.Stats.Attributes[name]); got != want {
						t.Errorf("healthy neighbour %s: %s = %q, want %q", d.UUIDValue, name, got, want)
					}
				}
			}
		})
	}
}

func TestStatsPowerWithoutLimit(t *testing.T) {
	lib := newFakeLib(1, "Tesla T4")
	d := lib.Devices()[0]
	d.Update(busy)
	groups := statsFor(t, lib, testConfig(BackendNVML, "1h"), func() {
		d.Update(func(d *nvml.FakeDevice) { d.Unsupported["PowerLimit"] = true })
	})
	if got := statString(instance(t, groups, d.UUIDValue).Stats.Attributes[StatPower]); got != "27.5 W" {
		t.Errorf("power = %q, want 27.5 W", got)
	}
}

func TestStatsGroupsAndIgnored(t *testing.T) {
	lib, devs := a100s()
	cfg := testConfig(BackendNVML, "1h")
	cfg.IgnoredGPUIDs = []string{devs[1].UUIDValue}
	groups := statsFor(t, lib, cfg, nil)
	if len(groups) != 2 || groups[0].Name != "NVIDIA A100-SXM4-80GB" || groups[1].Name != "Tesla T4" {
		t.Fatalf("groups %+v", groups)
	}
	if _, ok := groups[0].InstanceStats[devs[1].UUIDValue]; ok || len(groups[0].InstanceStats) != 1 {
		t.Errorf("ignored GPU in stats: %v", groups[0].InstanceStats)
	}
}

func TestStatsMIG(t *testing.T) {
	lib := newFakeLib(1, "NVIDIA A100-SXM4-40GB")
	inst := nvml.NewFakeDevice(nvml.FakeSpec{Model: "NVIDIA A100-SXM4-40GB MIG 1g.5gb", MemoryMiB: 4864}, 0)
	inst.UUIDValue = "MIG-1"
	inst.Mem.Used = 1 << 30
	inst.Unsupported["Utilization"] = true
	lib.Devices()[0].Update(func(d *nvml.FakeDevice) { d.MIG = []*nvml.FakeDevice{inst}; busy(d) })
	groups := statsFor(t, lib, testConfig(BackendNVML, "1h"), nil)
	s := instance(t, groups, "MIG-1")
	if got := statString(s.Stats.Attributes[StatMemory]); got != "1024/4864 MiB" {
		t.Errorf("MIG memory %q, want the instance's 1024/4864 MiB", got)
	}
	if got := statString(s.Stats.Attributes[StatGPUUtil]); got != "N/A" {
		t.Errorf("MIG utilisation %q, want N/A", got)
	}
}

// TestStatsStream: Stats sends a sample every interval until the context
// ends, then closes the channel.
func TestStatsStream(t *testing.T) {
	lib := newFakeLib(2, "Tesla T4")
	p := newPlugin(t, testConfig(BackendNVML, "1h"), lib)
	fingerprintOnce(t, p)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := p.Stats(ctx, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var last time.Time
	for i := 0; i < 3; i++ {
		select {
		case r := <-ch:
			if r.Error != nil || len(r.Groups) != 1 || len(r.Groups[0].InstanceStats) != 2 {
				t.Fatalf("response %d: %+v", i, r)
			}
			ts := r.Groups[0].InstanceStats[lib.Devices()[0].UUIDValue].Timestamp
			if !ts.After(last) {
				t.Errorf("timestamp %v not after %v", ts, last)
			}
			last = ts
		case <-time.After(wait):
			t.Fatalf("no stats response %d", i)
		}
	}
	cancel()
	deadline := time.After(wait)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("stats channel not closed after cancel")
		}
	}
}
