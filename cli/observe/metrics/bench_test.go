package metrics

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/observe"
)

// fakeNomad is a Nomad HTTP API of nodes × gpusPerNode fake GPUs, half of
// them held by 2-GPU members of training jobs, for the scrape benchmark.
// It counts the requests by endpoint and answers blocking queries by
// holding them (nothing changes).
type fakeNomad struct {
	nodes  []*api.Node
	stubs  []byte // /v1/nodes?resources=true
	allocs []byte // /v1/allocations
	jobs   []byte
	stats  map[string][]byte
	node   map[string][]byte
	nallo  map[string][]byte

	mu    sync.Mutex
	count map[string]int
}

func newFakeNomad(nodes, gpusPerNode int) *fakeNomad {
	f := &fakeNomad{stats: map[string][]byte{}, node: map[string][]byte{}, nallo: map[string][]byte{}, count: map[string]int{}}
	var stubs []*api.NodeListStub
	var allocs []*api.Allocation
	var jobs []*api.JobListStub
	for n := 0; n < nodes; n++ {
		id := fmt.Sprintf("%08d-0000-0000-0000-000000000000", n)
		name := fmt.Sprintf("gpu-%02d", n)
		var inst []*api.NodeDevice
		is := map[string]*api.DeviceStats{}
		for g := 0; g < gpusPerNode; g++ {
			uuid := fmt.Sprintf("GPU-%04d%04d-0000-0000-0000-000000000000", n, g)
			inst = append(inst, &api.NodeDevice{ID: uuid, Healthy: true})
			util, used, total, temp, clock := int64(40+g), int64(9000), int64(15360), int64(60), int64(1500)
			pw, pl := 55.0, 70.0
			is[uuid] = &api.DeviceStats{Stats: &api.StatObject{Attributes: map[string]*api.StatValue{
				"GPU utilization": {Unit: "%", IntNumeratorVal: &util}, "Memory utilization": {Unit: "%", IntNumeratorVal: &util},
				"Memory state": {Unit: "MiB", IntNumeratorVal: &used, IntDenominatorVal: &total},
				"Temperature":  {Unit: "C", IntNumeratorVal: &temp}, "SM clock": {Unit: "MHz", IntNumeratorVal: &clock},
				"Power usage":          {Unit: "W", FloatNumeratorVal: &pw, FloatDenominatorVal: &pl},
				"ECC corrected errors": {IntNumeratorVal: new(int64)}, "ECC uncorrected errors": {IntNumeratorVal: new(int64)},
			}}, Timestamp: time.Now()}
		}
		node := &api.Node{ID: id, Name: name, Status: "ready", NodeResources: &api.NodeResources{Devices: []*api.NodeDeviceResource{
			{Vendor: "nvidia", Type: "gpu", Name: "Tesla T4", Instances: inst}}}}
		f.nodes = append(f.nodes, node)
		stubs = append(stubs, &api.NodeListStub{ID: id, Name: name, Status: "ready", NodeResources: node.NodeResources})
		f.stats[id], _ = json.Marshal(&api.HostStats{DeviceStats: []*api.DeviceGroupStats{{Vendor: "nvidia", Type: "gpu", Name: "Tesla T4", InstanceStats: is}}})
		f.node[id], _ = json.Marshal(node)
		var nodeAllocs []*api.Allocation
		for m := 0; m < gpusPerNode/4; m++ { // half the GPUs held, 2 per member
			job := fmt.Sprintf("train-%02d-%d", n, m)
			jobs = append(jobs, &api.JobListStub{ID: job, Namespace: "default", Status: "running",
				Meta: map[string]string{"gpujob": "train", "gpujob_workers": "1", "gpujob_task": "train"}})
			a := &api.Allocation{ID: fmt.Sprintf("%08d-%04d-0000-0000-000000000000", n, m), Namespace: "default", JobID: job,
				Name: job + ".train[0]", NodeID: id, NodeName: name, ClientStatus: "running", DesiredStatus: "run",
				TaskStates: map[string]*api.TaskState{"train": {State: "running"}},
				AllocatedResources: &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{"train": {
					Devices: []*api.AllocatedDeviceResource{{Vendor: "nvidia", Type: "gpu", Name: "Tesla T4",
						DeviceIDs: []string{inst[2*m].ID, inst[2*m+1].ID}}}}}}}
			allocs = append(allocs, a)
			nodeAllocs = append(nodeAllocs, a)
		}
		f.nallo[id], _ = json.Marshal(nodeAllocs)
	}
	f.stubs, _ = json.Marshal(stubs)
	var as []*api.AllocationListStub
	for _, a := range allocs {
		as = append(as, &api.AllocationListStub{ID: a.ID, Namespace: a.Namespace, JobID: a.JobID, Name: a.Name,
			NodeID: a.NodeID, NodeName: a.NodeName, ClientStatus: a.ClientStatus, DesiredStatus: a.DesiredStatus,
			TaskStates: a.TaskStates, AllocatedResources: a.AllocatedResources})
	}
	f.allocs, _ = json.Marshal(as)
	f.jobs, _ = json.Marshal(jobs)
	return f
}

