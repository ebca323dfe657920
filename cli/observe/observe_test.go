package observe

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/taskevent"
)

func ptr[T any](v T) *T { return &v }

// testNode is a ready node with n fake T4s, GPU-<name>-<i>.
func testNode(id, name string, n int) *api.Node {
	var inst []*api.NodeDevice
	for i := n - 1; i >= 0; i-- { // out of order: the index sorts them
		inst = append(inst, &api.NodeDevice{ID: fmt.Sprintf("GPU-%s-%d", name, i), Healthy: i != 1,
			HealthDescription: map[bool]string{true: "Xid 79: fallen off the bus"}[i == 1]})
	}
	return &api.Node{ID: id, Name: name, Status: "ready", NodeResources: &api.NodeResources{
		Devices: []*api.NodeDeviceResource{{Vendor: "nvidia", Type: "gpu", Name: "Tesla T4", Instances: inst,
			Attributes: map[string]*api.Attribute{"fake": {BoolVal: ptr(true)}}}}}}
}

func testStats(node string, n int, util int64) *api.HostStats {
	is := map[string]*api.DeviceStats{}
	for i := 0; i < n; i++ {
		is[fmt.Sprintf("GPU-%s-%d", node, i)] = &api.DeviceStats{Stats: &api.StatObject{Attributes: map[string]*api.StatValue{
			"GPU utilization": {IntNumeratorVal: ptr(util + int64(i))},
			"Memory state":    {IntNumeratorVal: ptr(int64(1000)), IntDenominatorVal: ptr(int64(15360))},
			"Power usage":     {FloatNumeratorVal: ptr(27.5), FloatDenominatorVal: ptr(70.0)},
			"Temperature":     {StringVal: ptr("N/A")},
		}}}
	}
	return &api.HostStats{DeviceStats: []*api.DeviceGroupStats{{Vendor: "nvidia", Type: "gpu", Name: "Tesla T4", InstanceStats: is}}}
}

func event(kind taskevent.Kind, round int, at time.Time, restarts int) *api.TaskEvent {
	e := taskevent.Event{Kind: kind, Round: round, Restarts: restarts, MaxRestarts: 3, FirstRank: round % 2, LastRank: round % 2}
	return &api.TaskEvent{Type: api.TaskDriverMessage, Time: at.UnixNano(), DriverMessage: string(kind), Details: e.Encode()}
}

func trainAlloc(id, job, name, node string, gpus []string, events ...*api.TaskEvent) *api.Allocation {
	return &api.Allocation{ID: id, Namespace: "default", JobID: job, Name: name, NodeID: "n-" + node, NodeName: node,
		ClientStatus: "running", DesiredStatus: "run", Job: &api.Job{Version: ptr(uint64(0))},
		TaskStates: map[string]*api.TaskState{"train": {State: "running", Events: events}},
		AllocatedResources: &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{"train": {
			Devices: []*api.AllocatedDeviceResource{{Vendor: "nvidia", Type: "gpu", Name: "Tesla T4", DeviceIDs: gpus}}}}}}
}

