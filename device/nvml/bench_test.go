package nvml

import "testing"

// BenchmarkRead8 samples 8 GPUs once (every stat of every device), through
// the fake and through the real go-nvml adapter over go-nvml's simulated
// DGX H100: the difference is the adapter's cost per collection, apart from
// NVML's own latency (which only a GPU machine can measure).
func BenchmarkRead8(b *testing.B) {
	real, _ := dgxH100(b)
	fake := NewFake(FakeSpec{Count: 8, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, Seed: "bench"})
	for _, bc := range []struct {
		name string
		lib  Library
	}{{"fake", fake}, {"real-adapter-simulated-dgx-h100", real}} {
		var devs []Device
		for i := 0; i < 8; i++ {
			d, err := bc.lib.DeviceByIndex(i)
			if err != nil {
				b.Fatal(err)
			}
			devs = append(devs, d)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, d := range devs {
					if s := Read(d); s.TemperatureC == nil {
						b.Fatal("no temperature")
					}
				}
			}
		})
	}
}

// BenchmarkReadRealNVML is the real NVML's cost of one full sample per
// device (every stat the plugin reports), on a machine with a GPU; it skips
// elsewhere. scripts/gpu-check.sh runs it.
func BenchmarkReadRealNVML(b *testing.B) {
	lib := New()
	if err := lib.Init(); err != nil {
		b.Skipf("no NVIDIA driver here: %v", err)
	}
	defer lib.Shutdown()
	inv, err := Collect(lib)
	if err != nil {
		b.Fatal(err)
	}
	if len(inv.Devices) == 0 {
		b.Skip("NVML lists no device")
	}
	b.ResetTimer()
	for b.Loop() {
		for _, d := range inv.Devices {
			Read(d.Handle)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(inv.Devices))/1e3, "µs/device")
}
