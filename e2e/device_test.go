package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// gpuWait bounds how long a test waits for its cluster's GPUs to be free
// and healthy: long enough for the last test's allocations to stop (a
// task's kill_timeout is 30 s), short of any test's own timeout.
const gpuWait = 45 * time.Second

// nodeGPUs waits until every client of the cluster has n GPUs that are
// healthy and free, and returns the first such node and its GPU group.
// Every test that needs GPUs starts here, so the cluster it shares with the
// others is in a known state: a GPU still held by something an earlier test
// left (a job, a lost node's allocation, a trial) or marked unhealthy fails
// the test at once, naming the holder or the health, instead of leaving a
// member unplaced until the test's own timeout.
func (c *cluster) nodeGPUs(t *testing.T, n int) (*api.Node, *api.NodeDeviceResource) {
	t.Helper()
	ctx := ctx(t, gpuWait)
	var index uint64
	var problems []string
	for {
		// Any allocation change (or 2 s, for health changes on nodes) ends
		// the wait: a blocking query on the cluster's allocation index.
		_, meta, err := c.nomad.Allocations().List((&api.QueryOptions{WaitIndex: index, WaitTime: 2 * time.Second}).WithContext(ctx))
		if ctx.Err() != nil {
			t.Fatalf("the cluster's GPUs are not all free and healthy after %s (each test starts on an idle cluster):\n  %s",
				gpuWait, strings.Join(problems, "\n  "))
		}
		if err != nil {
			t.Fatalf("listing allocations: %v", err)
		}
		index = meta.LastIndex
		var node *api.Node
		var group *api.NodeDeviceResource
		if node, group, problems, err = c.gpuState(n); err != nil {
			t.Fatal(err)
		}
		if len(problems) == 0 {
			return node, group
		}
	}
}

// gpuState checks that each of the cluster's clients has n healthy GPUs
// held by no live allocation; it returns the first client (by name) and
// its GPU group, and every way the cluster falls short, in words.
func (c *cluster) gpuState(n int) (*api.Node, *api.NodeDeviceResource, []string, error) {
	stubs, _, err := c.nomad.Nodes().List(nil)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("listing nodes: %w", err)
	}
	sort.Slice(stubs, func(i, j int) bool { return stubs[i].Name < stubs[j].Name })
	var problems []string
	var first *api.Node
	var firstGroup *api.NodeDeviceResource
	clients := max(c.opts.clients, 1)
	ready := 0
	for _, stub := range stubs {
		if stub.Status != api.NodeStatusReady {
			continue
		}
		ready++
		node, _, err := c.nomad.Nodes().Info(stub.ID, nil)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("node %s: %w", stub.Name, err)
		}
		allocs, _, err := c.nomad.Nodes().Allocations(stub.ID, nil)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("allocations of node %s: %w", stub.Name, err)
		}
		holders := gpuHolders(allocs)
		var group *api.NodeDeviceResource
		free := 0
		for _, g := range node.NodeResources.Devices {
			if g.Vendor != "nvidia" || g.Type != "gpu" {
				continue
			}
			group = g
			for _, inst := range g.Instances {
				switch h, held := holders[inst.ID]; {
				case !inst.Healthy:
					problems = append(problems, fmt.Sprintf("node %s: GPU %s unhealthy: %s", node.Name, inst.ID, inst.HealthDescription))
				case held:
					problems = append(problems, fmt.Sprintf("node %s: GPU %s held by %s", node.Name, inst.ID, h))
				default:
					free++
				}
			}
		}
		if free < n && len(problems) == 0 {
			problems = append(problems, fmt.Sprintf("node %s has %d GPUs, want %d", node.Name, free, n))
		}
		if first == nil {
			first, firstGroup = node, group
		}
	}
	if ready < clients {
		problems = append(problems, fmt.Sprintf("%d of the cluster's %d clients are ready", ready, clients))
	}
	return first, firstGroup, problems, nil
}

// gpuHolders maps each GPU held by a live allocation (one the scheduler
// counts, or whose tasks may still run) to a description of it.
func gpuHolders(allocs []*api.Allocation) map[string]string {
	out := map[string]string{}
	for _, a := range allocs {
		live := a.DesiredStatus == api.AllocDesiredStatusRun && !terminalClientStatus(a.ClientStatus) ||
			a.ClientStatus == api.AllocClientStatusPending || a.ClientStatus == api.AllocClientStatusRunning
		if !live || a.AllocatedResources == nil {
			continue
		}
		for _, task := range a.AllocatedResources.Tasks {
			for _, d := range task.Devices {
				for _, id := range d.DeviceIDs {
					out[id] = fmt.Sprintf("job %s, allocation %s %s (desired %s, client %s)",
						a.JobID, a.ID[:8], a.Name, a.DesiredStatus, a.ClientStatus)
				}
			}
		}
	}
	return out
}