func (f *fakeNomad) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	endpoint := p
	switch {
	case strings.HasPrefix(p, "/v1/node/") && strings.HasSuffix(p, "/allocations"):
		endpoint = "/v1/node/:id/allocations"
	case strings.HasPrefix(p, "/v1/node/"):
		endpoint = "/v1/node/:id"
	}
	f.mu.Lock()
	f.count[endpoint]++
	f.mu.Unlock()
	// A blocking query on an index already seen waits: nothing changes.
	if idx, _ := strconv.Atoi(r.URL.Query().Get("index")); idx >= 7 {
		<-r.Context().Done()
		return
	}
	w.Header().Set("X-Nomad-Index", "7")
	w.Header().Set("Content-Type", "application/json")
	var body []byte
	switch {
	case p == "/v1/nodes":
		body = f.stubs
	case p == "/v1/allocations":
		body = f.allocs
	case p == "/v1/jobs":
		body = f.jobs
	case p == "/v1/client/stats":
		body = f.stats[r.URL.Query().Get("node_id")]
	case endpoint == "/v1/node/:id/allocations":
		body = f.nallo[strings.TrimSuffix(strings.TrimPrefix(p, "/v1/node/"), "/allocations")]
	case endpoint == "/v1/node/:id":
		body = f.node[strings.TrimPrefix(p, "/v1/node/")]
	}
	if body == nil {
		http.NotFound(w, r)
		return
	}
	_, _ = w.Write(body)
}

func (f *fakeNomad) take() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.count
	f.count = map[string]int{}
	return c
}

type arm struct {
	ms     []float64
	allocs []float64
	reqs   map[string]int
}

func median(v []float64) (med, lo, hi float64) {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2], s[0], s[len(s)-1]
}

