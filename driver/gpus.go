package driver

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"

	"github.com/hashicorp/nomad/plugins/drivers"
	"golang.org/x/sys/unix"

	"github.com/gpujob/gpujob/driver/supervisor"
)

// reservedGPUs is the task's GPU reservation as the device plugin handed it
// over: gpujob's plugin sets CUDA_VISIBLE_DEVICES and
// NVIDIA_VISIBLE_DEVICES, HashiCorp's nvidia plugin the latter only; both
// hold UUIDs, which CUDA_VISIBLE_DEVICES accepts. Empty: no GPU reserved.
func reservedGPUs(cfg *drivers.TaskConfig) string {
	if v := cfg.DeviceEnv["CUDA_VISIBLE_DEVICES"]; v != "" {
		return v
	}
	return cfg.DeviceEnv["NVIDIA_VISIBLE_DEVICES"]
}

var gpuNode = regexp.MustCompile(`^nvidia([0-9]+)$`)

// reservedGPUMinors are the minor numbers of the /dev/nvidiaN nodes the
// device plugin reserved to the task (its control nodes, nvidiactl and
// nvidia-uvm, are not GPUs), from the node itself when it exists, else from
// its name.
func reservedGPUMinors(devs []*drivers.DeviceConfig) []int {
	var out []int
	for _, d := range devs {
		m := gpuNode.FindStringSubmatch(filepath.Base(d.TaskPath))
		if m == nil {
			continue
		}
		minor, _ := strconv.Atoi(m[1])
		var st unix.Stat_t
		if unix.Stat(d.HostPath, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFCHR {
			minor = int(unix.Minor(uint64(st.Rdev)))
		}
		out = append(out, minor)
	}
	return out
}

// gpuIsolation is the device cgroup the supervisor sets up for the task, nil
// when there is none to be had: a client that is not root cannot make one,
// and a reservation whose GPUs came without their device nodes (a device
// plugin that does not report them, or nodes not created yet) does not say
// which minors are the task's, so denying "the others" could lock the task
// out of its own GPUs. v1Cgroup finds where a cgroups v1 devices cgroup
// named leaf goes (supervisor.DevicesV1Cgroup).
func gpuIsolation(cfg *drivers.TaskConfig, root bool, v1Cgroup func(leaf string) string) (*supervisor.GPUIsolation, string) {
	if !root {
		return nil, "the Nomad client is not root"
	}
	minors := reservedGPUMinors(cfg.Devices)
	if reservedGPUs(cfg) != "" && len(minors) == 0 {
		return nil, "the device plugin reserved GPUs without their /dev/nvidiaN nodes"
	}
	return &supervisor.GPUIsolation{Reserved: minors, V1Cgroup: v1Cgroup(devicesCgroupName(cfg))}, ""
}

// devicesCgroupName names a task's cgroups v1 devices cgroup: its
// allocation's ID (a UUID) and a hash of the task name, which may hold any
// character.
func devicesCgroupName(cfg *drivers.TaskConfig) string {
	h := fnv.New32a()
	h.Write([]byte(cfg.Name))
	return fmt.Sprintf("gpujob-%s-%08x", unsafeName.ReplaceAllString(cfg.AllocID, "_"), h.Sum32())
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9-]`)

// isRoot reports whether the driver can switch users and make cgroups.
func isRoot() bool { return os.Geteuid() == 0 }

// pidsLimit is the cap on the task's processes the supervisor sets up, nil
// without one (limit 0) or on a client that is not root (it cannot make
// cgroups). v1Cgroup finds where a cgroups v1 pids cgroup named leaf goes.
func pidsLimit(cfg *drivers.TaskConfig, limit int, root bool, v1Cgroup func(leaf string) string) *supervisor.PidsLimit {
	if limit <= 0 || !root {
		return nil
	}
	return &supervisor.PidsLimit{Max: limit, V1Cgroup: v1Cgroup(devicesCgroupName(cfg))}
}
