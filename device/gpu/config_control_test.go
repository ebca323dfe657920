package gpu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/device"

	"github.com/gpujob/gpujob/device/nvml"
)

// controlConfig is a fake-backend config following the control file path.
func controlConfig(path string) Config {
	c := testConfig(BackendFake, "1h")
	c.Fake = &FakeConfig{Count: 2, Model: "Tesla T4", MemoryMiB: 16384, IDSeed: "ctl", ControlFile: path}
	return c
}

// writeFile replaces path's content through a rename, as the control file's
// documentation asks, with a distinct mtime per step.
func writeFile(t *testing.T, path, body string, step int) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	mt := time.Unix(1700000000+int64(step), 0)
	if err := os.Chtimes(tmp, mt, mt); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestControlFileFactory: SetConfig hands the control file to the library
// factory, and the default factory's fake follows it.
func TestControlFileFactory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpus.json")
	var got nvml.FakeSpec
	p := New(log.NewNullLogger(), func(backend string, spec nvml.FakeSpec) nvml.Library {
		got = spec
		return DefaultLibrary(backend, spec)
	})
	if err := p.SetConfig(encode(t, controlConfig(path))); err != nil {
		t.Fatal(err)
	}
	if got.ControlFile != path {
		t.Errorf("factory got ControlFile %q, want %q", got.ControlFile, path)
	}
	lib, ok := p.lib.(*nvml.FakeLibrary)
	if !ok || lib.ControlFile() != path {
		t.Fatalf("library %T does not follow %s", p.lib, path)
	}
}

// TestControlFileDrivesStatsAndHealth: the control file reaches the stats at
// the next sample and the health in Nomad's fingerprint within seconds,
// without waiting for the fingerprint period (1h here); a malformed file is
// logged once and the last good values stay.
func TestControlFileDrivesStatsAndHealth(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpus.json")
	lib := nvml.NewFake(nvml.FakeSpec{Count: 2, Model: "Tesla T4", MemoryMiB: 16384, Seed: "ctl", ControlFile: path})
	logger, logs := captureLogger()
	p := New(logger, func(string, nvml.FakeSpec) nvml.Library { return lib })
	if err := p.SetConfig(encode(t, controlConfig(path))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Shutdown)
	devs := lib.Devices()
	id0, id1 := devs[0].UUIDValue, devs[1].UUIDValue

	ch := fingerprints(t, p)
	groups := nextDevices(t, ch, wait)
	for _, id := range []string{id0, id1} {
		if d, _ := findDevice(groups, id); d == nil || !d.Healthy {
			t.Fatalf("without a control file: %s", describeGroups(groups))
		}
	}
	utilOf := func(id string) string {
		return statString(instance(t, p.collectStats(time.Now()), id).Stats.Attributes[StatGPUUtil])
	}
	if got := utilOf(id0); got != "0 %" {
		t.Errorf("default utilisation %q, want the fake's 0 %%", got)
	}

	writeFile(t, path, `{"all": {"util_pct": 12}, "gpus": {"`+id1+`": {"healthy": false, "health_description": "fan failed"}}}`, 1)
	start := time.Now()
	groups = awaitDevice(t, ch, id1, func(d *device.Device) bool { return !d.Healthy })
	if d, _ := findDevice(groups, id1); d.HealthDesc != "fan failed" {
		t.Errorf("health description %q, want the file's", d.HealthDesc)
	}
	if d, _ := findDevice(groups, id0); !d.Healthy {
		t.Errorf("GPU 0 unhealthy too: %s", describeGroups(groups))
	}
	if took := time.Since(start); took > 2*controlPoll+time.Second {
		t.Errorf("health change took %v to reach the fingerprint", took)
	}
	for _, id := range []string{id0, id1} {
		if got := utilOf(id); got != "12 %" {
			t.Errorf("%s utilisation %q, want 12 %%", id, got)
		}
	}

	writeFile(t, path, `{"all": {"util_pct": `, 2)
	for i := 0; i < 3; i++ {
		if got := utilOf(id0); got != "12 %" {
			t.Errorf("after a malformed file: utilisation %q, want the last good 12 %%", got)
		}
	}
	if n := strings.Count(logs.String(), "not valid control JSON"); n != 1 {
		t.Errorf("malformed file logged %d times, want once:\n%s", n, logs.String())
	}

	writeFile(t, path, `{"all": {"util_pct": 95, "healthy": true}}`, 3)
	if got := utilOf(id0); got != "95 %" {
		t.Errorf("utilisation %q, want 95 %%", got)
	}
	// The stats sample saw the change first: it must wake the fingerprint
	// loop rather than leave the health change to the next poll or period.
	awaitDevice(t, ch, id1, func(d *device.Device) bool { return d.Healthy })

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if got := utilOf(id0); got != "0 %" {
		t.Errorf("file removed: utilisation %q, want the default 0 %%", got)
	}
}

// TestControlFileHealthOff: with health checks off the file's health is not
// reported, as no other health check is.
func TestControlFileHealthOff(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpus.json")
	writeFile(t, path, `{"all": {"healthy": false}}`, 1)
	lib := nvml.NewFake(nvml.FakeSpec{Count: 1, Model: "Tesla T4", MemoryMiB: 16384, Seed: "ctl", ControlFile: path})
	cfg := controlConfig(path)
	cfg.Health = &HealthConfig{Enabled: false}
	p := newPlugin(t, cfg, lib)
	groups := fingerprintOnce(t, p)
	if d, _ := findDevice(groups, lib.Devices()[0].UUIDValue); d == nil || !d.Healthy {
		t.Errorf("health off: %s", describeGroups(groups))
	}
}