// BenchmarkScrape64x8 times one /metrics scrape of an exporter watching a
// simulated cluster of 64 nodes × 8 GPUs over HTTP (a fake Nomad API),
// interleaved with its anchor, `gpujob gpus`' one-shot read of the same
// GPUs (observe.Once: the node, allocation and job lists, then one stats
// request per node, with no blocking query to lean on). Rounds are
// aggregated here (median and range), not by b.N.
//
//	go test -run '^$' -bench Scrape64x8 -benchtime 1x ./cli/observe/metrics/
func BenchmarkScrape64x8(b *testing.B) {
	const nodes, perNode, rounds = 64, 8, 11
	fake := newFakeNomad(nodes, perNode)
	srv := httptest.NewServer(fake)
	defer srv.Close()
	nomad, err := nomadapi.New(nomadapi.Options{Address: srv.URL})
	if err != nil {
		b.Fatal(err)
	}
	w := observe.NewWatcher(observe.Config{Nomad: nomad})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx) }()
	<-w.Ready()
	reg := prometheus.NewRegistry()
	reg.MustRegister(New(Options{Source: w}))
	handler := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	// The system job's exporter: one node's GPUs, and the cluster series.
	wn := observe.NewWatcher(observe.Config{Nomad: nomad, NodeID: fake.nodes[0].ID})
	go func() { _ = wn.Run(ctx) }()
	<-wn.Ready()
	regn := prometheus.NewRegistry()
	regn.MustRegister(New(Options{Source: wn}))
	handlerNode := promhttp.HandlerFor(regn, promhttp.HandlerOpts{})

	var scrape, node, anchor arm
	var series int
	measure := func(a *arm, f func()) {
		fake.take()
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		t := time.Now()
		f()
		a.ms = append(a.ms, float64(time.Since(t).Microseconds())/1000)
		runtime.ReadMemStats(&m1)
		a.allocs = append(a.allocs, float64(m1.Mallocs-m0.Mallocs))
		a.reqs = fake.take()
	}
	b.ResetTimer()
	for i := 0; i < rounds; i++ {
		measure(&scrape, func() {
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			if rec.Code != 200 {
				b.Fatalf("scrape: %d %s", rec.Code, rec.Body)
			}
			series = strings.Count(rec.Body.String(), "\nDCGM_FI_DEV_GPU_UTIL{")
		})
		measure(&node, func() {
			rec := httptest.NewRecorder()
			handlerNode.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			if rec.Code != 200 || strings.Count(rec.Body.String(), "\nDCGM_FI_DEV_GPU_UTIL{") != perNode {
				b.Fatalf("one node's scrape: %d", rec.Code)
			}
		})
		measure(&anchor, func() {
			s, err := observe.Once(ctx, observe.Config{Nomad: nomad})
			if err != nil {
				b.Fatalf("observe.Once: %v", err)
			}
			n := 0
			for _, node := range s.Nodes {
				n += len(node.GPUs)
			}
			if n != nodes*perNode {
				b.Fatalf("observe.Once: %d GPUs, want %d", n, nodes*perNode)
			}
		})
	}
	b.StopTimer()
	if series != nodes*perNode {
		b.Fatalf("the scrape exported %d GPU utilisation series, want %d", series, nodes*perNode)
	}
	if scrape.reqs["/v1/client/stats"] != nodes || len(scrape.reqs) != 1 {
		b.Fatalf("one scrape made %v: want exactly one stats request per node and nothing else", scrape.reqs)
	}
	sm, slo, shi := median(scrape.ms)
	am, alo, ahi := median(anchor.ms)
	nm, nlo, nhi := median(node.ms)
	na, _, _ := median(node.allocs)
	sa, _, _ := median(scrape.allocs)
	aa, _, _ := median(anchor.allocs)
	b.ReportMetric(sm, "scrape-ms")
	b.ReportMetric(am, "gpus-once-ms")
	b.ReportMetric(sa, "scrape-allocs")
	b.ReportMetric(float64(scrape.reqs["/v1/client/stats"]), "scrape-requests")
	b.Logf("%d nodes × %d GPUs, %d rounds interleaved, on %d CPUs", nodes, perNode, rounds, runtime.NumCPU())
	b.Logf("exporter scrape: median %.1f ms (%.1f–%.1f), %.0f allocations, requests %v", sm, slo, shi, sa, scrape.reqs)
	b.Logf("one node's exporter (the system job's): median %.2f ms (%.2f–%.2f), %.0f allocations, requests %v", nm, nlo, nhi, na, node.reqs)
	b.Logf("gpujob gpus one-shot read (anchor): median %.1f ms (%.1f–%.1f), %.0f allocations, requests %v", am, alo, ahi, aa, anchor.reqs)
}
