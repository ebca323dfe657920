package gpu

import (
	"context"
	"strings"
	"testing"
	"time"

	log "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/device"

	"github.com/gpujob/gpujob/device/nvml"
)

// TestGRPC drives the plugin through the go-plugin gRPC boundary exactly as
// the Nomad client does, with Nomad's own client and server halves.
func TestGRPC(t *testing.T) {
	lib := nvml.NewFake(nvml.FakeSpec{Count: 3, Model: "Tesla T4", MemoryMiB: 15360, Seed: "grpc"})
	devs := lib.Devices()
	devs[2].Update(func(d *nvml.FakeDevice) { d.Unsupported["Temperature"] = true })
	impl := New(log.NewNullLogger(), func(backend string, _ nvml.FakeSpec) nvml.Library {
		if backend != BackendFake {
			t.Errorf("factory asked for backend %q", backend)
		}
		return lib
	})
	impl.devRoot = devRoot(t, "nvidia1", "nvidiactl")

	client, server := plugin.TestPluginGRPCConn(t, map[string]plugin.Plugin{
		base.PluginTypeBase:   &base.PluginBase{Impl: impl},
		base.PluginTypeDevice: &device.PluginDevice{Impl: impl},
	})
	// Closing the client stops the server through go-plugin's controller;
	// stopping it here as well races inside go-plugin v1.4.10 (-race).
	_ = server
	defer client.Close()
	raw, err := client.Dispense(base.PluginTypeDevice)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := raw.(device.DevicePlugin)
	if !ok {
		t.Fatalf("dispensed %T, not a device.DevicePlugin", raw)
	}

	info, err := p.PluginInfo()
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != base.PluginTypeDevice || info.Name != PluginName || info.PluginVersion != PluginVersion ||
		len(info.PluginApiVersions) != 1 || info.PluginApiVersions[0] != device.ApiVersion010 {
		t.Errorf("PluginInfo = %+v", info)
	}

	schema, err := p.ConfigSchema()
	if err != nil {
		t.Fatal(err)
	}
	obj := schema.GetObject()
	if obj == nil {
		t.Fatalf("schema is not an object: %v", schema)
	}
	for _, k := range []string{"enabled", "backend", "ignored_gpu_ids", "fingerprint_period", "health", "fake"} {
		if _, ok := obj.Attributes[k]; !ok {
			t.Errorf("schema lacks %q", k)
		}
	}

	// A bad config is refused across the boundary with its message.
	if err := p.SetConfig(encode(t, Config{Enabled: true, Backend: "cuda"})); err == nil || !strings.Contains(err.Error(), "backend") {
		t.Errorf("SetConfig(bad backend) = %v", err)
	}
	cfg := Config{Enabled: true, Backend: BackendFake, FingerprintPeriod: "1h",
		Fake: &FakeConfig{Count: 3, Model: "Tesla T4", MemoryMiB: 15360}}
	if err := p.SetConfig(encode(t, cfg)); err != nil {
		t.Fatalf("SetConfig: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fch, err := p.Fingerprint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	groups := nextDevices(t, fch, wait)
	if len(groups) != 1 || len(groups[0].Devices) != 3 {
		t.Fatalf("fingerprint: %s", describeGroups(groups))
	}
	g := groups[0]
	if g.Vendor != "nvidia" || g.Type != "gpu" || g.Name != "Tesla T4" {
		t.Errorf("group %s/%s/%s", g.Vendor, g.Type, g.Name)
	}
	for k, want := range map[string]string{"memory": "15360MiB", "power": "70W", "driver_version": "550.54.15",
		"cuda_driver_version": "12.4", "compute_capability": "7.5", "pci_bandwidth": "15760MB/s", "fake": "true"} {
		if a := g.Attributes[k]; a == nil || a.GoString() != want {
			t.Errorf("attribute %s = %v, want %s", k, a, want)
		}
	}
	for i, d := range g.Devices {
		if d.ID != devs[i].UUIDValue || !d.Healthy || d.HwLocality == nil || d.HwLocality.PciBusID != devs[i].BusID {
			t.Errorf("device %d = %+v %+v", i, d, d.HwLocality)
		}
	}

	// An Xid crosses the boundary as a new fingerprint.
	lib.Inject(nvml.Event{UUID: devs[0].UUIDValue, Type: nvml.EventXidCritical, Data: 79})
	groups = nextDevices(t, fch, wait)
	if d, _ := findDevice(groups, devs[0].UUIDValue); d == nil || d.Healthy || !strings.Contains(d.HealthDesc, "Xid 79") {
		t.Errorf("after Xid 79: %s", describeGroups(groups))
	}

	sch, err := p.Stats(ctx, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var stats *device.StatsResponse
	select {
	case stats = <-sch:
	case <-time.After(wait):
		t.Fatal("no stats")
	}
	if stats.Error != nil || len(stats.Groups) != 1 || len(stats.Groups[0].InstanceStats) != 3 {
		t.Fatalf("stats = %+v", stats)
	}
	for i, want := range []string{"34 C", "34 C", "N/A"} {
		s := stats.Groups[0].InstanceStats[devs[i].UUIDValue]
		if got := statString(s.Stats.Attributes[StatTemperature]); got != want {
			t.Errorf("device %d temperature %q, want %q", i, got, want)
		}
		if got := statString(s.Stats.Attributes[StatPower]); got != "27.5/70 W" {
			t.Errorf("device %d power %q, want 27.5/70 W", i, got)
		}
	}

	res, err := p.Reserve([]string{devs[1].UUIDValue})
	if err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	if res.Envs["CUDA_VISIBLE_DEVICES"] != devs[1].UUIDValue || res.Envs["NVIDIA_VISIBLE_DEVICES"] != devs[1].UUIDValue {
		t.Errorf("Envs = %v", res.Envs)
	}
	if len(res.Devices) != 2 || res.Devices[0].TaskPath != "/dev/nvidia1" || res.Devices[1].TaskPath != "/dev/nvidiactl" ||
		res.Devices[0].CgroupPerms != "rw" {
		t.Errorf("Devices = %s", specString(res.Devices))
	}
	for _, bad := range []string{"GPU-not-here", devs[0].UUIDValue} {
		if _, err := p.Reserve([]string{bad}); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("Reserve(%s) = %v, want an error naming it", bad, err)
		}
	}
}

// TestGRPCNoNVML: without NVML the error reaches the client as a
// fingerprint error and the plugin keeps serving.
func TestGRPCNoNVML(t *testing.T) {
	lib := nvml.NewFake(nvml.FakeSpec{Count: 1, Model: "Tesla T4", MemoryMiB: 15360})
	lib.SetInitError(nvml.ErrLibraryNotFound)
	impl := New(log.NewNullLogger(), func(string, nvml.FakeSpec) nvml.Library { return lib })
	client, server := plugin.TestPluginGRPCConn(t, map[string]plugin.Plugin{
		base.PluginTypeBase:   &base.PluginBase{Impl: impl},
		base.PluginTypeDevice: &device.PluginDevice{Impl: impl},
	})
	// Closing the client stops the server through go-plugin's controller;
	// stopping it here as well races inside go-plugin v1.4.10 (-race).
	_ = server
	defer client.Close()
	raw, err := client.Dispense(base.PluginTypeDevice)
	if err != nil {
		t.Fatal(err)
	}
	p := raw.(device.DevicePlugin)
	if err := p.SetConfig(encode(t, Config{Enabled: true})); err != nil {
		t.Fatalf("SetConfig must succeed without NVML: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fch, err := p.Fingerprint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := next(t, fch, wait)
	if r.Error == nil || !strings.Contains(r.Error.Error(), "libnvidia-ml.so.1") {
		t.Fatalf("fingerprint = %+v, want an error naming libnvidia-ml.so.1", r)
	}
	if _, err := p.PluginInfo(); err != nil {
		t.Errorf("plugin stopped serving: %v", err)
	}
}
