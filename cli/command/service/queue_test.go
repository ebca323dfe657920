package service

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
)

// A deploy into a queue the configuration lacks, or one whose initial
// replicas its queue's quota could never hold, is refused before the job
// is registered or its route written; --queue overrides the spec's.
func TestDeployIsCheckedAgainstItsQueue(t *testing.T) {
	c := consulClient(t)
	store := queuekv.New(c, "")
	rec := &queuekv.Record{Format: queuekv.Format, File: "queues.hcl", SHA256: strings.Repeat("1", 64), AppliedBy: "ops@test",
		AppliedAt: time.Unix(1, 0).UTC(), Queues: []queuekv.Queue{
			{Name: "default", Weight: 1, Priority: 50}, {Name: "serving", GPUs: 1, Weight: 1, Priority: 50}}}
	if _, err := store.Write(context.Background(), rec, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.KV().Delete(contract.QueueConfigKey, nil) })
	gpuSpec := func(t *testing.T, name string) string {
		p := writeSpec(t, name, "v1")
		return rewrite(t, p, "gpus_per_replica = 0", "gpus_per_replica = 1\n  queue = \"nope\"")
	}
	for _, tc := range []struct {
		name, svc string
		args      []string
		want      string
	}{
		{"unknown queue in the spec", "q-unknown", nil, `unknown queue "nope" (queues: default, serving)`},
		{"over the quota", "q-quota", []string{"--queue", "serving"}, "job q-quota needs 2 GPUs; queue serving's quota is 1 GPUs and borrowing is off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			f.SetNode(gpuNode(4))
			args := append(append([]string{"deploy", "--detach"}, tc.args...), gpuSpec(t, tc.svc))
			out, err := execute(t, c, f, args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q\n%s", err, tc.want, out)
			}
			if len(f.Registered) != 0 {
				t.Errorf("registered %d jobs", len(f.Registered))
			}
			r, _ := servestore.Open(&factory.Factory{Consul: func() (*consul.Client, error) { return c, nil }})
			if route, _ := r.Route(context.Background(), "default", tc.svc); route != nil {
				t.Errorf("a route was written for a refused deploy: %+v", route)
			}
		})
	}
	f := newFake()
	f.SetNode(gpuNode(4))
	if out, err := execute(t, c, f, "deploy", "--detach", "--queue", "default", gpuSpec(t, "q-ok")); err != nil || len(f.Registered) != 1 {
		t.Fatalf("err %v, registered %d\n%s", err, len(f.Registered), out)
	}
}

// gpuNode is a ready node with n GPUs that runs the gpujob driver.
func gpuNode(n int) *api.Node {
	var devs []*api.NodeDevice
	for i := range n {
		devs = append(devs, &api.NodeDevice{ID: "GPU-" + string(rune('a'+i)), Healthy: true})
	}
	return &api.Node{ID: "n1", Name: "gpu-1", Status: "ready", SchedulingEligibility: "eligible",
		Drivers: map[string]*api.DriverInfo{"gpujob": {Detected: true, Healthy: true}},
		NodeResources: &api.NodeResources{Cpu: api.NodeCpuResources{CpuShares: 8000}, Memory: api.NodeMemoryResources{MemoryMB: 16384},
			Devices: []*api.NodeDeviceResource{{Vendor: "nvidia", Type: "gpu", Name: "Tesla T4", Instances: devs}}}}
}

// rewrite replaces old with new in the file at p, and returns p.
func rewrite(t *testing.T, p, old, new string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil || !strings.Contains(string(b), old) {
		t.Fatalf("%s lacks %q: %v", p, old, err)
	}
	if err := os.WriteFile(p, []byte(strings.Replace(string(b), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