func TestWatcherSnapshot(t *testing.T) {
	f := nomadapi.NewFake()
	f.SetNode(testNode("n-a", "a", 4))
	f.SetNode(testNode("n-b", "b", 2))
	f.SetNode(&api.Node{ID: "n-cpu", Name: "cpu", Status: "ready", NodeResources: &api.NodeResources{}})
	f.SetNodeStats("n-a", testStats("a", 4, 10))
	f.SetNodeStats("n-b", testStats("b", 2, 90))
	f.SetNodeStats("n-cpu", &api.HostStats{})
	t0 := time.Unix(1_800_000_000, 0)
	f.SetJob(&api.Job{ID: ptr("bert"), Namespace: ptr("default"), Status: ptr("running"), Version: ptr(uint64(0)),
		Meta: map[string]string{"gpujob": "train", "gpujob_workers": "2", "gpujob_task": "train"}})
	f.SetJob(&api.Job{ID: ptr("trial-1"), Namespace: ptr("default"), Status: ptr("pending"),
		Meta: map[string]string{"gpujob": "train", "gpujob_sweep": "s"}, SubmitTime: ptr(t0.UnixNano())})
	started := func(at time.Time) *api.TaskEvent { return &api.TaskEvent{Type: api.TaskStarted, Time: at.UnixNano()} }
	f.SetAlloc(trainAlloc("a0", "bert", "bert.train[0]", "a", []string{"GPU-a-0"},
		started(t0), event(taskevent.Joined, 1, t0.Add(2*time.Second), 0),
		event(taskevent.Restarting, 1, t0.Add(10*time.Second), 0), event(taskevent.Joined, 2, t0.Add(13*time.Second), 1)))
	f.SetAlloc(trainAlloc("b0", "bert", "bert.train[1]", "b", []string{"GPU-b-1"},
		started(t0.Add(time.Second)), event(taskevent.Joined, 1, t0.Add(2*time.Second), 0),
		event(taskevent.Restarting, 1, t0.Add(11*time.Second), 0), event(taskevent.Joined, 2, t0.Add(14500*time.Millisecond), 1)))

	var mu sync.Mutex
	reqs := map[string]int{}
	issued := make(chan struct{}, 1) // a request was counted
	count := func(e string) {
		mu.Lock()
		reqs[e]++
		mu.Unlock()
		select {
		case issued <- struct{}{}:
		default:
		}
	}
	w := NewWatcher(Config{Nomad: f, Now: func() time.Time { return t0.Add(time.Minute) }, Requests: count})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	select {
	case <-w.Ready():
	case <-time.After(5 * time.Second):
		t.Fatal("the watcher never became ready")
	}
	// Ready means the first answers are in; each loop then issues its next
	// (blocking) query. Wait until all three have, so that what is counted
	// below is the snapshot's requests alone.
	deadline := time.After(5 * time.Second)
	for {
		mu.Lock()
		parked := reqs["nodes"] >= 2 && reqs["allocations"] >= 2 && reqs["jobs"] >= 2
		mu.Unlock()
		if parked {
			break
		}
		select {
		case <-issued:
		case <-deadline:
			t.Fatal("the watcher's loops never issued their blocking queries")
		}
	}
	mu.Lock()
	for k := range reqs {
		delete(reqs, k)
	}
	mu.Unlock()
	s, err := w.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if reqs["node-stats"] != 2 || len(reqs) != 1 {
		t.Errorf("one snapshot made %v, want 2 node-stats requests (one per node with GPUs) and nothing else", reqs)
	}
	mu.Unlock()

	if len(s.Nodes) != 2 || s.Nodes[0].Name != "a" || len(s.Nodes[0].GPUs) != 4 {
		t.Fatalf("nodes: %+v", s.Nodes)
	}
	a := s.Nodes[0].GPUs
	for i, g := range a {
		if g.Index != i || g.UUID != fmt.Sprintf("GPU-a-%d", i) {
			t.Errorf("GPU %d is %s index %d", i, g.UUID, g.Index)
		}
	}
	if a[1].Healthy || a[1].HealthDescription == "" || !a[0].Healthy || !a[0].Fake {
		t.Errorf("health: %+v / %+v", a[0], a[1])
	}
	if a[2].UtilPct == nil || *a[2].UtilPct != 12 || *a[2].MemUsedMiB != 1000 || *a[2].MemTotalMiB != 15360 ||
		*a[2].PowerW != 27.5 || *a[2].PowerLimitW != 70 || a[2].TempC != nil {
		t.Errorf("stats of GPU-a-2: %+v", a[2])
	}
	if h := a[0].Holder; h == nil || h.JobID != "bert" || h.AllocID != "a0" || h.Task != "train" || h.Kind != KindTrain {
		t.Errorf("holder of GPU-a-0: %+v", h)
	}
	if a[3].Holder != nil {
		t.Errorf("GPU-a-3 is free, got holder %+v", a[3].Holder)
	}

	if len(s.Jobs) != 1 {
		t.Fatalf("jobs: %+v (a trial is not a training job)", s.Jobs)
	}
	j := s.Jobs[0]
	if j.ID != "bert" || j.Workers != 2 || j.MembersByState["running"] != 2 || j.MembersByState["failed"] != 0 ||
		j.Round != 2 || j.Restarts != 1 || j.MaxRestarts != 3 || len(j.Members) != 2 {
		t.Errorf("job: %+v", j)
	}
	// round 2 began at the first restart (10 s) and ended with the last join (14.5 s)
	if j.RoundSeconds == nil || *j.RoundSeconds != 4.5 {
		t.Errorf("round seconds = %v, want 4.5", j.RoundSeconds)
	}
	if len(s.Queue) != 0 {
		t.Errorf("queue %+v: the fake has no queued allocation", s.Queue)
	}

	// A node filter: only that node's GPUs and stats.
	wb := NewWatcher(Config{Nomad: f, NodeID: "n-b", Requests: count})
	go func() { _ = wb.Run(ctx) }()
	<-wb.Ready()
	mu.Lock()
	reqs = map[string]int{}
	mu.Unlock()
	sb, err := wb.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(sb.Nodes) != 1 || sb.Nodes[0].ID != "n-b" || reqs["node-stats"] != 1 {
		t.Errorf("node filter: %+v, %v", sb.Nodes, reqs)
	}
	mu.Unlock()

	// A change wakes the watcher's blocking queries and is signalled.
	drain(w.Changed())
	f.SetNodeStats("n-a", testStats("a", 4, 50))
	f.SetAlloc(trainAlloc("a9", "other", "other.train[0]", "a", []string{"GPU-a-3"}))
	select {
	case <-w.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("no change signalled after an allocation was added")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func TestStatsErrorIsAWarningNotAFailure(t *testing.T) {
	f := nomadapi.NewFake()
	f.SetNode(testNode("n-a", "a", 2))
	f.SetNode(testNode("n-b", "b", 2))
	f.SetNodeStats("n-b", testStats("b", 2, 5)) // n-a has none: 404
	w := NewWatcher(Config{Nomad: f})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx) }()
	<-w.Ready()
	s, err := w.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Nodes[0].StatsErr == "" || s.Nodes[0].GPUs[0].UtilPct != nil || len(s.Warnings) != 1 {
		t.Errorf("node a without stats: %+v, warnings %q", s.Nodes[0], s.Warnings)
	}
	if s.Nodes[1].GPUs[0].UtilPct == nil {
		t.Errorf("node b's stats were lost with a's")
	}
}

