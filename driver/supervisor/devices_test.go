package supervisor

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/opencontainers/runc/libcontainer/cgroups/ebpf"
	"github.com/opencontainers/runc/libcontainer/cgroups/ebpf/devicefilter"
	"github.com/opencontainers/runc/libcontainer/devices"

	"github.com/gpujob/gpujob/internal/testpriv"
)

func TestDeniedGPUMinors(t *testing.T) {
	denied := deniedGPUMinors([]int{1, 3})
	if len(denied) != nvidiaMaxMinor+1-2 {
		t.Fatalf("%d minors denied, want all %d but the 2 reserved", len(denied), nvidiaMaxMinor+1)
	}
	for _, m := range denied {
		if m == 1 || m == 3 || m > nvidiaMaxMinor {
			t.Fatalf("minor %d denied: reserved, or a control node (nvidia-modeset 254, nvidiactl 255)", m)
		}
	}
	if got := len(deniedGPUMinors(nil)); got != nvidiaMaxMinor+1 {
		t.Fatalf("no reservation: %d denied, want every GPU", got)
	}
	rules := gpuRules([]int{0, 7})
	var lines []string
	for _, r := range rules {
		lines = append(lines, r.CgroupString())
	}
	if got := strings.Join(lines, "|"); got != "a *:* rwm|c 195:0 rwm|c 195:7 rwm" {
		t.Fatalf("rules %s", got)
	}
}

func TestCgroupListings(t *testing.T) {
	self := "12:devices:/system.slice/nomad.service\n4:cpu,cpuacct:/\n0::/nomad.slice/a1.train.scope\n"
	if p, ok := cgroupOf(strings.NewReader(self), "devices"); !ok || p != "/system.slice/nomad.service" {
		t.Errorf("devices: %q %v", p, ok)
	}
	if p, ok := cgroupOf(strings.NewReader(self), "cpuacct"); !ok || p != "/" {
		t.Errorf("a co-mounted controller: %q %v", p, ok)
	}
	if p, ok := cgroupOf(strings.NewReader(self), ""); !ok || p != "/nomad.slice/a1.train.scope" {
		t.Errorf("v2: %q %v", p, ok)
	}
	if _, ok := cgroupOf(strings.NewReader("4:cpu:/\n"), "devices"); ok {
		t.Error("found a devices hierarchy that is not there")
	}
	mounts := "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n" +
		"35 30 0:32 / /sys/fs/cgroup/devices rw,nosuid shared:15 - cgroup cgroup rw,devices\n" +
		"36 30 0:33 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
	if m, root, ok := v1Mount(strings.NewReader(mounts), "devices"); !ok || m != "/sys/fs/cgroup/devices" || root != "/" {
		t.Errorf("devices mount: %q %q %v", m, root, ok)
	}
	if m, root, ok := v1Mount(strings.NewReader(mounts), "memory"); !ok || m != "/sys/fs/cgroup/memory" || root != "/docker/abc" {
		t.Errorf("a container's mount: %q %q %v", m, root, ok)
	}
	if _, _, ok := v1Mount(strings.NewReader(mounts), "freezer"); ok {
		t.Error("found a freezer mount that is not there")
	}
}

// openDevicesEnv makes the test binary a process that waits for a line on
// stdin (meanwhile the test moves it into a cgroup), then opens each
// argument and prints "PATH ok" or "PATH ERRNO".
const openDevicesEnv = "GPUJOB_TEST_OPEN_DEVICES"

func helperOpenDevices(paths []string) int {
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return 1
	}
	for _, p := range paths {
		f, err := os.OpenFile(p, os.O_RDONLY, 0)
		var errno syscall.Errno
		switch {
		case err == nil:
			f.Close()
			fmt.Println(p, "ok")
		case errors.As(err, &errno):
			fmt.Println(p, errnoName(errno))
		default:
			fmt.Println(p, err)
		}
	}
	return 0
}

func errnoName(e syscall.Errno) string {
	switch e {
	case syscall.EPERM:
		return "EPERM"
	case syscall.ENXIO:
		return "ENXIO"
	case syscall.ENODEV:
		return "ENODEV"
	}
	return e.Error()
}

// fakeGPUNodes makes /dev/nvidia0 and /dev/nvidia1 look-alikes (195:0 and
// 195:1) in a directory: with no NVIDIA driver loaded, opening one fails
// with ENXIO (no such device), but one the cgroup denies fails with EPERM
// first, which tells the two apart on any machine.
func fakeGPUNodes(t *testing.T) (gpu0, gpu1 string) {
	t.Helper()
	testpriv.NeedRoot(t, "device nodes and cgroups")
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("a real NVIDIA driver is loaded: the look-alike nodes would open")
	}
	dir := t.TempDir()
	gpu0, gpu1 = filepath.Join(dir, "nvidia0"), filepath.Join(dir, "nvidia1")
	for i, p := range []string{gpu0, gpu1} {
		if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, int(i)|nvidiaMajor<<8); err != nil {
			testpriv.Skip(t, "cannot make device nodes here: %v", err)
		}
	}
	return gpu0, gpu1
}

