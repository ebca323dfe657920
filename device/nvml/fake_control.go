package nvml

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

// FakeControl is the JSON of the fake backend's control file (the device
// plugin's fake { control_file = "/abs/path.json" }): it drives the fake GPUs'
// changing values and their health while the plugin runs, so a test can make a
// job's GPUs look idle, hot or broken without NVIDIA hardware.
//
//	{
//	  "all":  {"util_pct": 95, "mem_util_pct": 40, "mem_used_mib": 9000, "temp_c": 71,
//	           "power_w": 60, "sm_clock_mhz": 1500, "healthy": true, "health_description": ""},
//	  "gpus": {"GPU-<uuid>": {"util_pct": 12, "healthy": false, "health_description": "fan failed"}}
//	}
//
// Every field is optional. "all" applies to every fake GPU; an entry of "gpus"
// (keyed by the GPU's UUID, as `gpujob gpus` and `nomad node status -verbose`
// print it) overrides "all" field by field for that GPU; a field set nowhere
// keeps the fake's default (0 % utilisation, 34 C, 27.5 W, 300 MHz, no memory
// used, healthy). "healthy": false marks the GPU unhealthy with
// health_description (or a default that names the control file) as the reason,
// which the plugin reports to Nomad as it reports any failed health check;
// health_description alone does nothing. Percentages are 0–100; mem_used_mib
// may not exceed the GPU's memory.
//
// The file is read again only when its modification time or size changed, so
// sampling it every second costs one stat. A missing file means the defaults. A
// file that does not parse (bad JSON, an unknown field, a value out of range)
// is reported once, and the GPUs keep the last good values until the file
// changes again. Write it with a rename (write a temporary file, then mv) so
// that no sample sees it half written. A "gpus" key that names no GPU of this
// plugin is reported and skipped: one file may then serve several nodes.
type FakeControl struct {
	All  FakeGPUControl            `json:"all"`
	GPUs map[string]FakeGPUControl `json:"gpus"`
}

// FakeGPUControl is one GPU's (or every GPU's) values in a FakeControl; a nil
// field is not set here.
type FakeGPUControl struct {
	UtilPct           *uint32  `json:"util_pct,omitempty"`
	MemUtilPct        *uint32  `json:"mem_util_pct,omitempty"`
	MemUsedMiB        *uint64  `json:"mem_used_mib,omitempty"`
	TempC             *uint32  `json:"temp_c,omitempty"`
	PowerW            *float64 `json:"power_w,omitempty"`
	SMClockMHz        *uint32  `json:"sm_clock_mhz,omitempty"`
	Healthy           *bool    `json:"healthy,omitempty"`
	HealthDescription *string  `json:"health_description,omitempty"`
}

// over returns c with the fields o sets replaced by o's.
func (c FakeGPUControl) over(o FakeGPUControl) FakeGPUControl {
	if o.UtilPct != nil {
		c.UtilPct = o.UtilPct
	}
	if o.MemUtilPct != nil {
		c.MemUtilPct = o.MemUtilPct
	}
	if o.MemUsedMiB != nil {
		c.MemUsedMiB = o.MemUsedMiB
	}
	if o.TempC != nil {
		c.TempC = o.TempC
	}
	if o.PowerW != nil {
		c.PowerW = o.PowerW
	}
	if o.SMClockMHz != nil {
		c.SMClockMHz = o.SMClockMHz
	}
	if o.Healthy != nil {
		c.Healthy = o.Healthy
	}
	if o.HealthDescription != nil {
		c.HealthDescription = o.HealthDescription
	}
	return c
}

func (c FakeGPUControl) check(where string) error {
	for name, v := range map[string]*uint32{"util_pct": c.UtilPct, "mem_util_pct": c.MemUtilPct} {
		if v != nil && *v > 100 {
			return fmt.Errorf("%s.%s: %d is not a percentage (0-100)", where, name, *v)
		}
	}
	if c.PowerW != nil && (*c.PowerW < 0 || math.IsNaN(*c.PowerW) || *c.PowerW > 1e6) {
		return fmt.Errorf("%s.power_w: %v is not a plausible power draw in watts", where, *c.PowerW)
	}
	return nil
}

