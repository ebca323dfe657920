package gpu

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/device"

	"github.com/gpujob/gpujob/device/nvml"
)

// wait bounds how long a test waits for something that should happen now;
// it only matters when the code is broken.
const wait = 3 * time.Second

// newFakeLib returns n fake GPUs of one model, with stable UUIDs.
func newFakeLib(n int, model string) *nvml.FakeLibrary {
	return nvml.NewFake(nvml.FakeSpec{Count: n, Model: model, MemoryMiB: 16384, Seed: "gpu-test"})
}

// encode turns a Config into what the agent sends.
func encode(t testing.TB, c Config) *base.Config {
	t.Helper()
	var buf []byte
	if err := base.MsgPackEncode(&buf, c); err != nil {
		t.Fatalf("encoding config: %v", err)
	}
	return &base.Config{PluginConfig: buf}
}

// testConfig is an enabled config with health on and the default Xid list.
func testConfig(backend, period string) Config {
	return Config{Enabled: true, Backend: backend, FingerprintPeriod: period}
}

// newPlugin configures a plugin whose backend is lib, whatever the config's
// backend says, and records which backend the factory was asked for.
func newPlugin(t testing.TB, c Config, lib nvml.Library) *Plugin {
	t.Helper()
	p := New(log.NewNullLogger(), func(string, nvml.FakeSpec) nvml.Library { return lib })
	if err := p.SetConfig(encode(t, c)); err != nil {
		t.Fatalf("SetConfig: %v", err)
	}
	t.Cleanup(p.Shutdown)
	return p
}

// fingerprints starts the fingerprint stream; it stops when the test ends.
func fingerprints(t *testing.T, p *Plugin) <-chan *device.FingerprintResponse {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := p.Fingerprint(ctx)
	if err != nil {
		t.Fatalf("Fingerprint: %v", err)
	}
	return ch
}

// next receives one fingerprint, failing the test if none comes within d.
func next(t *testing.T, ch <-chan *device.FingerprintResponse, d time.Duration) *device.FingerprintResponse {
	t.Helper()
	select {
	case r, ok := <-ch:
		if !ok {
			t.Fatalf("fingerprint channel closed")
		}
		return r
	case <-time.After(d):
		t.Fatalf("no fingerprint within %v", d)
	}
	return nil
}

// nextDevices is next for a response that must not be an error.
func nextDevices(t *testing.T, ch <-chan *device.FingerprintResponse, d time.Duration) []*device.DeviceGroup {
	t.Helper()
	r := next(t, ch, d)
	if r.Error != nil {
		t.Fatalf("fingerprint error: %v", r.Error)
	}
	for _, g := range r.Devices {
		if err := g.Validate(); err != nil {
			t.Errorf("group %q does not validate: %v", g.Name, err)
		}
	}
	return r.Devices
}

// quiet asserts that no fingerprint arrives for d.
func quiet(t *testing.T, ch <-chan *device.FingerprintResponse, d time.Duration) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("unexpected fingerprint (nothing changed): %s", describeGroups(r.Devices))
	case <-time.After(d):
	}
}

// fingerprintOnce runs one fingerprint so p.devices is filled for Stats and
// Reserve, then stops the loop.
func fingerprintOnce(t *testing.T, p *Plugin) []*device.DeviceGroup {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := p.Fingerprint(ctx)
	if err != nil {
		t.Fatalf("Fingerprint: %v", err)
	}
	return nextDevices(t, ch, wait)
}

// findDevice returns a device and its group by ID.
func findDevice(groups []*device.DeviceGroup, id string) (*device.Device, *device.DeviceGroup) {
	for _, g := range groups {
		for _, d := range g.Devices {
			if d.ID == id {
				return d, g
			}
		}
	}
	return nil, nil
}

func countDevices(groups []*device.DeviceGroup) int {
	n := 0
	for _, g := range groups {
		n += len(g.Devices)
	}
	return n
}

// awaitDevice reads fingerprints until pred holds for the device id.
func awaitDevice(t *testing.T, ch <-chan *device.FingerprintResponse, id string, pred func(*device.Device) bool) []*device.DeviceGroup {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		groups := nextDevices(t, ch, time.Until(deadline))
		if d, _ := findDevice(groups, id); d != nil && pred(d) {
			return groups
		}
	}
}

func describeGroups(groups []*device.DeviceGroup) string {
	var b strings.Builder
	for _, g := range groups {
		b.WriteString(g.Name + "[")
		for _, d := range g.Devices {
			state := "healthy"
			if !d.Healthy {
				state = "unhealthy: " + d.HealthDesc
			}
			b.WriteString(d.ID + " " + state + "; ")
		}
		b.WriteString("] ")
	}
	return b.String()
}

// logBuffer collects log output safely from any goroutine, even after the
// test ended (the health watcher outlives it by up to one wait slice).
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// captureLogger returns a logger whose output the test can read.
func captureLogger() (log.Logger, *logBuffer) {
	b := &logBuffer{}
	return log.New(&log.LoggerOptions{Output: b, Level: log.Debug}), b
}
