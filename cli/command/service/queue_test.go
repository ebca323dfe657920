package service

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
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
	// An autoscaled service is queued with its initial replicas as the
	// gang, and keeps its scaling block: it scales within replicas { min
	// max } through Nomad, and the controller weighs what Nomad cannot
	// place.
	f := newFake()
	f.SetNode(gpuNode(4))
	t.Cleanup(func() { _, _ = c.KV().DeleteTree(contract.QueueJobsPrefix+"/", nil) })
	if out, err := execute(t, c, f, "deploy", "--detach", "--queue", "default", gpuSpec(t, "q-auto")); err != nil || len(f.Registered) != 0 {
		t.Fatalf("an autoscaled service in queue mode: err %v, registered %d\n%s", err, len(f.Registered), out)
	}
	auto, _, err := c.KV().Get(contract.QueueJobsPrefix+"/default/q-auto", nil)
	if err != nil || auto == nil {
		t.Fatalf("no queue record of the autoscaled service: %v", err)
	}
	ar, ajob, err := admit.DecodeJobRecord(auto.Value, time.Now())
	if err != nil || ar.Members != 2 || ajob.TaskGroups[0].Scaling == nil || *ajob.TaskGroups[0].Scaling.Max != 4 {
		t.Fatalf("record of the autoscaled service %+v (%v): want its 2 initial replicas and its scaling block up to 4", ar, err)
	}
	fixed := fixedSpec(t, gpuSpec(t, "q-ok"))
	out, err := execute(t, c, f, "deploy", "--detach", "--json", "--queue", "default", fixed)
	if err != nil || len(f.Registered) != 0 {
		t.Fatalf("err %v, registered %d\n%s", err, len(f.Registered), out)
	}
	kv, _, err := c.KV().Get(contract.QueueJobsPrefix+"/default/q-ok", nil)
	if err != nil || kv == nil {
		t.Fatalf("no queue record: %v", err)
	}
	jr, job, err := admit.DecodeJobRecord(kv.Value, time.Now())
	if err != nil || jr.Kind != admit.KindService || jr.Members != 2 || job.Meta[MetaRoute] == "" {
		t.Fatalf("record %+v: %v", jr, err)
	}
	var res DeployResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Status != "queued" || res.Queue == nil || res.Queue.State != "waiting" {
		t.Errorf("json %+v (%v):\n%s", res, err, out)
	}
	r, _ := servestore.Open(&factory.Factory{Consul: func() (*consul.Client, error) { return c, nil }})
	if route, _ := r.Route(context.Background(), "default", "q-ok"); route == nil {
		t.Errorf("a queued service's route was not written")
	}
	// Deploying it again while it waits is refused: it is queued already.
	if _, err := execute(t, c, f, "deploy", "--detach", "--queue", "default", fixed); err == nil || !strings.Contains(err.Error(), "already in queue default") {
		t.Errorf("second deploy: %v", err)
	}
	// service status shows it queued.
	out, err = execute(t, c, f, "status", "q-ok")
	if err != nil || !strings.Contains(out, "queue      queued in default: waiting for the admission controller's first answer") ||
		!strings.Contains(out, "replicas   2, started together when all fit") {
		t.Errorf("status: %v\n%s", err, out)
	}
	// Stopping it withdraws it.
	out, err = execute(t, c, f, "stop", "q-ok")
	if err != nil || !strings.Contains(out, "Job q-ok withdrawn from queue default") {
		t.Errorf("stop: %v\n%s", err, out)
	}
}

// An update of a service the queue admitted is registered directly with
// the admission marker kept (a job without it would look unadmitted to the
// controller) and its record replaced at the same place; one that asks
// for more GPUs than were admitted is refused.
func TestUpdateOfAnAdmittedService(t *testing.T) {
	c := consulClient(t)
	store := queuekv.New(c, "")
	rec := &queuekv.Record{Format: queuekv.Format, File: "queues.hcl", SHA256: strings.Repeat("1", 64), AppliedBy: "ops@test",
		AppliedAt: time.Unix(1, 0).UTC(), Queues: []queuekv.Queue{{Name: "default", Weight: 1, Priority: 50}}}
	if _, err := store.Write(context.Background(), rec, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = c.KV().Delete(contract.QueueConfigKey, nil)
		_, _ = c.KV().DeleteTree(contract.QueueJobsPrefix+"/", nil)
	})
	f := newFake()
	f.SetNode(gpuNode(4))
	spec := fixedSpec(t, writeSpec(t, "upd", "v1"))
	if out, err := execute(t, c, f, "deploy", "--detach", spec); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	kv, _, _ := c.KV().Get(contract.QueueJobsPrefix+"/default/upd", nil)
	// The controller admits it: registers the record's job with its marker.
	_, job, err := admit.DecodeJobRecord(kv.Value, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	marker := admit.Marker(kv.CreateIndex, 1)
	job.Meta[contract.MetaAdmission] = marker
	if _, err := f.Register(job); err != nil {
		t.Fatal(err)
	}
	out, err := execute(t, c, f, "deploy", "--detach", rewrite(t, spec, `version = "v1"`, `version = "v2"`))
	if err != nil || len(f.Registered) != 2 {
		t.Fatalf("err %v, registered %d\n%s", err, len(f.Registered), out)
	}
	if got := f.Registered[1].Meta[contract.MetaAdmission]; got != marker {
		t.Errorf("the update's marker %q, want %q", got, marker)
	}
	kv2, _, _ := c.KV().Get(contract.QueueJobsPrefix+"/default/upd", nil)
	_, job2, err := admit.DecodeJobRecord(kv2.Value, time.Now())
	if err != nil || kv2.CreateIndex != kv.CreateIndex || job2.Meta[contract.MetaVersion] != "v2" {
		t.Errorf("the record was not replaced in place: %v, create index %d → %d, version %q", err, kv.CreateIndex, kv2.CreateIndex, job2.Meta[contract.MetaVersion])
	}
	// It scales within its replicas { min max } as without a queue (2 to
	// 2 here: 3 is outside); the controller weighs what Nomad cannot place.
	if _, err := execute(t, c, f, "scale", "upd", "3"); err == nil || !strings.Contains(err.Error(), "runs 2 to 2 replicas") {
		t.Errorf("scale of an admitted service beyond its bounds: %v", err)
	}
	// One admitted before services kept their scaling block has no bounds
	// to scale in.
	noBounds := f.Registered[1]
	noBounds.TaskGroups[0].Scaling = nil
	f.SetJob(noBounds)
	if _, err := execute(t, c, f, "scale", "upd", "1"); err == nil || !strings.Contains(err.Error(), "no replicas { min max } to scale in") {
		t.Errorf("scale of an admitted service without a scaling block: %v", err)
	}
	// More GPUs than admitted: refused, nothing registered.
	big := rewrite(t, spec, "gpus_per_replica = 0", "gpus_per_replica = 1")
	if _, err := execute(t, c, f, "deploy", "--detach", big); err == nil || !strings.Contains(err.Error(), "an update may not add GPUs") {
		t.Errorf("a bigger update: %v", err)
	}
}

// fixedSpec turns the test's autoscaled service spec at p into one with a
// fixed count of 2 replicas.
func fixedSpec(t *testing.T, p string) string {
	t.Helper()
	rewrite(t, p, "min     = 1\n    max     = 4\n    initial = 2", "min     = 2\n    initial = 2")
	return rewrite(t, p, "autoscale {\n    target_inflight = 2\n  }", "")
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