// startOpener starts the helper, waiting on stdin, and returns its PID, a
// function that lets it go and returns what it printed.
func startOpener(t *testing.T, paths ...string) (int, func() string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, paths...)
	cmd.Env = append(os.Environ(), openDevicesEnv+"=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid, func() string {
		io.WriteString(in, "go\n")
		b, _ := io.ReadAll(out)
		cmd.Wait()
		return string(b)
	}
}

// TestV1CgroupDeniesOtherGPUs runs on a cgroups v1 host: a process moved
// into the task's devices cgroup cannot open the GPU that is not reserved,
// while the reserved one gets past the cgroup (to the missing driver).
func TestV1CgroupDeniesOtherGPUs(t *testing.T) {
	gpu0, gpu1 := fakeGPUNodes(t)
	if unified() {
		t.Skip("cgroups v2 host")
	}
	leaf := fmt.Sprintf("gpujob-test-%d", os.Getpid())
	dir := DevicesV1Cgroup(leaf)
	if dir == "" {
		testpriv.Skip(t, "no cgroups v1 devices controller")
	}
	pid, release := startOpener(t, gpu0, gpu1)
	cleanup, err := enterV1Cgroup(dir, deniedGPUMinors([]int{0}), pid)
	if err != nil {
		testpriv.Skip(t, "cannot use the devices cgroup here: %v", err)
	}
	got := release()
	cleanup()
	want := gpu0 + " ENXIO\n" + gpu1 + " EPERM\n"
	if got != want {
		t.Fatalf("opening the look-alike GPUs from the task's cgroup:\n%s\nwant:\n%s", got, want)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the cgroup %s outlived its cleanup: %v", dir, err)
	}
}

// TestV2FilterDeniesOtherGPUs attaches the filter to a fresh cgroup v2 (on a
// v2 host, or the unified hierarchy of a hybrid one).
func TestV2FilterDeniesOtherGPUs(t *testing.T) {
	gpu0, gpu1 := fakeGPUNodes(t)
	root := cgroupRoot
	if !unified() {
		root = filepath.Join(cgroupRoot, "unified")
		var st syscall.Statfs_t
		if syscall.Statfs(root, &st) != nil || st.Type != 0x63677270 {
			t.Skip("no cgroups v2 hierarchy")
		}
	}
	dir := filepath.Join(root, fmt.Sprintf("gpujob-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		testpriv.Skip(t, "cannot make a cgroup v2 here: %v", err)
	}
	defer os.Remove(dir)
	// First what Nomad 1.6's executor attaches on a v2 host: an allow-list
	// of a few devices, no GPU among them.
	nomadLike, license, err := devicefilter.DeviceFilter([]*devices.Rule{
		{Type: devices.CharDevice, Major: 1, Minor: 3, Permissions: "rwm", Allow: true}})
	if err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Open(dir, syscall.O_DIRECTORY|syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ebpf.LoadAttachCgroupDeviceFilter(nomadLike, license, fd)
	syscall.Close(fd)
	if err != nil {
		testpriv.Skip(t, "cannot attach a device filter here: %v", err)
	}
	pid, release := startOpener(t, gpu0, "/dev/null")
	if err := writeProcs(dir, pid); err != nil {
		t.Fatal(err)
	}
	if got, want := release(), gpu0+" EPERM\n/dev/null ok\n"; got != want {
		t.Fatalf("under the executor's allow-list:\n%s\nwant:\n%s", got, want)
	}
	// The supervisor's filter replaces it: the task's GPU opens (as far as
	// the missing driver lets it), another GPU does not.
	if err := attachV2Filter(dir, deniedGPUMinors([]int{0})); err != nil {
		t.Fatalf("replacing the executor's filter: %v", err)
	}
	pid, release = startOpener(t, gpu0, gpu1, "/dev/null")
	if err := writeProcs(dir, pid); err != nil {
		t.Fatal(err)
	}
	got := release()
	want := gpu0 + " ENXIO\n" + gpu1 + " EPERM\n/dev/null ok\n"
	if got != want {
		t.Fatalf("opening the look-alike GPUs from the filtered cgroup:\n%s\nwant:\n%s", got, want)
	}
}
