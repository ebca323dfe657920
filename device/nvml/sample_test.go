package nvml

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
)

func f64(v float64) *float64 { return &v }

func busyDevice() *FakeDevice {
	d := NewFakeDevice(FakeSpec{Model: "Tesla T4", MemoryMiB: 15360}, 0)
	d.Util = Utilization{GPU: 87, Memory: 41}
	d.Encoder, d.Decoder = 3, 5
	d.Mem.Used = 1 << 30
	d.BAR1 = Memory{Total: 256 << 20, Used: 2 << 20}
	d.Temp = 61
	d.PowerUsageMW, d.PowerLimitMW = 27500, 70000
	d.SMClockMHz = 1410
	d.ECCCorrected, d.ECCUncorrected = 7, 0
	d.Throttle = 0x4
	return d
}

func fullSample() Sample {
	return Sample{
		GPUUtilPct: u32(87), MemUtilPct: u32(41), EncoderUtilPct: u32(3), DecoderUtilPct: u32(5),
		MemUsedMiB: u64(1024), MemTotalMiB: u64(15360), BAR1UsedMiB: u64(2), BAR1TotalMiB: u64(256),
		TemperatureC: u32(61), PowerW: f64(27.5), PowerLimitW: f64(70), SMClockMHz: u32(1410),
		ECCCorrected: u64(7), ECCUncorrected: u64(0), ThrottleReasons: u64(0x4),
	}
}

// TestRead: every value converted (mW to W, bytes to MiB), and a query a
// device cannot answer leaves just its own fields nil.
func TestRead(t *testing.T) {
	cases := []struct {
		name string
		set  func(d *FakeDevice)
		want func(s *Sample)
	}{
		{"all values", func(*FakeDevice) {}, func(*Sample) {}},
		{"no utilisation (MIG)", func(d *FakeDevice) { d.Unsupported["Utilization"] = true },
			func(s *Sample) { s.GPUUtilPct, s.MemUtilPct = nil, nil }},
		{"no encoder", func(d *FakeDevice) { d.Unsupported["EncoderUtilization"] = true },
			func(s *Sample) { s.EncoderUtilPct = nil }},
		{"no decoder", func(d *FakeDevice) { d.Unsupported["DecoderUtilization"] = true },
			func(s *Sample) { s.DecoderUtilPct = nil }},
		{"memory failing", func(d *FakeDevice) { d.Failing = map[string]error{"MemoryInfo": errors.New("x")} },
			func(s *Sample) { s.MemUsedMiB, s.MemTotalMiB = nil, nil }},
		{"no BAR1 (GH200)", func(d *FakeDevice) { d.Unsupported["BAR1Info"] = true },
			func(s *Sample) { s.BAR1UsedMiB, s.BAR1TotalMiB = nil, nil }},
		{"no temperature", func(d *FakeDevice) { d.Unsupported["Temperature"] = true },
			func(s *Sample) { s.TemperatureC = nil }},
		{"no power usage", func(d *FakeDevice) { d.Unsupported["PowerUsage"] = true },
			func(s *Sample) { s.PowerW = nil }},
		{"no power limit", func(d *FakeDevice) { d.Unsupported["PowerLimit"] = true },
			func(s *Sample) { s.PowerLimitW = nil }},
		{"no SM clock", func(d *FakeDevice) { d.Unsupported["SMClock"] = true },
			func(s *Sample) { s.SMClockMHz = nil }},
		{"no ECC (consumer card)", func(d *FakeDevice) { d.Unsupported["ECCErrors"] = true },
			func(s *Sample) { s.ECCCorrected, s.ECCUncorrected = nil, nil }},
		{"no throttle reasons", func(d *FakeDevice) { d.Unsupported["ThrottleReasons"] = true },
			func(s *Sample) { s.ThrottleReasons = nil }},
		{"fractional watts", func(d *FakeDevice) { d.PowerUsageMW, d.PowerLimitMW = 301, 450000 },
			func(s *Sample) { s.PowerW, s.PowerLimitW = f64(0.301), f64(450) }},
		{"lost: everything N/A", func(d *FakeDevice) { d.Lost = true }, func(s *Sample) { *s = Sample{} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := busyDevice()
			d.Update(tc.set)
			want := fullSample()
			tc.want(&want)
			if got := Read(d); !reflect.DeepEqual(got, want) {
				t.Errorf("Read:\n got %s\nwant %s", sampleString(got), sampleString(want))
			}
		})
	}
}

// sampleString prints a Sample's pointers as values.
func sampleString(s Sample) string {
	v := reflect.ValueOf(s)
	out := "{"
	for i := 0; i < v.NumField(); i++ {
		out += v.Type().Field(i).Name + "="
		if f := v.Field(i); f.IsNil() {
			out += "nil "
		} else {
			out += fmt.Sprint(f.Elem().Interface()) + " "
		}
	}
	return out + "}"
}

func TestThrottleReasonNames(t *testing.T) {
	cases := []struct {
		mask uint64
		want []string
	}{
		{0, []string{"none"}},
		{0x1, []string{"gpu_idle"}},
		{0x4, []string{"sw_power_cap"}},
		{0x4 | 0x40, []string{"sw_power_cap", "hw_thermal_slowdown"}},
		{0x8 | 0x80, []string{"hw_slowdown", "hw_power_brake_slowdown"}},
		{0x100, []string{"display_clock_setting"}},
		{0x1000, []string{"other"}},
		{0x20 | 0x1000, []string{"sw_thermal_slowdown", "other"}},
		{0x1ff, []string{"gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
			"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting"}},
	}
	for _, tc := range cases {
		if got := ThrottleReasonNames(tc.mask); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ThrottleReasonNames(%#x) = %v, want %v", tc.mask, got, tc.want)
		}
	}
}