func terminalClientStatus(s string) bool {
	return s == api.AllocClientStatusComplete || s == api.AllocClientStatusFailed || s == api.AllocClientStatusLost
}

func TestNodeReportsFakeGPUsWithAttributes(t *testing.T) {
	c := needCluster(t)
	_, g := c.nodeGPUs(t, fakeGPUsPerClient)

	if g.Name != "Tesla T4" {
		t.Errorf("group name = %q, want the fake model %q", g.Name, "Tesla T4")
	}
	want := map[string]string{
		"memory":              "15360 MiB",
		"fake":                "true",
		"compute_capability":  "7.5",
		"driver_version":      "550.54.15",
		"cuda_driver_version": "12.4",
		"power":               "70 W",
		"pci_bandwidth":       "15760 MB/s",
		"persistence_mode":    "Enabled",
	}
	for name, value := range want {
		a, ok := g.Attributes[name]
		if !ok {
			t.Errorf("attribute %q missing; have %v", name, keys(g.Attributes))
			continue
		}
		if got := a.String(); got != value {
			t.Errorf("attribute %q = %q, want %q", name, got, value)
		}
	}
	// pci_bus_id differs between the GPUs: it is per device (HwLocality),
	// never claimed for the whole group.
	if _, ok := g.Attributes["pci_bus_id"]; ok {
		t.Errorf("pci_bus_id reported as a group attribute although it differs per GPU")
	}
	ids := map[string]bool{}
	for _, inst := range g.Instances {
		if !regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`).MatchString(inst.ID) {
			t.Errorf("device ID %q is not a GPU UUID", inst.ID)
		}
		if inst.Locality == nil || inst.Locality.PciBusID == "" {
			t.Errorf("device %s has no PCI bus ID locality", inst.ID)
		}
		ids[inst.ID] = true
	}
	if len(ids) != fakeGPUsPerClient {
		t.Errorf("%d distinct device IDs, want %d", len(ids), fakeGPUsPerClient)
	}
}

var uuidList = regexp.MustCompile(`CUDA_VISIBLE_DEVICES=(\S*)`)

// visibleGPUs parses the CUDA_VISIBLE_DEVICES line a job printed.
func visibleGPUs(t *testing.T, out string) []string {
	t.Helper()
	m := uuidList.FindStringSubmatch(out)
	if m == nil || m[1] == "" {
		t.Fatalf("task output has no CUDA_VISIBLE_DEVICES: %q", out)
	}
	ids := strings.Split(m[1], ",")
	sort.Strings(ids)
	return ids
}

func TestJobGetsTwoDistinctGPUs(t *testing.T) {
	c := needCluster(t)
	_, g := c.nodeGPUs(t, fakeGPUsPerClient)
	known := map[string]bool{}
	for _, inst := range g.Instances {
		known[inst.ID] = true
	}

	job := gpuJob("e2e-two-gpus", 2, `echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"`)
	c.register(t, job)
	allocs := c.waitAllocs(t, ctx(t, 60*time.Second), *job.ID, "completion",
		allIn(api.AllocClientStatusComplete, api.AllocClientStatusFailed))
	if allocs[0].ClientStatus != api.AllocClientStatusComplete {
		t.Fatalf("allocation ended %s", allocs[0].ClientStatus)
	}
	out := c.stdout(t, allocs[0].ID)
	ids := visibleGPUs(t, out)
	if len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("CUDA_VISIBLE_DEVICES = %v, want 2 distinct UUIDs", ids)
	}
	for _, id := range ids {
		if !known[id] {
			t.Errorf("CUDA_VISIBLE_DEVICES holds %s, which the node never reported", id)
		}
	}
	if !strings.Contains(out, "NVIDIA_VISIBLE_DEVICES="+strings.Join(ids, ",")) &&
		!strings.Contains(out, "NVIDIA_VISIBLE_DEVICES="+ids[1]+","+ids[0]) {
		t.Errorf("NVIDIA_VISIBLE_DEVICES does not match CUDA_VISIBLE_DEVICES: %q", out)
	}

	// What Nomad recorded as allocated is what the task saw.
	alloc, _, err := c.nomad.Allocations().Info(allocs[0].ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	var recorded []string
	for _, d := range alloc.AllocatedResources.Tasks["t"].Devices {
		recorded = append(recorded, d.DeviceIDs...)
	}
	sort.Strings(recorded)
	if strings.Join(recorded, ",") != strings.Join(ids, ",") {
		t.Errorf("Nomad allocated %v but the task saw %v", recorded, ids)
	}
}

func TestConcurrentJobsGetDisjointGPUsAndThirdWaits(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	const hold = `echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; exec sleep 600`

	seen := map[string]string{}
	for _, id := range []string{"e2e-hold-a", "e2e-hold-b"} {
		job := gpuJob(id, 2, hold)
		c.register(t, job)
	}
	for _, id := range []string{"e2e-hold-a", "e2e-hold-b"} {
		allocs := c.waitAllocs(t, ctx(t, 60*time.Second), id, "running", allIn(api.AllocClientStatusRunning))
		out := c.waitStdout(t, ctx(t, 30*time.Second), allocs[0].ID, "CUDA_VISIBLE_DEVICES=GPU-")
		for _, gpu := range visibleGPUs(t, out) {
			if other, dup := seen[gpu]; dup {
				t.Errorf("GPU %s given to both %s and %s", gpu, other, id)
			}
			seen[gpu] = id
		}
	}
	if len(seen) != 4 {
		t.Fatalf("two jobs of 2 GPUs hold %d distinct GPUs, want 4: %v", len(seen), seen)
	}

	// All four GPUs are held: a third job cannot be placed, and Nomad says
	// the devices are what ran out.
	third := gpuJob("e2e-hold-c", 2, hold)
	resp := c.register(t, third)
	eval := c.waitEval(t, resp.EvalID)
	metric, ok := eval.FailedTGAllocs["g"]
	if !ok {
		t.Fatalf("third job was placed although every GPU is held (eval %s: %s)", eval.ID, eval.Status)
	}
	var devices []string
	for dim := range metric.DimensionExhausted {
		if strings.HasPrefix(dim, "devices") {
			devices = append(devices, dim)
		}
	}
	if len(devices) == 0 {
		t.Fatalf("placement failure does not name devices: exhausted dimensions %v", metric.DimensionExhausted)
	}
	t.Logf("third job pending: %d node(s) exhausted on %v", metric.NodesExhausted, devices)
	if eval.BlockedEval == "" {
		t.Errorf("no blocked evaluation: the third job would not be placed when GPUs free up")
	}

	// Freeing two GPUs lets the queued job run on exactly those.
	c.purge("e2e-hold-a")
	allocs := c.waitAllocs(t, ctx(t, 60*time.Second), *third.ID, "running after GPUs freed", allIn(api.AllocClientStatusRunning))
	out := c.waitStdout(t, ctx(t, 30*time.Second), allocs[0].ID, "CUDA_VISIBLE_DEVICES=GPU-")
	for _, gpu := range visibleGPUs(t, out) {
		if seen[gpu] != "e2e-hold-a" {
			t.Errorf("queued job got %s, held by %q, want one of e2e-hold-a's freed GPUs", gpu, seen[gpu])
		}
	}
}

// waitEval blocks until an evaluation is no longer pending.
func (c *cluster) waitEval(t *testing.T, id string) *api.Evaluation {
	t.Helper()
	ctx := ctx(t, 30*time.Second)
	var index uint64
	for {
		eval, meta, err := c.nomad.Evaluations().Info(id, (&api.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Second}).WithContext(ctx))
		if ctx.Err() != nil {
			t.Fatalf("evaluation %s still pending", id)
		}
		if err != nil {
			t.Fatalf("evaluation %s: %v", id, err)
		}
		index = meta.LastIndex
		if eval.Status != "pending" {
			return eval
		}
	}
}

func TestNvidiaPluginJobspecSchedulesUnchanged(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	src, err := os.ReadFile(filepath.Join(c.repo, "jobspecs", "examples", "nvidia-compat.nomad.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	job, err := c.nomad.Jobs().ParseHCL(string(src), true)
	if err != nil {
		t.Fatalf("Nomad does not parse the nomad-device-nvidia jobspec: %v", err)
	}
	c.register(t, job)
	allocs := c.waitAllocs(t, ctx(t, 60*time.Second), *job.ID, "completion",
		allIn(api.AllocClientStatusComplete, api.AllocClientStatusFailed))
	if allocs[0].ClientStatus != api.AllocClientStatusComplete {
		t.Fatalf("allocation ended %s", allocs[0].ClientStatus)
	}
	if out := c.stdout(t, allocs[0].ID); !regexp.MustCompile(`NVIDIA_VISIBLE_DEVICES=GPU-\S+`).MatchString(out) {
		t.Errorf("task saw no GPU: %q", out)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
