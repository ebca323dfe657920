package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/nomad/plugins/device"
)

// controlNodes are the device nodes every CUDA process opens besides its GPUs.
var controlNodes = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}

// Reserve implements device.DevicePlugin: it hands a task its GPUs by UUID in
// CUDA_VISIBLE_DEVICES (CUDA accepts UUIDs, and unlike indexes they mean the
// same inside any container) and NVIDIA_VISIBLE_DEVICES (read by the NVIDIA
// container runtime), plus the device nodes an isolating driver must allow.
func (p *Plugin) Reserve(ids []string) (*device.ContainerReservation, error) {
	if len(ids) == 0 {
		return &device.ContainerReservation{}, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()

	minors := map[int]bool{}
	for _, id := range ids {
		d, ok := p.devices[id]
		switch {
		case !ok:
			return nil, fmt.Errorf("GPU %s is not a device of this node (ignored, or removed since the last fingerprint)", id)
		case !d.healthy:
			return nil, errUnhealthy(id, d.healthDesc)
		}
		if d.info.Minor >= 0 {
			minors[d.info.Minor] = true
		}
	}

	visible := strings.Join(ids, ",")
	r := &device.ContainerReservation{Envs: map[string]string{
		"CUDA_VISIBLE_DEVICES":   visible,
		"NVIDIA_VISIBLE_DEVICES": visible,
	}}
	// GPU nodes in minor order, then the control nodes: a stable reservation.
	sorted := make([]int, 0, len(minors))
	for m := range minors {
		sorted = append(sorted, m)
	}
	sort.Ints(sorted)
	var nodes []string
	for _, m := range sorted {
		nodes = append(nodes, fmt.Sprintf("nvidia%d", m))
	}
	for _, n := range append(nodes, controlNodes...) {
		host := filepath.Join(p.devRoot, "dev", n)
		if _, err := os.Stat(host); err != nil {
			continue // absent on this machine (fake backend, no UVM module)
		}
		r.Devices = append(r.Devices, &device.DeviceSpec{TaskPath: "/dev/" + n, HostPath: host, CgroupPerms: "rw"})
	}
	return r, nil
}
