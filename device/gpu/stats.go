package gpu

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/nomad/plugins/device"
	"github.com/hashicorp/nomad/plugins/shared/structs"

	"github.com/gpujob/gpujob/device/nvml"
	"github.com/gpujob/gpujob/internal/contract"
)

// Stat names. Those nomad-device-nvidia also reports keep its names, so
// dashboards built on `nomad node status -stats` keep working.
const (
	StatGPUUtil        = contract.StatGPUUtil
	StatMemUtil        = contract.StatMemUtil
	StatEncoderUtil    = contract.StatEncoderUtil
	StatDecoderUtil    = contract.StatDecoderUtil
	StatTemperature    = contract.StatTemperature
	StatMemory         = contract.StatMemory
	StatBAR1           = contract.StatBAR1
	StatPower          = contract.StatPower
	StatSMClock        = contract.StatSMClock
	StatECCCorrected   = contract.StatECCCorrected
	StatECCUncorrected = contract.StatECCUncorrected
	StatThrottle       = contract.StatThrottle
	// Xid events seen since the plugin started, and the last one's number
	// (0: none); the plugin counts them, NVML keeps no count.
	StatXidCount = contract.StatXidCount
	StatXidLast  = contract.StatXidLast
)

const notAvailable = "N/A"

// statsLoop samples every fingerprinted device each interval.
func (p *Plugin) statsLoop(ctx context.Context, interval time.Duration, initErr error, out chan<- *device.StatsResponse) {
	defer close(out)
	if initErr != nil {
		select {
		case out <- device.NewStatsError(initErr):
		case <-ctx.Done():
		}
		return
	}
	if interval <= 0 {
		interval = time.Second
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		resp := &device.StatsResponse{Groups: p.collectStats(time.Now())}
		select {
		case out <- resp:
		case <-ctx.Done():
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// collectStats reads every device once, grouped as the fingerprint groups
// them. Devices are read outside the lock: NVML calls can be slow.
func (p *Plugin) collectStats(now time.Time) []*device.DeviceGroupStats {
	p.mu.Lock()
	lib := p.lib
	p.mu.Unlock()
	if lib != nil && p.applyControl(lib) {
		// The fake's control file changed: a health change in it must not
		// wait for the next fingerprint period.
		select {
		case p.changed <- struct{}{}:
		default:
		}
	}
	p.mu.Lock()
	infos := make([]nvml.DeviceInfo, 0, len(p.devices))
	for _, d := range p.devices {
		infos = append(infos, d.info)
	}
	p.mu.Unlock()
	sort.Slice(infos, func(i, j int) bool { return infos[i].UUID < infos[j].UUID })

	byName := map[string]*device.DeviceGroupStats{}
	var order []string
	for _, info := range infos {
		g, ok := byName[info.Name]
		if !ok {
			g = &device.DeviceGroupStats{Vendor: vendor, Type: deviceType, Name: info.Name,
				InstanceStats: map[string]*device.DeviceStats{}}
			byName[info.Name] = g
			order = append(order, info.Name)
		}
		ds := deviceStats(nvml.Read(info.Handle), now)
		xr := p.xidOf(info)
		ds.Stats.Attributes[StatXidCount] = count(&xr.count, "#", "Xid events since the device plugin started")
		ds.Stats.Attributes[StatXidLast] = count(&xr.last, "", "the last Xid event's number, 0 if none")
		g.InstanceStats[info.UUID] = ds
	}
	sort.Strings(order)
	out := make([]*device.DeviceGroupStats, 0, len(order))
	for _, name := range order {
		out = append(out, byName[name])
	}
	return out
}

// deviceStats converts a sample; a value the device could not give is N/A.
func deviceStats(s nvml.Sample, now time.Time) *device.DeviceStats {
	memory := ratio(s.MemUsedMiB, s.MemTotalMiB, "MiB", "used / total memory")
	return &device.DeviceStats{
		Summary:   memory,
		Timestamp: now,
		Stats: &structs.StatObject{Attributes: map[string]*structs.StatValue{
			StatGPUUtil:        percent(s.GPUUtilPct, "time one or more kernels ran, last sample period"),
			StatMemUtil:        percent(s.MemUtilPct, "time device memory was read or written, last sample period"),
			StatEncoderUtil:    percent(s.EncoderUtilPct, "time the video encoder was busy"),
			StatDecoderUtil:    percent(s.DecoderUtilPct, "time the video decoder was busy"),
			StatTemperature:    count(s.TemperatureC, "C", "GPU die temperature"),
			StatMemory:         memory,
			StatBAR1:           ratio(s.BAR1UsedMiB, s.BAR1TotalMiB, "MiB", "used / total BAR1 memory"),
			StatPower:          watts(s.PowerW, s.PowerLimitW),
			StatSMClock:        count(s.SMClockMHz, "MHz", "current SM clock"),
			StatECCCorrected:   count(s.ECCCorrected, "#", "corrected ECC errors since the driver loaded"),
			StatECCUncorrected: count(s.ECCUncorrected, "#", "uncorrected ECC errors since the driver loaded"),
			StatThrottle:       throttle(s.ThrottleReasons),
		}},
	}
}

func na(unit, desc string) *structs.StatValue {
	v := notAvailable
	return &structs.StatValue{Unit: unit, Desc: desc, StringVal: &v}
}

func percent(v *uint32, desc string) *structs.StatValue { return count(v, "%", desc) }

func count[T uint32 | uint64](v *T, unit, desc string) *structs.StatValue {
	if v == nil {
		return na(unit, desc)
	}
	n := int64(*v)
	return &structs.StatValue{Unit: unit, Desc: desc, IntNumeratorVal: &n}
}

func ratio(used, total *uint64, unit, desc string) *structs.StatValue {
	if used == nil || total == nil {
		return na(unit, desc)
	}
	u, t := int64(*used), int64(*total)
	return &structs.StatValue{Unit: unit, Desc: desc, IntNumeratorVal: &u, IntDenominatorVal: &t}
}

func watts(usage, limit *float64) *structs.StatValue {
	const desc = "power drawn / power limit"
	if usage == nil {
		return na("W", desc)
	}
	return &structs.StatValue{Unit: "W", Desc: desc, FloatNumeratorVal: usage, FloatDenominatorVal: limit}
}

func throttle(mask *uint64) *structs.StatValue {
	const desc = "why the clocks are held below their maximum"
	if mask == nil {
		return na("", desc)
	}
	s := strings.Join(nvml.ThrottleReasonNames(*mask), ",")
	return &structs.StatValue{Desc: desc, StringVal: &s}
}