// Controllable is a Library whose devices a control file drives (the fake
// backend with a control_file). The plugin calls ApplyControl before every
// stats sample and fingerprint pass.
type Controllable interface {
	// ApplyControl re-reads the control file if it changed and applies it.
	// changed says whether any device's values or health changed; err is a
	// problem worth one log line (the file did not parse, a key named no
	// GPU), reported once per change of the file, never again for the same
	// file.
	ApplyControl() (changed bool, err error)
}

// fakeBaseline is a device's values before any control file touched them.
type fakeBaseline struct {
	util       Utilization
	memUsed    uint64
	temp       uint32
	powerMW    uint32
	smClockMHz uint32
}

// fakeControl is a FakeLibrary's control file and what was last applied.
type fakeControl struct {
	path string

	mu sync.Mutex
	// seen identifies the file state last read: a missing file, or its
	// modification time and size.
	seen     fileKey
	read     bool // seen is valid
	good     FakeControl
	baseline map[string]fakeBaseline // by UUID, captured when first seen
	// stat is os.Stat; tests can replace it.
	stat func(string) (fs.FileInfo, error)
}

type fileKey struct {
	exists  bool
	modTime time.Time
	size    int64
}

func newFakeControl(path string) *fakeControl {
	return &fakeControl{path: path, baseline: map[string]fakeBaseline{}, stat: os.Stat}
}

// ControlFile is the control file this library follows, "" for none.
func (f *FakeLibrary) ControlFile() string {
	if f.control == nil {
		return ""
	}
	return f.control.path
}

// ApplyControl implements Controllable. Without a control file it does
// nothing.
func (f *FakeLibrary) ApplyControl() (bool, error) {
	c := f.control
	if c == nil {
		return false, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()

	devs := f.Devices()
	var problems []string
	key, err := c.fileKey()
	switch {
	case err != nil:
		// Cannot even stat it (permissions, a directory in the way):
		// keep what is applied, say so once per kind of failure.
		k := fileKey{exists: true, size: -1}
		if c.read && c.seen == k {
			return c.applyTo(devs), nil
		}
		c.seen, c.read = k, true
		problems = append(problems, fmt.Sprintf("%v; keeping the last good values", err))
	case c.read && key == c.seen:
		// Unchanged file: only devices not seen before (a hot-plug in a
		// test) can need the values.
		return c.applyTo(devs), nil
	default:
		c.seen, c.read = key, true
		if !key.exists {
			c.good = FakeControl{}
			break
		}
		ctl, err := c.parse(devs)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%v; keeping the last good values", err))
			break
		}
		c.good = ctl
		problems = append(problems, c.unknownGPUs(devs)...)
	}
	changed := c.applyTo(devs)
	if len(problems) == 0 {
		return changed, nil
	}
	return changed, fmt.Errorf("fake GPU control file %s: %s", c.path, strings.Join(problems, "; "))
}

func (c *fakeControl) fileKey() (fileKey, error) {
	fi, err := c.stat(c.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fileKey{}, nil
	case err != nil:
		return fileKey{}, err
	case !fi.Mode().IsRegular():
		return fileKey{}, fmt.Errorf("%s is not a regular file", c.path)
	}
	return fileKey{exists: true, modTime: fi.ModTime(), size: fi.Size()}, nil
}