func TestElected(t *testing.T) {
	f := nomadapi.NewFake()
	for _, a := range []struct{ id, node, status string }{{"x1", "n-2", "running"}, {"x2", "n-1", "running"}, {"x3", "n-0", "pending"}} {
		f.SetAlloc(&api.Allocation{ID: a.id, Namespace: "default", JobID: "gpujob-exporter", NodeID: a.node,
			ClientStatus: a.status, DesiredStatus: "run"})
	}
	w := NewWatcher(Config{Nomad: f})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx) }()
	<-w.Ready()
	for id, want := range map[string]bool{"x1": false, "x2": true, "x3": false} {
		if got := w.Elected("default", "gpujob-exporter", id); got != want {
			t.Errorf("Elected(%s) = %v, want %v (the running one on the lowest node)", id, got, want)
		}
	}
	if w.Elected("other", "gpujob-exporter", "x2") {
		t.Error("elected in another namespace's job")
	}
}

func TestAssembleQueueAndKinds(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	sum := func(q int) *api.JobSummary {
		return &api.JobSummary{Summary: map[string]api.TaskGroupSummary{"train": {Queued: q}}}
	}
	in := Inputs{Now: t0, Jobs: []*api.JobListStub{
		{ID: "late", Namespace: "ml", Status: "pending", Meta: map[string]string{"gpujob": "train"}, JobSummary: sum(2), SubmitTime: t0.Add(-time.Minute).UnixNano()},
		{ID: "early", Namespace: "ml", Status: "pending", Meta: map[string]string{"gpujob": "train", "gpujob_sweep": "s"}, JobSummary: sum(1), SubmitTime: t0.Add(-time.Hour).UnixNano()},
		{ID: "svc", Namespace: "ml", Status: "running", Meta: map[string]string{"gpujob": "service"}, JobSummary: sum(0)},
		{ID: "nomad-own", Namespace: "ml", Status: "pending", JobSummary: sum(5)},
		{ID: "stopped", Namespace: "ml", Status: "dead", Stop: true, Meta: map[string]string{"gpujob": "train"}, JobSummary: sum(3)},
	}}
	s := Assemble(in)
	if len(s.Queue) != 2 || s.Queue[0].JobID != "early" || s.Queue[0].Kind != KindTrial || s.Queue[1].Queued != 2 ||
		!s.Queue[1].Since.Equal(t0.Add(-time.Minute)) {
		t.Errorf("queue: %+v", s.Queue)
	}
	if len(s.Jobs) != 2 || s.Jobs[0].ID != "late" || s.Jobs[1].ID != "stopped" {
		t.Errorf("training jobs: %+v", s.Jobs)
	}
	for meta, want := range map[string]string{"train": KindTrain, "service": KindService, "gateway": "", "": ""} {
		if got := JobKind(map[string]string{"gpujob": meta}); got != want {
			t.Errorf("JobKind(%q) = %q, want %q", meta, got, want)
		}
	}
}

