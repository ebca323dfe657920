package gpu

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/device"

	"github.com/gpujob/gpujob/device/nvml"
)

// devRoot makes a fake /dev holding the named nodes as plain files.
func devRoot(t *testing.T, nodes ...string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := os.WriteFile(filepath.Join(root, "dev", n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func specs(root string, nodes ...string) []*device.DeviceSpec {
	var out []*device.DeviceSpec
	for _, n := range nodes {
		out = append(out, &device.DeviceSpec{TaskPath: "/dev/" + n, HostPath: filepath.Join(root, "dev", n), CgroupPerms: "rw"})
	}
	return out
}

func TestReserve(t *testing.T) {
	lib := newFakeLib(4, "Tesla T4")
	devs := lib.Devices()
	id := func(i int) string { return devs[i].UUIDValue }
	devs[3].Update(func(d *nvml.FakeDevice) { d.Unsupported["MinorNumber"] = true })
	all := []string{"nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}

	cases := []struct {
		name  string
		nodes []string // present under the fake /dev
		ids   []string
		want  []string // device nodes, in order
	}{
		{"one GPU", all, []string{id(1)}, []string{"nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}},
		{"two GPUs, minor order", all, []string{id(2), id(0)}, []string{"nvidia0", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}},
		{"no UVM module", []string{"nvidia0", "nvidia1", "nvidiactl"}, []string{id(1)}, []string{"nvidia1", "nvidiactl"}},
		{"nothing present (fake backend)", nil, []string{id(0), id(1)}, nil},
		{"GPU node missing", []string{"nvidiactl", "nvidia-uvm"}, []string{id(0)}, []string{"nvidiactl", "nvidia-uvm"}},
		{"minor unknown", all, []string{id(3)}, []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPlugin(t, testConfig(BackendNVML, "1h"), lib)
			p.devRoot = devRoot(t, tc.nodes...)
			fingerprintOnce(t, p)
			r, err := p.Reserve(tc.ids)
			if err != nil {
				t.Fatal(err)
			}
			visible := strings.Join(tc.ids, ",")
			wantEnv := map[string]string{"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible}
			if !reflect.DeepEqual(r.Envs, wantEnv) {
				t.Errorf("Envs = %v, want %v", r.Envs, wantEnv)
			}
			if want := specs(p.devRoot, tc.want...); !reflect.DeepEqual(r.Devices, want) {
				t.Errorf("Devices:\n got %s\nwant %s", specString(r.Devices), specString(want))
			}
			if len(r.Mounts) != 0 {
				t.Errorf("Mounts = %v", r.Mounts)
			}
		})
	}
}

func specString(s []*device.DeviceSpec) string {
	var out []string
	for _, d := range s {
		out = append(out, d.TaskPath+"<-"+d.HostPath+"("+d.CgroupPerms+")")
	}
	return "[" + strings.Join(out, " ") + "]"
}

func TestReserveEmpty(t *testing.T) {
	p := newPlugin(t, testConfig(BackendNVML, "1h"), newFakeLib(1, "Tesla T4"))
	fingerprintOnce(t, p)
	r, err := p.Reserve(nil)
	if err != nil || r == nil || len(r.Envs) != 0 || len(r.Devices) != 0 {
		t.Errorf("Reserve(nil) = %+v, %v; want an empty reservation", r, err)
	}
}

func TestReserveRefused(t *testing.T) {
	lib := newFakeLib(3, "Tesla T4")
	devs := lib.Devices()
	devs[1].Update(func(d *nvml.FakeDevice) { d.ECCUncorrected = 1 })
	cfg := testConfig(BackendNVML, "1h")
	cfg.IgnoredGPUIDs = []string{devs[2].UUIDValue}
	p := newPlugin(t, cfg, lib)
	p.devRoot = devRoot(t)
	fingerprintOnce(t, p)

	cases := []struct {
		name string
		ids  []string
		want []string
	}{
		{"unknown", []string{"GPU-00000000-0000-0000-0000-000000000000"}, []string{"GPU-00000000-0000-0000-0000-000000000000", "not a device of this node"}},
		{"ignored", []string{devs[2].UUIDValue}, []string{devs[2].UUIDValue, "not a device"}},
		{"unhealthy", []string{devs[1].UUIDValue}, []string{devs[1].UUIDValue, "unhealthy", "uncorrectable ECC"}},
		{"good and unknown", []string{devs[0].UUIDValue, "GPU-nope"}, []string{"GPU-nope"}},
		{"good and unhealthy", []string{devs[0].UUIDValue, devs[1].UUIDValue}, []string{devs[1].UUIDValue, "unhealthy"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := p.Reserve(tc.ids)
			if err == nil {
				t.Fatalf("Reserve(%v) = %+v, want refused", tc.ids, r)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	if _, err := p.Reserve([]string{devs[0].UUIDValue}); err != nil {
		t.Errorf("the healthy GPU is refused: %v", err)
	}
}

func TestReserveMIG(t *testing.T) {
	lib := newFakeLib(2, "NVIDIA A100-SXM4-40GB")
	devs := lib.Devices()
	var insts []*nvml.FakeDevice
	for _, id := range []string{"MIG-1", "MIG-2"} {
		d := nvml.NewFakeDevice(nvml.FakeSpec{Model: "NVIDIA A100-SXM4-40GB MIG 3g.20gb", MemoryMiB: 19968}, 7)
		d.UUIDValue = id
		insts = append(insts, d)
	}
	devs[1].Update(func(d *nvml.FakeDevice) { d.MIG = insts })
	p := newPlugin(t, testConfig(BackendNVML, "1h"), lib)
	p.devRoot = devRoot(t, "nvidia0", "nvidia1", "nvidia7", "nvidiactl")
	fingerprintOnce(t, p)
	r, err := p.Reserve([]string{"MIG-1", "MIG-2"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Envs["CUDA_VISIBLE_DEVICES"] != "MIG-1,MIG-2" {
		t.Errorf("CUDA_VISIBLE_DEVICES = %q", r.Envs["CUDA_VISIBLE_DEVICES"])
	}
	if want := specs(p.devRoot, "nvidia1", "nvidiactl"); !reflect.DeepEqual(r.Devices, want) {
		t.Errorf("Devices = %s, want the parent's node once: %s", specString(r.Devices), specString(want))
	}
	if _, err := p.Reserve([]string{devs[1].UUIDValue}); err == nil {
		t.Errorf("the hidden MIG parent was reservable")
	}
}

// TestReserveFakeDevRoot: the fake backend's dev_root puts look-alike nodes
// in the reservation, for the task driver's device isolation to act on.
func TestReserveFakeDevRoot(t *testing.T) {
	root := devRoot(t, "nvidia0", "nvidia1")
	p := New(log.NewNullLogger(), func(string, nvml.FakeSpec) nvml.Library { return newFakeLib(2, "m") })
	var data []byte
	if err := base.MsgPackEncode(&data, &Config{Enabled: true, Backend: BackendFake,
		Fake: &FakeConfig{Count: 2, Model: "m", MemoryMiB: 1, DevRoot: root}}); err != nil {
		t.Fatal(err)
	}
	if err := p.SetConfig(&base.Config{PluginConfig: data}); err != nil {
		t.Fatal(err)
	}
	if p.devRoot != root {
		t.Fatalf("devRoot %q, want %q", p.devRoot, root)
	}
}
