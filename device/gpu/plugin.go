// Package gpu is the nomad-device-gpujob device plugin: it fingerprints NVIDIA
// GPUs (and MIG instances) through the nvml seam, watches their health,
// streams their stats and reserves them for tasks.
package gpu

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/device"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"

	"github.com/gpujob/gpujob/device/nvml"
)

const (
	// PluginName is the plugin's name and its executable's file name.
	PluginName = "nomad-device-gpujob"
	vendor     = "nvidia"
	deviceType = device.DeviceTypeGPU
)

// PluginVersion is set at build time with -ldflags.
var PluginVersion = "0.1.0"

// LibraryFactory builds the NVML library for a validated configuration. The
// default picks the real NVML or the fake; tests inject their own.
type LibraryFactory func(backend string, fake nvml.FakeSpec) nvml.Library

// DefaultLibrary is the production LibraryFactory.
func DefaultLibrary(backend string, fake nvml.FakeSpec) nvml.Library {
	if backend == BackendFake {
		return nvml.NewFake(fake)
	}
	return nvml.New()
}

// controlPoll is how often the fingerprint loop checks the fake backend's
// control file (one stat), so a health change in it reaches Nomad within
// seconds even between stats samples.
const controlPoll = time.Second

// applyControl applies the fake backend's control file, when lib follows one,
// and logs what is wrong with the file (once per change of it). It says
// whether any device changed.
func (p *Plugin) applyControl(lib nvml.Library) bool {
	c, ok := lib.(nvml.Controllable)
	if !ok {
		return false
	}
	changed, err := c.ApplyControl()
	if err != nil {
		p.logger.Warn("fake GPU control file", "error", err)
	}
	if changed {
		p.logger.Info("the fake GPUs' control file changed their values")
	}
	return changed
}

// Plugin implements device.DevicePlugin.
type Plugin struct {
	logger     log.Logger
	newLibrary LibraryFactory
	// devRoot is where device nodes are looked up ("/" outside tests).
	devRoot string

	mu      sync.Mutex
	cfg     settings
	lib     nvml.Library
	initErr error
	// devices is the last fingerprint's view, by UUID; Stats and Reserve read it.
	devices map[string]*deviceState
	// byIndex remembers each NVML index's devices so a GPU that stops
	// answering is still reported, as unhealthy, under the ID jobs hold.
	byIndex map[int][]string
	// events holds sticky health failures (Xid, double-bit ECC) by UUID.
	events map[string]string
	// xids counts every Xid event by GPU UUID (ignored ones too: an
	// application's Xids are worth seeing on a dashboard), for the stats.
	xids map[string]xidRecord
	// changed wakes the fingerprint loop when the health watcher saw an event.
	changed chan struct{}
}

// deviceState is one device as last fingerprinted.
type deviceState struct {
	info       nvml.DeviceInfo
	healthy    bool
	healthDesc string
}

// New returns a plugin that builds its NVML library with newLibrary.
func New(logger log.Logger, newLibrary LibraryFactory) *Plugin {
	return &Plugin{
		logger:     logger.Named(PluginName),
		newLibrary: newLibrary,
		devRoot:    "/",
		devices:    map[string]*deviceState{},
		byIndex:    map[int][]string{},
		events:     map[string]string{},
		xids:       map[string]xidRecord{},
		changed:    make(chan struct{}, 1),
	}
}

// PluginInfo implements base.BasePlugin.
func (p *Plugin) PluginInfo() (*base.PluginInfoResponse, error) {
	return &base.PluginInfoResponse{
		Type:              base.PluginTypeDevice,
		PluginApiVersions: []string{device.ApiVersion010},
		PluginVersion:     PluginVersion,
		Name:              PluginName,
	}, nil
}

// ConfigSchema implements base.BasePlugin.
func (p *Plugin) ConfigSchema() (*hclspec.Spec, error) { return configSpec, nil }

// SetConfig validates the configuration and loads the backend. A backend
// that fails to load (no NVML on the machine) does not fail SetConfig: the
// plugin stays up and Fingerprint reports what is missing, so the Nomad client
// keeps running either way.
func (p *Plugin) SetConfig(c *base.Config) error {
	var raw Config
	if len(c.PluginConfig) != 0 {
		if err := base.MsgPackDecode(c.PluginConfig, &raw); err != nil {
			return fmt.Errorf("%s: decoding the plugin config: %w", PluginName, err)
		}
	} else {
		raw.Enabled = true
	}
	host, _ := os.Hostname()
	s, err := raw.validate(host)
	if err != nil {
		return fmt.Errorf("%s: invalid config: %w", PluginName, err)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg = s
	p.initErr = nil // a later SetConfig must not inherit an earlier Init failure
	if s.backend == BackendFake && s.fake.DevRoot != "" {
		p.devRoot = s.fake.DevRoot
	}
	if !s.enabled {
		return nil
	}
	p.lib = p.newLibrary(s.backend, nvml.FakeSpec{
		Count: int(s.fake.Count), Model: s.fake.Model, MemoryMiB: uint64(s.fake.MemoryMiB), Seed: s.fake.IDSeed,
		ControlFile: s.fake.ControlFile,
	})
	if err := p.lib.Init(); err != nil {
		p.initErr = fmt.Errorf("backend %q: %w (on a machine without an NVIDIA GPU set backend = %q)", s.backend, err, BackendFake)
		p.logger.Error("NVML is not usable; the plugin reports no GPUs", "error", p.initErr)
	}
	return nil
}

// Fingerprint implements device.DevicePlugin.
func (p *Plugin) Fingerprint(ctx context.Context) (<-chan *device.FingerprintResponse, error) {
	p.mu.Lock()
	cfg, lib, initErr := p.cfg, p.lib, p.initErr
	p.mu.Unlock()
	if !cfg.enabled {
		return nil, device.ErrPluginDisabled
	}
	out := make(chan *device.FingerprintResponse)
	if initErr != nil {
		go func() {
			defer close(out)
			select {
			case out <- device.NewFingerprintError(initErr):
			case <-ctx.Done():
			}
		}()
		return out, nil
	}
	go p.fingerprintLoop(ctx, lib, cfg, out)
	return out, nil
}

// Stats implements device.DevicePlugin.
func (p *Plugin) Stats(ctx context.Context, interval time.Duration) (<-chan *device.StatsResponse, error) {
	p.mu.Lock()
	cfg, initErr := p.cfg, p.initErr
	p.mu.Unlock()
	if !cfg.enabled {
		return nil, device.ErrPluginDisabled
	}
	out := make(chan *device.StatsResponse)
	go p.statsLoop(ctx, interval, initErr, out)
	return out, nil
}

// Shutdown releases NVML. Nomad kills the plugin process after it; this is
// for tests and for tidiness.
func (p *Plugin) Shutdown() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lib != nil && p.initErr == nil {
		_ = p.lib.Shutdown()
	}
}
