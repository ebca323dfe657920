package nomadseam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/queue/policy"
)

// server is a Nomad agent's HTTP API as far as the adapter uses it: each
// route answers with what the test put in it, in Nomad's JSON shapes and
// headers, and every request is recorded.
type server struct {
	t      *testing.T
	mu     sync.Mutex
	routes map[string]func(r *http.Request, body []byte) (int, any)
	seen   []*http.Request
	bodies map[string][]byte // last body by "METHOD path"
}

func newServer(t *testing.T) (*server, *Nomad) {
	s := &server{t: t, routes: map[string]func(*http.Request, []byte) (int, any){}, bodies: map[string][]byte{}}
	ts := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(ts.Close)
	cfg := api.DefaultConfig()
	cfg.Address, cfg.SecretID, cfg.Namespace = ts.URL, "", ""
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, New(c)
}

func (s *server) on(method, path string, h func(r *http.Request, body []byte) (int, any)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.routes[method+" "+path] = h
}

// answer is a route with a fixed answer.
func answer(code int, v any) func(*http.Request, []byte) (int, any) {
	return func(*http.Request, []byte) (int, any) { return code, v }
}

func (s *server) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.seen = append(s.seen, r)
	s.bodies[r.Method+" "+r.URL.Path] = body
	h := s.routes[r.Method+" "+r.URL.Path]
	s.mu.Unlock()
	if h == nil {
		http.Error(w, "no route "+r.Method+" "+r.URL.Path, http.StatusNotFound)
		return
	}
	code, v := h(r, body)
	w.Header().Set("X-Nomad-Index", "42")
	w.Header().Set("X-Nomad-LastContact", "0")
	w.Header().Set("X-Nomad-KnownLeader", "true")
	if idx, ok := v.(indexed); ok {
		w.Header().Set("X-Nomad-Index", fmt.Sprint(idx.index))
		v = idx.v
	}
	if code != http.StatusOK {
		w.WriteHeader(code)
		fmt.Fprint(w, v)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// indexed is an answer with its own X-Nomad-Index.
type indexed struct {
	index uint64
	v     any
}

// query is the last request's query to path.
func (s *server) query(path string) url.Values {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.seen) - 1; i >= 0; i-- {
		if s.seen[i].URL.Path == path {
			return s.seen[i].URL.Query()
		}
	}
	s.t.Fatalf("no request to %s", path)
	return nil
}

func gpuDriver() map[string]*api.DriverInfo {
	return map[string]*api.DriverInfo{"gpujob": {Detected: true, Healthy: true}, "raw_exec": {Detected: true, Healthy: true}}
}

func gpus(vendor, typ string, healthy ...bool) *api.NodeDeviceResource {
	g := &api.NodeDeviceResource{Vendor: vendor, Type: typ, Name: "Tesla T4"}
	for i, h := range healthy {
		g.Instances = append(g.Instances, &api.NodeDevice{ID: fmt.Sprintf("GPU-%s-%d", typ, i), Healthy: h})
	}
	return g
}

func node(id, name string, mod func(*api.NodeListStub)) *api.NodeListStub {
	s := &api.NodeListStub{ID: id, Name: name, Status: "ready", SchedulingEligibility: "eligible", Drivers: gpuDriver(),
		NodeResources: &api.NodeResources{Cpu: api.NodeCpuResources{CpuShares: 8000}, Memory: api.NodeMemoryResources{MemoryMB: 16384},
			Devices: []*api.NodeDeviceResource{gpus("nvidia", "gpu", true, true, true, true)}}}
	if mod != nil {
		mod(s)
	}
	return s
}

