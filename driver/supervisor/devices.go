package supervisor

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/runc/libcontainer/cgroups/ebpf"
	"github.com/opencontainers/runc/libcontainer/cgroups/ebpf/devicefilter"
	"github.com/opencontainers/runc/libcontainer/devices"
	"golang.org/x/sys/unix"
)

// GPUIsolation closes the node's GPUs that are not the task's to its ranks,
// through the device cgroup: the kernel then refuses to open them, whatever
// CUDA_VISIBLE_DEVICES says. Everything else stays as the executor left it
// (the gpujob driver confines GPUs, not devices in general).
type GPUIsolation struct {
	// Reserved are the minor numbers N of the /dev/nvidiaN nodes reserved
	// to the task; every other GPU minor is denied.
	Reserved []int `json:"reserved"`
	// V1Cgroup is the devices cgroup the supervisor creates and enters on a
	// cgroups v1 host, where Nomad puts tasks in no devices cgroup of their
	// own. Empty on a cgroups v2 host: there the task's own cgroup, which
	// Nomad made, gets the filter.
	V1Cgroup string `json:"v1_cgroup,omitempty"`
}

// NVIDIA's character devices: /dev/nvidiaN are 195:N; 195:254 is
// nvidia-modeset and 195:255 nvidiactl, which every CUDA process opens and
// which stay open to all. nvidia-uvm has a major of its own (no GPU in it).
const (
	nvidiaMajor     = 195
	nvidiaMaxMinor  = 253
	cgroupRoot      = "/sys/fs/cgroup"
	devicesDenyFile = "devices.deny"
)

// deniedGPUMinors is every GPU minor but the reserved ones. All of them,
// not just the nodes that exist now: nvidia-modprobe creates /dev/nvidiaN
// on first use, after the task started.
func deniedGPUMinors(reserved []int) []int {
	keep := map[int]bool{}
	for _, m := range reserved {
		keep[m] = true
	}
	var out []int
	for m := 0; m <= nvidiaMaxMinor; m++ {
		if !keep[m] {
			out = append(out, m)
		}
	}
	return out
}

// gpuRules are the device rules: everything allowed (as the executor leaves
// a task without isolation), then each denied GPU minor refused.
func gpuRules(denied []int) []*devices.Rule {
	rules := []*devices.Rule{{Type: devices.WildcardDevice, Major: devices.Wildcard, Minor: devices.Wildcard,
		Permissions: "rwm", Allow: true}}
	for _, m := range denied {
		rules = append(rules, &devices.Rule{Type: devices.CharDevice, Major: nvidiaMajor, Minor: int64(m),
			Permissions: "rwm", Allow: false})
	}
	return rules
}

// isolateGPUs applies g to this process (and so to every rank it starts
// afterwards). The returned function undoes what only the supervisor can
// clean up (a cgroups v1 cgroup it made); call it once the ranks are gone.
func isolateGPUs(g *GPUIsolation) (cleanup func(), err error) {
	denied := deniedGPUMinors(g.Reserved)
	if unified() {
		dir, err := ownV2Cgroup()
		if err != nil {
			return func() {}, err
		}
		return func() {}, attachV2Filter(dir, denied)
	}
	if g.V1Cgroup == "" {
		return func() {}, errors.New("the node has neither cgroups v2 nor a cgroups v1 devices controller")
	}
	return enterV1Cgroup(g.V1Cgroup, denied, os.Getpid())
}

