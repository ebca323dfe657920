package gpu

import (
	"testing"
	"time"

	log "github.com/hashicorp/go-hclog"

	"github.com/gpujob/gpujob/device/nvml"
)

// BenchmarkCollectStats8 is one stats collection (every value of every device
// read through the seam and converted) over 8 fake GPUs.
func BenchmarkCollectStats8(b *testing.B) {
	lib := nvml.NewFake(nvml.FakeSpec{Count: 8, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, Seed: "bench"})
	p := New(log.NewNullLogger(), func(string, nvml.FakeSpec) nvml.Library { return lib })
	if err := p.SetConfig(encode(b, Config{Enabled: true, FingerprintPeriod: "1h"})); err != nil {
		b.Fatal(err)
	}
	if _, _, err := p.refresh(lib, p.cfg); err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		groups := p.collectStats(now)
		if len(groups) != 1 || len(groups[0].InstanceStats) != 8 {
			b.Fatalf("collected %+v", groups)
		}
	}
}

// BenchmarkFingerprint8 is one fingerprint pass (inventory, health, groups)
// over 8 fake GPUs.
func BenchmarkFingerprint8(b *testing.B) {
	lib := nvml.NewFake(nvml.FakeSpec{Count: 8, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, Seed: "bench"})
	p := New(log.NewNullLogger(), func(string, nvml.FakeSpec) nvml.Library { return lib })
	if err := p.SetConfig(encode(b, Config{Enabled: true, FingerprintPeriod: "1h"})); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := p.refresh(lib, p.cfg); err != nil {
			b.Fatal(err)
		}
	}
}