// Nodes keeps the nodes that take gpujob work and counts what each offers
// as the CLI does: healthy GPU instances only, CPU and memory less what
// the node reserves, unlimited where unreported.
func TestNodes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []*api.NodeListStub
		want  []policy.Node
	}{
		{"a plain node", []*api.NodeListStub{node("n1", "gpu-1", nil)},
			[]policy.Node{{Name: "gpu-1", Capacity: policy.Resources{GPUs: 4, CPUMHz: 8000, MemoryMB: 16384}}}},
		{"not ready, ineligible, draining, without or with an unhealthy gpujob driver: left out", []*api.NodeListStub{
			node("n1", "down", func(s *api.NodeListStub) { s.Status = "down" }),
			node("n2", "init", func(s *api.NodeListStub) { s.Status = "initializing" }),
			node("n3", "ineligible", func(s *api.NodeListStub) { s.SchedulingEligibility = "ineligible" }),
			node("n4", "draining", func(s *api.NodeListStub) { s.Drain = true }),
			node("n5", "no-driver", func(s *api.NodeListStub) { delete(s.Drivers, "gpujob") }),
			node("n6", "sick-driver", func(s *api.NodeListStub) { s.Drivers["gpujob"].Healthy = false }),
			node("n7", "undetected", func(s *api.NodeListStub) { s.Drivers["gpujob"].Detected = false }),
			node("n8", "ok", nil),
		}, []policy.Node{{Name: "ok", Capacity: policy.Resources{GPUs: 4, CPUMHz: 8000, MemoryMB: 16384}}}},
		{"reserved CPU and memory are not offered", []*api.NodeListStub{node("n1", "gpu-1", func(s *api.NodeListStub) {
			s.ReservedResources = &api.NodeReservedResources{Cpu: api.NodeReservedCpuResources{CpuShares: 500},
				Memory: api.NodeReservedMemoryResources{MemoryMB: 1024}}
		})}, []policy.Node{{Name: "gpu-1", Capacity: policy.Resources{GPUs: 4, CPUMHz: 7500, MemoryMB: 15360}}}},
		{"a reservation above the node leaves nothing", []*api.NodeListStub{node("n1", "gpu-1", func(s *api.NodeListStub) {
			s.ReservedResources = &api.NodeReservedResources{Cpu: api.NodeReservedCpuResources{CpuShares: 9000}}
		})}, []policy.Node{{Name: "gpu-1", Capacity: policy.Resources{GPUs: 4, CPUMHz: 0, MemoryMB: 16384}}}},
		{"unhealthy instances and devices that are not nvidia GPUs do not count", []*api.NodeListStub{node("n1", "gpu-1", func(s *api.NodeListStub) {
			s.NodeResources.Devices = []*api.NodeDeviceResource{gpus("nvidia", "gpu", true, false, true), gpus("nvidia", "fpga", true),
				gpus("amd", "gpu", true), gpus("nvidia", "gpu", false), nil}
		})}, []policy.Node{{Name: "gpu-1", Capacity: policy.Resources{GPUs: 2, CPUMHz: 8000, MemoryMB: 16384}}}},
		{"no resources reported: only GPUs limit", []*api.NodeListStub{node("n1", "cpu-only", func(s *api.NodeListStub) { s.NodeResources = nil })},
			[]policy.Node{{Name: "cpu-only", Capacity: policy.Resources{GPUs: 0, CPUMHz: Unreported, MemoryMB: Unreported}}}},
		{"a node that lists no drivers is not refused on them", []*api.NodeListStub{node("n1", "old", func(s *api.NodeListStub) { s.Drivers = nil })},
			[]policy.Node{{Name: "old", Capacity: policy.Resources{GPUs: 4, CPUMHz: 8000, MemoryMB: 16384}}}},
		{"nodes sharing a name are told apart by ID", []*api.NodeListStub{node("id-a", "gpu", nil), node("id-b", "gpu", nil)},
			[]policy.Node{{Name: "gpu (id-a)", Capacity: policy.Resources{GPUs: 4, CPUMHz: 8000, MemoryMB: 16384}},
				{Name: "gpu (id-b)", Capacity: policy.Resources{GPUs: 4, CPUMHz: 8000, MemoryMB: 16384}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, n := newServer(t)
			s.on("GET", "/v1/nodes", answer(200, tc.nodes))
			got, err := n.Nodes(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Nodes() = %+v\nwant     %+v", got, tc.want)
			}
			if q := s.query("/v1/nodes"); q.Get("resources") != "true" {
				t.Errorf("nodes listed without their resources: %v", q)
			}
		})
	}
}

