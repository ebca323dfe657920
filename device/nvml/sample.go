package nvml

// Sample is one reading of a device's changing values. A nil field is a value
// this device cannot give (MIG instances have no utilisation counters, consumer
// cards no ECC); it is reported as N/A for this device alone.
type Sample struct {
	GPUUtilPct      *uint32
	MemUtilPct      *uint32
	EncoderUtilPct  *uint32
	DecoderUtilPct  *uint32
	MemUsedMiB      *uint64
	MemTotalMiB     *uint64
	BAR1UsedMiB     *uint64
	BAR1TotalMiB    *uint64
	TemperatureC    *uint32
	PowerW          *float64
	PowerLimitW     *float64
	SMClockMHz      *uint32
	ECCCorrected    *uint64
	ECCUncorrected  *uint64
	ThrottleReasons *uint64
}

// Read samples a device. Each query stands alone: a failing one leaves its
// field nil and the rest are still read.
func Read(d Device) Sample {
	var s Sample
	if u, err := d.Utilization(); err == nil {
		s.GPUUtilPct, s.MemUtilPct = ptr(u.GPU), ptr(u.Memory)
	}
	if v, err := d.EncoderUtilization(); err == nil {
		s.EncoderUtilPct = ptr(v)
	}
	if v, err := d.DecoderUtilization(); err == nil {
		s.DecoderUtilPct = ptr(v)
	}
	if m, err := d.MemoryInfo(); err == nil {
		s.MemUsedMiB, s.MemTotalMiB = ptr(m.Used>>20), ptr(m.Total>>20)
	}
	if m, err := d.BAR1Info(); err == nil {
		s.BAR1UsedMiB, s.BAR1TotalMiB = ptr(m.Used>>20), ptr(m.Total>>20)
	}
	if v, err := d.Temperature(); err == nil {
		s.TemperatureC = ptr(v)
	}
	// NVML reports milliwatts; Nomad users read watts.
	if mw, err := d.PowerUsage(); err == nil {
		s.PowerW = ptr(float64(mw) / 1000)
	}
	if mw, err := d.PowerLimit(); err == nil {
		s.PowerLimitW = ptr(float64(mw) / 1000)
	}
	if v, err := d.SMClock(); err == nil {
		s.SMClockMHz = ptr(v)
	}
	if v, err := d.ECCErrors(false); err == nil {
		s.ECCCorrected = ptr(v)
	}
	if v, err := d.ECCErrors(true); err == nil {
		s.ECCUncorrected = ptr(v)
	}
	if v, err := d.ThrottleReasons(); err == nil {
		s.ThrottleReasons = ptr(v)
	}
	return s
}

// Throttle reason bits (nvmlClocksEventReason*), named as nvidia-smi names them.
var throttleReasonNames = []struct {
	bit  uint64
	name string
}{
	{0x1, "gpu_idle"},
	{0x2, "applications_clocks_setting"},
	{0x4, "sw_power_cap"},
	{0x8, "hw_slowdown"},
	{0x10, "sync_boost"},
	{0x20, "sw_thermal_slowdown"},
	{0x40, "hw_thermal_slowdown"},
	{0x80, "hw_power_brake_slowdown"},
	{0x100, "display_clock_setting"},
}

// ThrottleReasonNames turns NVML's bit mask into names; "none" for zero.
func ThrottleReasonNames(mask uint64) []string {
	if mask == 0 {
		return []string{"none"}
	}
	var out []string
	for _, r := range throttleReasonNames {
		if mask&r.bit != 0 {
			out = append(out, r.name)
			mask &^= r.bit
		}
	}
	if mask != 0 {
		out = append(out, "other")
	}
	return out
}
