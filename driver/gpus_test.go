package driver

import (
	"path/filepath"
	"reflect"
	"regexp"
	"testing"

	"github.com/hashicorp/nomad/plugins/drivers"
	"golang.org/x/sys/unix"

	"github.com/gpujob/gpujob/internal/testpriv"
)

func TestReservedGPUs(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"gpujob's device plugin", map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, "GPU-a,GPU-b"},
		{"HashiCorp's nvidia plugin sets NVIDIA_VISIBLE_DEVICES only", map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-c"}, "GPU-c"},
		{"no reservation: no GPU", nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := reservedGPUs(&drivers.TaskConfig{DeviceEnv: c.env}); got != c.want {
				t.Fatalf("got %q, want %q", got, c.want)
			}
		})
	}
}

func TestReservedGPUMinors(t *testing.T) {
	dir := t.TempDir()
	// A node whose minor differs from its name's number (as under a fake
	// device root): the node itself is the truth.
	node := filepath.Join(dir, "nvidia0")
	if err := unix.Mknod(node, unix.S_IFCHR|0o666, int(unix.Mkdev(195, 5))); err != nil {
		testpriv.Skip(t, "cannot make a device node here: %v", err)
	}
	devs := []*drivers.DeviceConfig{
		{TaskPath: "/dev/nvidia0", HostPath: node},
		{TaskPath: "/dev/nvidia3", HostPath: filepath.Join(dir, "absent")}, // by its name
		{TaskPath: "/dev/nvidiactl", HostPath: "/dev/nvidiactl"},           // not a GPU
		{TaskPath: "/dev/nvidia-uvm", HostPath: "/dev/nvidia-uvm"},
	}
	if got := reservedGPUMinors(devs); !reflect.DeepEqual(got, []int{5, 3}) {
		t.Fatalf("minors %v, want [5 3]", got)
	}
}

func TestGPUIsolationDecision(t *testing.T) {
	v1 := func(leaf string) string { return "/sys/fs/cgroup/devices/" + leaf }
	withGPU := &drivers.TaskConfig{AllocID: "a1", Name: "train",
		DeviceEnv: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-a"},
		Devices:   []*drivers.DeviceConfig{{TaskPath: "/dev/nvidia2", HostPath: "/nonexistent/nvidia2"}}}
	g, why := gpuIsolation(withGPU, true, v1)
	if g == nil || !reflect.DeepEqual(g.Reserved, []int{2}) || g.V1Cgroup != v1(devicesCgroupName(withGPU)) {
		t.Fatalf("a task with GPU 2: %+v (%s)", g, why)
	}
	// No GPU reserved: every GPU is closed to the task.
	if g, why := gpuIsolation(&drivers.TaskConfig{AllocID: "a1", Name: "cpu"}, true, v1); g == nil || len(g.Reserved) != 0 {
		t.Fatalf("a CPU task: %+v (%s), want isolation with nothing reserved", g, why)
	}
	// GPUs reserved without their nodes: which minors are the task's is
	// unknown, so nothing is denied rather than the task's own.
	noNodes := &drivers.TaskConfig{DeviceEnv: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-fake"}}
	if g, why := gpuIsolation(noNodes, true, v1); g != nil || why == "" {
		t.Fatalf("GPUs without nodes: %+v, want none and a reason", g)
	}
	// A client that is not root can make no cgroup.
	if g, _ := gpuIsolation(withGPU, false, v1); g != nil {
		t.Fatalf("not root: %+v, want none", g)
	}
}

func TestDevicesCgroupNameIsOnePathElement(t *testing.T) {
	a := devicesCgroupName(&drivers.TaskConfig{AllocID: "0b9c5e2a-1111-2222-3333-444455556666", Name: "train"})
	b := devicesCgroupName(&drivers.TaskConfig{AllocID: "0b9c5e2a-1111-2222-3333-444455556666", Name: "../../x y"})
	ok := regexp.MustCompile(`^gpujob-[A-Za-z0-9_-]+-[0-9a-f]{8}$`)
	for _, n := range []string{a, b, devicesCgroupName(&drivers.TaskConfig{AllocID: "../a", Name: "t"})} {
		if !ok.MatchString(n) {
			t.Errorf("name %q is not one safe path element", n)
		}
	}
	if a == b {
		t.Errorf("two tasks of one allocation share %q", a)
	}
}