func allocRes(cpu, mem int64, devices ...*api.AllocatedDeviceResource) *api.AllocatedTaskResources {
	return &api.AllocatedTaskResources{Cpu: api.AllocatedCpuResources{CpuShares: cpu}, Memory: api.AllocatedMemoryResources{MemoryMB: mem},
		Devices: devices}
}

func dev(vendor, typ string, ids ...string) *api.AllocatedDeviceResource {
	return &api.AllocatedDeviceResource{Vendor: vendor, Type: typ, Name: "Tesla T4", DeviceIDs: ids}
}

// Allocations lists what holds resources, in every namespace, with its
// job's meta and the sum of its tasks' CPU, memory and GPUs.
func TestAllocations(t *testing.T) {
	s, n := newServer(t)
	s.on("GET", "/v1/nodes", answer(200, []*api.NodeListStub{node("node-1", "gpu-1", nil), node("node-2", "gpu-2", nil)}))
	s.on("GET", "/v1/jobs", answer(200, []*api.JobListStub{
		{ID: "bert", Namespace: "team-a", Meta: map[string]string{"gpujob": "train", "gpujob_admission": "7.1"}},
		{ID: "web", Namespace: "default"},
	}))
	s.on("GET", "/v1/allocations", answer(200, []*api.AllocationListStub{
		{ID: "a1", Namespace: "team-a", JobID: "bert", NodeID: "node-1", NodeName: "gpu-1", ClientStatus: "running", DesiredStatus: "run",
			AllocatedResources: &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{
				"train": allocRes(1000, 2048, dev("nvidia", "gpu", "GPU-0", "GPU-1")),
				"side":  allocRes(100, 64, dev("nvidia", "fpga", "F-0")),
			}}},
		{ID: "a2", Namespace: "team-a", JobID: "bert", NodeID: "node-2", NodeName: "gpu-2", ClientStatus: "pending", DesiredStatus: "run",
			AllocatedResources: &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{"train": allocRes(1000, 2048, dev("nvidia", "gpu", "GPU-9"))}}},
		// Being stopped: holds its GPUs until its client says it has.
		{ID: "a3", Namespace: "default", JobID: "web", NodeID: "node-2", ClientStatus: "running", DesiredStatus: "stop",
			AllocatedResources: &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{"web": allocRes(500, 256)}}},
		{ID: "done", Namespace: "team-a", JobID: "bert", NodeID: "node-1", ClientStatus: "complete"},
		{ID: "failed", Namespace: "team-a", JobID: "bert", NodeID: "node-1", ClientStatus: "failed"},
		{ID: "lost", Namespace: "team-a", JobID: "bert", NodeID: "node-1", ClientStatus: "lost"},
		// Its job purged, its node gone from the list: still counted.
		{ID: "orphan", Namespace: "x", JobID: "gone", NodeID: "node-9", NodeName: "gpu-9", ClientStatus: "running"},
	}))
	got, err := n.Allocations(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []admit.Alloc{
		{ID: "a1", Namespace: "team-a", JobID: "bert", Node: "gpu-1", JobMeta: map[string]string{"gpujob": "train", "gpujob_admission": "7.1"},
			Resources: policy.Resources{GPUs: 2, CPUMHz: 1100, MemoryMB: 2112}, ClientStatus: "running", DesiredStatus: "run"},
		{ID: "a2", Namespace: "team-a", JobID: "bert", Node: "gpu-2", JobMeta: map[string]string{"gpujob": "train", "gpujob_admission": "7.1"},
			Resources: policy.Resources{GPUs: 1, CPUMHz: 1000, MemoryMB: 2048}, ClientStatus: "pending", DesiredStatus: "run"},
		{ID: "a3", Namespace: "default", JobID: "web", Node: "gpu-2", Resources: policy.Resources{CPUMHz: 500, MemoryMB: 256},
			ClientStatus: "running", DesiredStatus: "stop"},
		{ID: "orphan", Namespace: "x", JobID: "gone", Node: "gpu-9 (node-9)", ClientStatus: "running"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Allocations() =\n%+v\nwant\n%+v", got, want)
	}
	if q := s.query("/v1/allocations"); q.Get("namespace") != "*" || q.Get("resources") != "true" {
		t.Errorf("allocations listed with %v, want every namespace with resources", q)
	}
	if q := s.query("/v1/jobs"); q.Get("namespace") != "*" || q.Get("meta") != "true" {
		t.Errorf("jobs listed with %v, want every namespace with meta", q)
	}
}

// WaitAllocations is a blocking query from the index given, and answers
// Nomad's index; a cancelled context ends it.
func TestWaitAllocations(t *testing.T) {
	s, n := newServer(t)
	n.Wait = 90 * time.Second
	release := make(chan struct{})
	s.on("GET", "/v1/allocations", func(r *http.Request, _ []byte) (int, any) {
		if r.URL.Query().Get("index") == "17" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return 200, indexed{18, []*api.AllocationListStub{}}
		}
		return 200, indexed{17, []*api.AllocationListStub{}}
	})
	idx, err := n.WaitAllocations(context.Background(), 0)
	if err != nil || idx != 17 {
		t.Fatalf("WaitAllocations(0) = %d, %v; want 17 at once", idx, err)
	}
	q := s.query("/v1/allocations")
	if q.Get("namespace") != "*" || q.Get("per_page") != "1" {
		t.Errorf("the watch asks %v, want every namespace, one stub a page", q)
	}
	done := make(chan uint64)
	go func() {
		idx, err := n.WaitAllocations(context.Background(), 17)
		if err != nil {
			t.Error(err)
		}
		done <- idx
	}()
	select {
	case idx := <-done:
		t.Fatalf("WaitAllocations(17) answered %d before the allocations changed", idx)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if idx := <-done; idx != 18 {
		t.Errorf("WaitAllocations(17) = %d, want 18", idx)
	}
	q = s.query("/v1/allocations")
	if q.Get("index") != "17" || q.Get("wait") != "90000ms" {
		t.Errorf("the blocking query asks %v, want index 17 and wait 90000ms", q)
	}

	// Blocked, then cancelled: it returns the error at once.
	release2 := make(chan struct{})
	defer close(release2)
	s.on("GET", "/v1/allocations", func(r *http.Request, _ []byte) (int, any) {
		select {
		case <-release2:
		case <-r.Context().Done():
		}
		return 200, indexed{19, []*api.AllocationListStub{}}
	})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() { _, err := n.WaitAllocations(ctx, 18); errc <- err }()
	cancel()
	select {
	case err := <-errc:
		if err == nil {
			t.Error("a cancelled watch returned no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled watch did not return")
	}
}

func testJob(ns, id string) *api.Job {
	return &api.Job{ID: &id, Name: &id, Namespace: &ns, Type: ptr("batch"), Meta: map[string]string{"gpujob": "train"}}
}

func ptr[T any](v T) *T { return &v }

// Job reads what the controller needs; a missing job is nil, other
// failures are errors.
func TestJob(t *testing.T) {
	s, n := newServer(t)
	j := testJob("team-a", "bert")
	j.Stop, j.Status, j.JobModifyIndex = ptr(true), ptr("dead"), ptr(uint64(123))
	j.Meta["gpujob_admission"] = "7.2"
	s.on("GET", "/v1/job/bert", answer(200, j))
	info, err := n.Job(context.Background(), "team-a", "bert")
	want := &admit.JobInfo{Meta: map[string]string{"gpujob": "train", "gpujob_admission": "7.2"}, Stop: true, Status: "dead", ModifyIndex: 123}
	if err != nil || !reflect.DeepEqual(info, want) {
		t.Errorf("Job() = %+v, %v; want %+v", info, err, want)
	}
	if q := s.query("/v1/job/bert"); q.Get("namespace") != "team-a" {
		t.Errorf("job read in namespace %q", q.Get("namespace"))
	}
	info, err = n.Job(context.Background(), "team-a", "nope")
	if info != nil || err != nil {
		t.Errorf("a missing job: %+v, %v; want nil, nil", info, err)
	}
	s.on("GET", "/v1/job/boom", answer(500, "rpc error: no leader"))
	if _, err := n.Job(context.Background(), "team-a", "boom"); err == nil || !strings.Contains(err.Error(), "no leader") {
		t.Errorf("a failed read: %v", err)
	}
	s.on("GET", "/v1/job/secret", answer(403, "Permission denied"))
	if info, err := n.Job(context.Background(), "team-a", "secret"); err == nil || info != nil {
		t.Errorf("a refused read: %+v, %v; want an error", info, err)
	}
}

// Register sends Nomad's index check, and a failed check is
// admit.ErrConflict; other failures are not.
func TestRegister(t *testing.T) {
	for _, tc := range []struct {
		name     string
		index    uint64
		code     int
		answer   any
		conflict bool
		fails    bool
	}{
		{"new job", 0, 200, api.JobRegisterResponse{EvalID: "e1"}, false, false},
		{"stopped job of index 55", 55, 200, api.JobRegisterResponse{EvalID: "e1"}, false, false},
		{"exists", 0, 500, "Enforcing job modify index 0: job already exists", true, true},
		{"changed", 55, 500, "Enforcing job modify index 55: job exists with conflicting job modify index: 60", true, true},
		{"gone", 55, 500, "Enforcing job modify index 55: job does not exist", true, true},
		{"other failure", 0, 500, "rpc error: no cluster leader", false, true},
		{"refused", 0, 403, "Permission denied", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, n := newServer(t)
			s.on("PUT", "/v1/jobs", answer(tc.code, tc.answer))
			err := n.Register(context.Background(), testJob("team-a", "bert"), tc.index)
			if (err != nil) != tc.fails || errors.Is(err, admit.ErrConflict) != tc.conflict {
				t.Fatalf("Register() = %v; want failure %v, conflict %v", err, tc.fails, tc.conflict)
			}
			var req api.JobRegisterRequest
			if err := json.Unmarshal(s.bodies["PUT /v1/jobs"], &req); err != nil {
				t.Fatal(err)
			}
			if !req.EnforceIndex || req.JobModifyIndex != tc.index || *req.Job.ID != "bert" {
				t.Errorf("sent EnforceIndex %v JobModifyIndex %d, want true %d", req.EnforceIndex, req.JobModifyIndex, tc.index)
			}
			if q := s.query("/v1/jobs"); q.Get("namespace") != "team-a" {
				t.Errorf("registered in namespace %q, want the job's", q.Get("namespace"))
			}
		})
	}
}

// Plan asks in the job's namespace; Stop deregisters without purging and
// takes a missing job for stopped.
func TestPlanAndStop(t *testing.T) {
	s, n := newServer(t)
	s.on("PUT", "/v1/job/bert/plan", answer(200, api.JobPlanResponse{FailedTGAllocs: map[string]*api.AllocationMetric{"train": {NodesExhausted: 1}}}))
	plan, err := n.Plan(context.Background(), testJob("team-a", "bert"))
	if err != nil || plan.FailedTGAllocs["train"] == nil {
		t.Fatalf("Plan() = %+v, %v", plan, err)
	}
	if q := s.query("/v1/job/bert/plan"); q.Get("namespace") != "team-a" {
		t.Errorf("planned in namespace %q", q.Get("namespace"))
	}

	s.on("DELETE", "/v1/job/bert", answer(200, api.JobDeregisterResponse{EvalID: "e2"}))
	if err := n.Stop(context.Background(), "team-a", "bert"); err != nil {
		t.Fatal(err)
	}
	if q := s.query("/v1/job/bert"); q.Get("purge") != "false" || q.Get("namespace") != "team-a" {
		t.Errorf("stop asked %v, want no purge in team-a", q)
	}
	if err := n.Stop(context.Background(), "team-a", "missing"); err != nil {
		t.Errorf("stopping a missing job: %v", err)
	}
	s.on("DELETE", "/v1/job/boom", answer(500, "no leader"))
	if err := n.Stop(context.Background(), "team-a", "boom"); err == nil {
		t.Error("a failed stop returned no error")
	}
}

// JobAllocations lists a job's allocations, terminal ones too, each with
// the meta of the job version it ran, in the job's namespace.
func TestJobAllocations(t *testing.T) {
	s, n := newServer(t)
	v0, v1 := testJob("team-a", "bert"), testJob("team-a", "bert")
	v0.Version, v1.Version = ptr(uint64(0)), ptr(uint64(1))
	v0.Meta = map[string]string{"gpujob": "train", "gpujob_admission": "7.1"}
	v1.Meta = map[string]string{"gpujob": "train", "gpujob_admission": "7.2"}
	s.on("GET", "/v1/job/bert/allocations", answer(200, []*api.AllocationListStub{
		{ID: "a1", Namespace: "team-a", JobID: "bert", JobVersion: 0, NodeName: "c1", NodeID: "n1", ClientStatus: "complete", DesiredStatus: "stop"},
		{ID: "a2", Namespace: "team-a", JobID: "bert", JobVersion: 1, NodeName: "c2", NodeID: "n2", ClientStatus: "running", DesiredStatus: "run"},
		{ID: "a3", Namespace: "team-a", JobID: "bert", JobVersion: 9, NodeName: "c2", NodeID: "n2", ClientStatus: "lost", DesiredStatus: "stop"},
	}))
	s.on("GET", "/v1/job/bert/versions", answer(200, map[string]any{"Versions": []*api.Job{v1, v0}}))
	got, err := n.JobAllocations(context.Background(), "team-a", "bert")
	if err != nil {
		t.Fatal(err)
	}
	want := []admit.Alloc{
		{ID: "a1", Namespace: "team-a", JobID: "bert", Node: "c1 (n1)", JobMeta: v0.Meta, ClientStatus: "complete", DesiredStatus: "stop"},
		{ID: "a2", Namespace: "team-a", JobID: "bert", Node: "c2 (n2)", JobMeta: v1.Meta, ClientStatus: "running", DesiredStatus: "run"},
		{ID: "a3", Namespace: "team-a", JobID: "bert", Node: "c2 (n2)", ClientStatus: "lost", DesiredStatus: "stop"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("JobAllocations() =\n%+v\nwant\n%+v", got, want)
	}
	if q := s.query("/v1/job/bert/allocations"); q.Get("namespace") != "team-a" || q.Get("all") != "true" {
		t.Errorf("allocations listed with %v; want namespace team-a and all=true", q)
	}
	if q := s.query("/v1/job/bert/versions"); q.Get("namespace") != "team-a" {
		t.Errorf("versions read in namespace %q", q.Get("namespace"))
	}
	s.on("GET", "/v1/job/gone/allocations", answer(200, []*api.AllocationListStub{}))
	if got, err := n.JobAllocations(context.Background(), "team-a", "gone"); got != nil || err != nil {
		t.Errorf("a job without allocations: %+v, %v", got, err)
	}
	s.on("GET", "/v1/job/boom/allocations", answer(500, "rpc error: no leader"))
	if _, err := n.JobAllocations(context.Background(), "team-a", "boom"); err == nil || !strings.Contains(err.Error(), "no leader") {
		t.Errorf("a failed list: %v", err)
	}
}

// Unplaced sums the job summary's queued allocations over its groups, in
// the job's namespace; a missing job has none.
func TestUnplaced(t *testing.T) {
	s, n := newServer(t)
	s.on("GET", "/v1/job/svc/summary", answer(200, &api.JobSummary{JobID: "svc", Namespace: "team-a", Summary: map[string]api.TaskGroupSummary{
		"serve": {Queued: 2, Running: 1}, "side": {Queued: 1, Running: 3}}}))
	got, err := n.Unplaced(context.Background(), "team-a", "svc")
	if err != nil || got != 3 {
		t.Errorf("Unplaced() = %d, %v; want 3", got, err)
	}
	if q := s.query("/v1/job/svc/summary"); q.Get("namespace") != "team-a" {
		t.Errorf("summary read in namespace %q", q.Get("namespace"))
	}
	if got, err := n.Unplaced(context.Background(), "team-a", "gone"); got != 0 || err != nil {
		t.Errorf("a missing job: %d, %v; want 0, nil", got, err)
	}
	s.on("GET", "/v1/job/boom/summary", answer(500, "rpc error: no leader"))
	if _, err := n.Unplaced(context.Background(), "team-a", "boom"); err == nil || !strings.Contains(err.Error(), "no leader") {
		t.Errorf("a failed read: %v", err)
	}
}
