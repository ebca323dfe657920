package gpu

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gpujob/gpujob/device/nvml"
)

// waitSlice bounds one blocking NVML wait so the watcher notices ctx ending.
// NVML wakes the wait as soon as an event arrives; this is not a poll period.
const waitSlice = 2 * time.Second

// healthWatcher turns NVML's critical events into sticky unhealthy marks. A
// GPU that raised a critical Xid or a double-bit ECC error stays unhealthy
// until the plugin restarts (in practice: until the GPU is reset), because the
// counters NVML exposes do not remember Xids.
type healthWatcher struct {
	p    *Plugin
	cfg  settings
	set  nvml.EventSet
	mu   sync.Mutex
	seen map[string]bool // physical GPUs registered with the set, by UUID
}

func (p *Plugin) startHealthWatcher(ctx context.Context, lib nvml.Library, cfg settings) *healthWatcher {
	set, err := lib.NewEventSet()
	if err != nil {
		p.logger.Warn("NVML events unavailable; Xid health checks disabled", "error", err)
		return nil
	}
	w := &healthWatcher{p: p, cfg: cfg, set: set, seen: map[string]bool{}}
	go w.run(ctx)
	return w
}

// register adds physical GPUs not yet watched. MIG instances share their
// parent's registration: NVML reports their events on the parent.
func (w *healthWatcher) register(devs []nvml.DeviceInfo) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range devs {
		gpuUUID := d.UUID
		if d.ParentUUID != "" {
			gpuUUID = d.ParentUUID
		}
		if w.seen[gpuUUID] {
			continue
		}
		w.seen[gpuUUID] = true
		err := w.set.Register(d.GPU, nvml.EventXidCritical|nvml.EventDoubleBitECC)
		if err != nil {
			w.p.logger.Warn("cannot watch GPU events; Xid checks off for it", "uuid", gpuUUID, "error", err)
		}
	}
}

func (w *healthWatcher) run(ctx context.Context) {
	defer w.set.Free()
	for ctx.Err() == nil {
		ev, err := w.set.Wait(waitSlice)
		switch {
		case errors.Is(err, nvml.ErrTimeout):
			continue
		case err != nil:
			w.p.logger.Error("waiting for NVML events failed; Xid checks stop", "error", err)
			return
		}
		if ev.Type&nvml.EventXidCritical != 0 {
			w.p.recordXid(ev.UUID, ev.Data)
		}
		if reason := w.classify(ev); reason != "" {
			w.p.markUnhealthy(ev.UUID, reason)
		}
	}
}

// classify says why an event makes a GPU unhealthy, or "" if it does not.
func (w *healthWatcher) classify(ev nvml.Event) string {
	switch {
	case ev.Type&nvml.EventDoubleBitECC != 0:
		return "double-bit ECC error"
	case ev.Type&nvml.EventXidCritical != 0:
		if w.cfg.ignoredXids[ev.Data] {
			w.p.logger.Info("ignoring application Xid", "uuid", ev.UUID, "xid", nvml.XidDescription(ev.Data))
			return ""
		}
		return "critical " + nvml.XidDescription(ev.Data)
	}
	return ""
}

// markUnhealthy records a sticky failure for the GPU and its MIG instances
// and wakes the fingerprint loop to report it now rather than next period.
func (p *Plugin) markUnhealthy(gpuUUID, reason string) {
	p.mu.Lock()
	hit := 0
	for id, d := range p.devices {
		if id != gpuUUID && d.info.ParentUUID != gpuUUID {
			continue
		}
		p.events[id] = reason
		hit++
	}
	if hit == 0 {
		// An event for an unknown GPU (e.g. one NVML sent with no device):
		// nothing to mark, but worth a log line.
		p.logger.Warn("GPU event for a device not in the fingerprint", "uuid", gpuUUID, "reason", reason)
	}
	p.mu.Unlock()
	if hit == 0 {
		return
	}
	p.logger.Error("GPU is unhealthy", "uuid", gpuUUID, "reason", reason)
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// errUnhealthy names an ID that may not be reserved and why.
func errUnhealthy(id, why string) error {
	return fmt.Errorf("GPU %s is unhealthy: %s", id, why)
}

// xidRecord is what the stats report of a GPU's Xid events: how many there
// were since the plugin started, and the last one's number (what DCGM's
// DCGM_FI_DEV_XID_ERRORS holds).
type xidRecord struct {
	count uint64
	last  uint64
}

func (p *Plugin) recordXid(gpuUUID string, xid uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.xids[gpuUUID]
	r.count++
	r.last = xid
	p.xids[gpuUUID] = r
}

// xidOf is the Xid record of a device: a MIG instance's is its GPU's.
func (p *Plugin) xidOf(info nvml.DeviceInfo) xidRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.xids[info.UUID]; ok {
		return r
	}
	return p.xids[info.ParentUUID]
}