// parse reads and checks the file against the devices.
func (c *fakeControl) parse(devs []*FakeDevice) (FakeControl, error) {
	var ctl FakeControl
	raw, err := os.ReadFile(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return ctl, nil // removed since the stat: the defaults
	}
	if err != nil {
		return ctl, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ctl); err != nil {
		return ctl, fmt.Errorf("not valid control JSON: %w", err)
	}
	if dec.More() {
		return ctl, fmt.Errorf("not valid control JSON: more than one JSON value")
	}
	if err := ctl.All.check("all"); err != nil {
		return ctl, err
	}
	for id, g := range ctl.GPUs {
		if err := g.check(fmt.Sprintf("gpus[%q]", id)); err != nil {
			return ctl, err
		}
	}
	for _, d := range devs {
		var uuid string
		var total uint64
		d.Update(func(d *FakeDevice) { uuid, total = d.UUIDValue, d.Mem.Total>>20 })
		eff := ctl.All.over(ctl.GPUs[uuid])
		if eff.MemUsedMiB != nil && *eff.MemUsedMiB > total {
			return ctl, fmt.Errorf("mem_used_mib for %s: %d is more than the GPU's %d MiB", uuid, *eff.MemUsedMiB, total)
		}
	}
	return ctl, nil
}

// unknownGPUs reports the "gpus" keys of c.good that name no device.
func (c *fakeControl) unknownGPUs(devs []*FakeDevice) []string {
	known := map[string]bool{}
	for _, d := range devs {
		d.Update(func(d *FakeDevice) { known[d.UUIDValue] = true })
	}
	var unknown []string
	for id := range c.good.GPUs {
		if !known[id] {
			unknown = append(unknown, id)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	return []string{fmt.Sprintf("gpus: %s name(s) no GPU of this node; skipped", strings.Join(unknown, ", "))}
}

// applyTo sets every device to its baseline overlaid with c.good and says
// whether anything changed.
func (c *fakeControl) applyTo(devs []*FakeDevice) bool {
	changed := false
	for _, d := range devs {
		d.Update(func(d *FakeDevice) {
			base, ok := c.baseline[d.UUIDValue]
			if !ok {
				base = fakeBaseline{util: d.Util, memUsed: d.Mem.Used, temp: d.Temp,
					powerMW: d.PowerUsageMW, smClockMHz: d.SMClockMHz}
				c.baseline[d.UUIDValue] = base
			}
			eff := c.good.All.over(c.good.GPUs[d.UUIDValue])
			want := base
			if eff.UtilPct != nil {
				want.util.GPU = *eff.UtilPct
			}
			if eff.MemUtilPct != nil {
				want.util.Memory = *eff.MemUtilPct
			}
			if eff.MemUsedMiB != nil && *eff.MemUsedMiB<<20 <= d.Mem.Total {
				want.memUsed = *eff.MemUsedMiB << 20
			}
			if eff.TempC != nil {
				want.temp = *eff.TempC
			}
			if eff.PowerW != nil {
				want.powerMW = uint32(math.Round(*eff.PowerW * 1000))
			}
			if eff.SMClockMHz != nil {
				want.smClockMHz = *eff.SMClockMHz
			}
			unhealthy := ""
			if eff.Healthy != nil && !*eff.Healthy {
				unhealthy = "marked unhealthy by the fake GPU control file " + c.path
				if eff.HealthDescription != nil && strings.TrimSpace(*eff.HealthDescription) != "" {
					unhealthy = *eff.HealthDescription
				}
			}
			now := fakeBaseline{util: d.Util, memUsed: d.Mem.Used, temp: d.Temp,
				powerMW: d.PowerUsageMW, smClockMHz: d.SMClockMHz}
			if now != want || d.ControlUnhealthy != unhealthy {
				changed = true
			}
			d.Util, d.Mem.Used, d.Temp, d.PowerUsageMW, d.SMClockMHz =
				want.util, want.memUsed, want.temp, want.powerMW, want.smClockMHz
			d.ControlUnhealthy = unhealthy
		})
	}
	return changed
}

// FakeHealth says why a control file marks a fake device unhealthy; "" when it
// does not, or when d is not a fake device.
func FakeHealth(d Device) string {
	fd, ok := d.(*FakeDevice)
	if !ok || fd == nil {
		return ""
	}
	fd.mu.Lock()
	defer fd.mu.Unlock()
	return fd.ControlUnhealthy
}
