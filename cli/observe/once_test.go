package observe

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/nomadapi"
)

// Once reads the same inventory a Watcher keeps, with one request per list
// and one stats request per ready node with GPUs; Totals counts it.
func TestOnceAndTotals(t *testing.T) {
	f := nomadapi.NewFake()
	f.SetNode(testNode("n-a", "a", 4))
	down := testNode("n-b", "b", 2)
	down.Status = "down"
	f.SetNode(down)
	f.SetNodeStats("n-a", testStats("a", 4, 50))
	f.SetAlloc(trainAlloc("alloc-1", "bert", "bert.train[0]", "a", []string{"GPU-a-0", "GPU-a-2"}))
	reqs := map[string]int{}
	s, err := Once(context.Background(), Config{Nomad: f, Requests: func(e string) { reqs[e]++ }})
	if err != nil {
		t.Fatal(err)
	}
	if reqs["nodes"] != 1 || reqs["allocations"] != 1 || reqs["jobs"] != 1 || reqs["node-stats"] != 1 || len(reqs) != 4 {
		t.Errorf("requests %v; want one of each list and one stats request (the down node has none)", reqs)
	}
	if len(s.Nodes) != 2 || s.Nodes[0].Name != "a" || s.Nodes[1].StatsErr != "node is down" {
		t.Fatalf("nodes: %+v", s.Nodes)
	}
	g := s.Nodes[0].GPUs[0]
	if g.Holder == nil || g.Holder.AllocID != "alloc-1" || *g.UtilPct != 50 || g.TempC != nil ||
		g.Stats["Temperature"] == nil || *g.Stats["Temperature"].StringVal != "N/A" {
		t.Errorf("GPU-a-0: %+v", g)
	}
	// 6 T4s: GPU-a-1 and GPU-b-1 unhealthy, two held.
	want := ModelTotal{Model: "Tesla T4", Count: 6, Healthy: 4, InUse: 2, Free: 2, Fake: 6}
	if tot := s.Totals(); len(tot) != 1 || tot[0] != want {
		t.Errorf("totals %+v, want %+v", tot, want)
	}

	f.Fail("Allocations", errors.New("listing allocations: Permission denied"))
	if _, err := Once(context.Background(), Config{Nomad: f}); err == nil || !strings.Contains(err.Error(), "Permission denied") {
		t.Errorf("a failed list: %v, want its error", err)
	}
}