// A gpujob job's queue (its meta) goes with the GPUs it holds and with its
// place among the jobs Nomad has not placed; a job gpujob did not render
// has none, whatever its meta says.
func TestAssembleQueues(t *testing.T) {
	node := &api.NodeListStub{ID: "n1", Name: "n1", Status: "ready", NodeResources: &api.NodeResources{Devices: []*api.NodeDeviceResource{
		{Vendor: "nvidia", Type: "gpu", Instances: []*api.NodeDevice{{ID: "g0", Healthy: true}, {ID: "g1", Healthy: true}}}}}}
	holds := func(job, gpu string) *api.AllocationListStub {
		return &api.AllocationListStub{ID: job + "-0", Namespace: "ml", JobID: job, ClientStatus: "running",
			AllocatedResources: &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{
				"t": {Devices: []*api.AllocatedDeviceResource{{DeviceIDs: []string{gpu}}}}}}}
	}
	in := Inputs{Nodes: []*api.NodeListStub{node}, Allocs: []*api.AllocationListStub{holds("a", "g0"), holds("x", "g1")},
		Jobs: []*api.JobListStub{
			{ID: "a", Namespace: "ml", Status: "running", Meta: map[string]string{"gpujob": "train", "gpujob_queue": "team-a"},
				JobSummary: &api.JobSummary{Summary: map[string]api.TaskGroupSummary{"train": {Queued: 1}}}},
			{ID: "x", Namespace: "ml", Status: "running", Meta: map[string]string{"gpujob_queue": "team-a"}},
		}}
	s := Assemble(in)
	got := map[string]string{}
	for _, g := range s.Nodes[0].GPUs {
		got[g.Holder.JobID] = g.Holder.Queue
	}
	if got["a"] != "team-a" || got["x"] != "" {
		t.Errorf("holders' queues %v", got)
	}
	if len(s.Queue) != 1 || s.Queue[0].Queue != "team-a" {
		t.Errorf("waiting %+v", s.Queue)
	}
}