// unified reports whether /sys/fs/cgroup is cgroups v2 alone, which is when
// Nomad uses v2 (its UseV2).
func unified() bool {
	var st unix.Statfs_t
	return unix.Statfs(cgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// ownV2Cgroup is this process's cgroup v2 directory.
func ownV2Cgroup() (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	path, ok := cgroupOf(f, "")
	if !ok {
		return "", errors.New("/proc/self/cgroup has no cgroups v2 entry")
	}
	return filepath.Join(cgroupRoot, path), nil
}

// cgroupOf finds the path of the hierarchy with controller in a
// /proc/PID/cgroup listing; controller "" is the cgroups v2 hierarchy.
func cgroupOf(r io.Reader, controller string) (string, bool) {
	s := bufio.NewScanner(r)
	for s.Scan() {
		parts := strings.SplitN(s.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if controller == "" {
			if parts[0] == "0" && parts[1] == "" {
				return parts[2], true
			}
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == controller {
				return parts[2], true
			}
		}
	}
	return "", false
}

// attachV2Filter replaces the device filter on the cgroup v2 directory dir
// with one that allows every device but the denied GPUs. Nomad 1.6's
// executor attaches one that allows only /dev/null and a few others, which
// shuts CUDA out entirely (nomad#17176, #17200); this one shuts out only the
// GPUs that are not the task's.
func attachV2Filter(dir string, denied []int) error {
	insts, license, err := devicefilter.DeviceFilter(gpuRules(denied))
	if err != nil {
		return fmt.Errorf("building the device filter: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if _, err := ebpf.LoadAttachCgroupDeviceFilter(insts, license, fd); err != nil {
		return fmt.Errorf("attaching the device filter to %s: %w", dir, err)
	}
	return nil
}

// enterV1Cgroup creates the devices cgroup dir (cgroups v1), denies the GPUs
// in it and moves pid there. Its children inherit the parent's rules, so
// everything else stays as allowed as it was. cleanup moves pid back and
// removes dir, which fails harmlessly while a leftover rank is in it (the
// driver tries again once the task is gone).
func enterV1Cgroup(dir string, denied []int, pid int) (cleanup func(), err error) {
	cleanup = func() {}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return cleanup, fmt.Errorf("creating the devices cgroup %s: %w", dir, err)
	}
	deny, err := os.OpenFile(filepath.Join(dir, devicesDenyFile), os.O_WRONLY, 0)
	if err != nil {
		return cleanup, fmt.Errorf("opening %s: %w", devicesDenyFile, err)
	}
	defer deny.Close()
	for _, r := range gpuRules(denied)[1:] {
		// One rule per write: that is how the kernel reads this file.
		if _, err := deny.WriteString(r.CgroupString()); err != nil {
			return cleanup, fmt.Errorf("denying %s in %s: %w", r.CgroupString(), dir, err)
		}
	}
	if err := writeProcs(dir, pid); err != nil {
		return cleanup, err
	}
	return func() {
		// Back to where it was (a process that is gone has left already).
		_ = writeProcs(filepath.Dir(dir), pid)
		_ = os.Remove(dir)
	}, nil
}

func writeProcs(dir string, pid int) error {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("moving process %d into the cgroup %s: %w", pid, dir, err)
	}
	return nil
}

// DevicesV1Cgroup is where a task's devices cgroup goes on a cgroups v1
// host: a child named leaf of this process's own devices cgroup (the
// supervisor's is the same: the executor does not move it in that
// hierarchy). Empty when the host has cgroups v2 only, or no devices
// controller mounted.
func DevicesV1Cgroup(leaf string) string { return v1Cgroup("devices", leaf) }

// PidsV1Cgroup is DevicesV1Cgroup for the pids controller (PidsLimit).
func PidsV1Cgroup(leaf string) string { return v1Cgroup("pids", leaf) }

// v1Cgroup is the path of a child named leaf of this process's own cgroup
// in the cgroups v1 hierarchy of controller; "" without one.
func v1Cgroup(controller, leaf string) string {
	if unified() {
		return ""
	}
	mounts, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer mounts.Close()
	mount, root, ok := v1Mount(mounts, controller)
	if !ok {
		return ""
	}
	self, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	defer self.Close()
	path, ok := cgroupOf(self, controller)
	if !ok {
		return ""
	}
	// A container's mount shows its part of the hierarchy, whose root
	// /proc/self/cgroup includes.
	if root != "/" {
		rel, err := filepath.Rel(root, path)
		if err != nil || strings.HasPrefix(rel, "..") {
			return ""
		}
		path = rel
	}
	return filepath.Join(mount, path, leaf)
}

// v1Mount finds where the cgroups v1 hierarchy with controller is mounted,
// and which of its directories is mounted there (its root: "/" but in some
// containers), from /proc/self/mountinfo.
func v1Mount(r io.Reader, controller string) (mount, root string, ok bool) {
	s := bufio.NewScanner(r)
	for s.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := strings.Cut(s.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || g[0] != "cgroup" {
			continue
		}
		for _, o := range strings.Split(g[2], ",") {
			if o == controller {
				return f[4], f[3], true
			}
		}
	}
	return "", "", false
}

// RemoveV1Cgroup removes a task's devices cgroup once its processes are
// gone; the driver calls it when the task is destroyed, for a supervisor
// that could not (killed).
func RemoveV1Cgroup(dir string) error {
	if dir == "" {
		return nil
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
