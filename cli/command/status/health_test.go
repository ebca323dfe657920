package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs/fixture"
	"github.com/gpujob/gpujob/cli/nomadapi"
)

const (
	gpuC = "GPU-cccccccc-1111-2222-3333-444455556666"
	gpuD = "GPU-dddddddd-1111-2222-3333-444455556666"
)

// countingNomad counts NodeStats calls per node.
type countingNomad struct {
	*nomadapi.Fake
	mu    sync.Mutex
	stats map[string]int
}

func (c *countingNomad) NodeStats(nodeID string) (*api.HostStats, error) {
	c.mu.Lock()
	c.stats[nodeID]++
	c.mu.Unlock()
	return c.Fake.NodeStats(nodeID)
}

// rankLine is a progress line of one rank.
func rankLine(rank, step int, loss float64) string {
	return fmt.Sprintf("gpujob: step=%d epoch=0 rank=%d loss=%.4f\n", step, rank, loss)
}

// threeRanks: job bert, 3 workers × 1 GPU, all running (unless state says
// otherwise): train[0] and train[1] on node-1 (gpuA, gpuB), train[2] on
// node-2 (gpuC). logs are each member's stdout, by rank.
func threeRanks(state string, logs [3]string) *nomadapi.Fake {
	f := nomadapi.NewFake()
	job := fixture.TrainJob("bert", 3, 1)
	f.SetJob(job)
	n1 := fixture.Node("n1-id", "node-1", "Tesla T4", 15360, true)
	n2 := fixture.Node("n2-id", "node-2", "Tesla T4", 15360, true)
	for i, m := range []struct {
		id   string
		node *api.Node
		gpu  string
	}{{"a0000000", n1, gpuA}, {"a1111111", n1, gpuB}, {"a2222222", n2, gpuC}} {
		f.SetAlloc(fixture.Alloc(job, m.id, i, m.node, state, []string{m.gpu},
			fixture.Joined(1, i, 3, i, i, 3, "127.0.0.1:40469")))
		if logs[i] != "" {
			f.SetLog(m.id, "train", "stdout", logs[i])
		}
	}
	return f
}

func utilStats(utils map[string]*int64) *api.HostStats {
	samples := map[string]fixture.Sample{}
	for id, u := range utils {
		samples[id] = fixture.Sample{UtilPct: u, MemUsedMiB: fixture.Int(100), MemTotal: fixture.Int(15360)}
	}
	return fixture.Stats("Tesla T4", samples)
}

func TestStatusUtilization(t *testing.T) {
	i := fixture.Int
	cases := []struct {
		name      string
		state     string
		setup     func(f *nomadapi.Fake)
		wantMean  *float64 // nil: null
		wantLow   bool
		wantCalls map[string]int // NodeStats calls per node
		wantText  []string
		wantNot   []string
		wantNote  string // substring of gpu_utilization_note
		wantPer   map[string]*float64
	}{
		{
			name:  "low utilisation warns with the per-GPU figures",
			state: "running",
			setup: func(f *nomadapi.Fake) {
				f.SetNodeStats("n1-id", utilStats(map[string]*int64{gpuA: i(12), gpuB: i(10), gpuD: i(99)}))
				f.SetNodeStats("n2-id", utilStats(map[string]*int64{gpuC: i(14)}))
			},
			wantMean:  fixture.Float(12),
			wantLow:   true,
			wantCalls: map[string]int{"n1-id": 1, "n2-id": 1},
			wantText: []string{
				"warning: this job's 3 GPUs average 12% utilisation, under the 80% target: the input pipeline " +
					"(DataLoader workers, I/O) or a too-small batch may be starving them; see gpujob gpus",
				"  node-1 GPU-aaaaaaaa (bert.train[0]): 12%",
				"  node-1 GPU-bbbbbbbb (bert.train[1]): 10%",
				"  node-2 GPU-cccccccc (bert.train[2]): 14%",
			},
			wantNot: []string{"GPU-dddddddd", "note:"},
			wantPer: map[string]*float64{gpuA: fixture.Float(12), gpuB: fixture.Float(10), gpuC: fixture.Float(14)},
		},
		{
			name:  "high utilisation is silent",
			state: "running",
			setup: func(f *nomadapi.Fake) {
				f.SetNodeStats("n1-id", utilStats(map[string]*int64{gpuA: i(95), gpuB: i(80)}))
				f.SetNodeStats("n2-id", utilStats(map[string]*int64{gpuC: i(93)}))
			},
			wantMean:  fixture.Float(268.0 / 3),
			wantCalls: map[string]int{"n1-id": 1, "n2-id": 1},
			wantNot:   []string{"warning:", "utilisation", "note:"},
			wantPer:   map[string]*float64{gpuA: fixture.Float(95), gpuB: fixture.Float(80), gpuC: fixture.Float(93)},
		},
		{
			name:      "stats that cannot be read: a note, no warning",
			state:     "running",
			setup:     func(f *nomadapi.Fake) { f.Fail("NodeStats", errors.New("node unreachable")) },
			wantCalls: map[string]int{"n1-id": 1, "n2-id": 1},
			wantText: []string{"note: GPU utilisation unknown: node node-1: node unreachable; " +
				"node node-2: node unreachable"},
			wantNot:  []string{"warning:"},
			wantNote: "node node-1: node unreachable",
			wantPer:  map[string]*float64{gpuA: nil, gpuB: nil, gpuC: nil},
		},
		{
			name:  "N/A utilisation counts as unknown",
			state: "running",
			setup: func(f *nomadapi.Fake) {
				f.SetNodeStats("n1-id", utilStats(map[string]*int64{gpuA: nil, gpuB: nil}))
				f.SetNodeStats("n2-id", utilStats(map[string]*int64{}))
			},
			wantCalls: map[string]int{"n1-id": 1, "n2-id": 1},
			wantText:  []string{"note: GPU utilisation unknown: node node-1 reports no utilisation for the job's GPUs"},
			wantNote:  "reports no utilisation",
			wantPer:   map[string]*float64{gpuA: nil, gpuB: nil, gpuC: nil},
		},
		{
			name:  "one node unreadable: the mean of the others, the rest unknown",
			state: "running",
			setup: func(f *nomadapi.Fake) {
				f.SetNodeStats("n1-id", utilStats(map[string]*int64{gpuA: i(20), gpuB: i(30)}))
			},
			wantMean:  fixture.Float(25),
			wantLow:   true,
			wantCalls: map[string]int{"n1-id": 1, "n2-id": 1},
			wantText:  []string{"this job's 3 GPUs (2 of them read) average 25% utilisation", "  node-2 GPU-cccccccc (bert.train[2]): unknown"},
			wantPer:   map[string]*float64{gpuA: fixture.Float(20), gpuB: fixture.Float(30), gpuC: nil},
		},
		{
			name:  "a job that is not running is not measured",
			state: "complete",
			setup: func(f *nomadapi.Fake) {
				f.SetNodeStats("n1-id", utilStats(map[string]*int64{gpuA: i(1), gpuB: i(1)}))
			},
			wantCalls: map[string]int{},
			wantNot:   []string{"warning:", "note:", "utilisation"},
			wantPer:   map[string]*float64{},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := threeRanks(tc.state, [3]string{})
			tc.setup(f)
			c := &countingNomad{Fake: f, stats: map[string]int{}}
			st, err := Collect(context.Background(), c, "bert")
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(c.stats) != fmt.Sprint(tc.wantCalls) {
				t.Errorf("NodeStats calls %v, want %v (one per node)", c.stats, tc.wantCalls)
			}
			switch {
			case tc.wantMean == nil && st.GPUUtilizationPct != nil:
				t.Errorf("mean %v, want null", *st.GPUUtilizationPct)
			case tc.wantMean != nil && (st.GPUUtilizationPct == nil || fmt.Sprintf("%.4f", *st.GPUUtilizationPct) != fmt.Sprintf("%.4f", *tc.wantMean)):
				t.Errorf("mean %v, want %v", st.GPUUtilizationPct, *tc.wantMean)
			}
			if st.LowGPUUtilization != tc.wantLow {
				t.Errorf("low = %v, want %v", st.LowGPUUtilization, tc.wantLow)
			}
			if !strings.Contains(st.GPUUtilizationNote, tc.wantNote) || (tc.wantNote == "" && st.GPUUtilizationNote != "") {
				t.Errorf("note %q, want one containing %q", st.GPUUtilizationNote, tc.wantNote)
			}
			if len(st.GPUUtilization) != len(tc.wantPer) {
				t.Errorf("per-GPU %+v, want %d GPUs", st.GPUUtilization, len(tc.wantPer))
			}
			for _, g := range st.GPUUtilization {
				want, ok := tc.wantPer[g.ID]
				got := "null"
				if g.UtilizationPct != nil {
					got = fmt.Sprint(*g.UtilizationPct)
				}
				if w := "null"; !ok || (want == nil) != (g.UtilizationPct == nil) || (want != nil && fmt.Sprint(*want) != got) {
					if want != nil {
						w = fmt.Sprint(*want)
					}
					t.Errorf("GPU %s: %s, want %s", g.ID, got, w)
				}
			}

			out, _, err := execute(t, f, "bert")
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.wantText {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(out, w) {
					t.Errorf("output has %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestStatusLossSpread(t *testing.T) {
	cases := []struct {
		name       string
		logs       [3]string
		wantSpread *float64
		wantDiffer bool
		wantHigh   bool
		wantText   []string
		wantNot    []string
	}{
		{
			name:       "below the bar",
			logs:       [3]string{rankLine(0, 20, 0.700) + rankLine(0, 30, 0.690), rankLine(1, 30, 0.702), rankLine(2, 30, 0.678)},
			wantSpread: fixture.Float(0.024),
			wantText:   []string{"loss spread across ranks: 0.024 (max − min of the latest loss per rank; the seeds' bar is 0.05)"},
			wantNot:    []string{"disagree", "different steps"},
		},
		{
			name:       "above the bar at one step warns",
			logs:       [3]string{rankLine(0, 30, 0.70), rankLine(1, 30, 0.71), rankLine(2, 30, 0.90)},
			wantSpread: fixture.Float(0.2),
			wantHigh:   true,
			wantText: []string{"loss spread across ranks: 0.200",
				"warning: the ranks' losses disagree by more than 0.05 at one step: check the data sharding"},
			wantNot: []string{"different steps"},
		},
		{
			name:       "different steps: said, not called disagreement",
			logs:       [3]string{rankLine(0, 30, 0.70), rankLine(1, 20, 0.90), rankLine(2, 30, 0.71)},
			wantSpread: fixture.Float(0.2),
			wantDiffer: true,
			wantText: []string{"loss spread across ranks: 0.200",
				"the ranks' latest losses are from different steps (20 to 30): the spread compares them as read"},
			wantNot: []string{"disagree by"},
		},
		{
			name:    "one rank's loss: no spread",
			logs:    [3]string{rankLine(0, 30, 0.70), "", ""},
			wantNot: []string{"loss spread"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := threeRanks("running", tc.logs)
			f.SetNodeStats("n1-id", utilStats(map[string]*int64{gpuA: fixture.Int(90), gpuB: fixture.Int(90)}))
			f.SetNodeStats("n2-id", utilStats(map[string]*int64{gpuC: fixture.Int(90)}))
			out, _, err := execute(t, f, "bert", "--json")
			if err != nil {
				t.Fatal(err)
			}
			var raw map[string]any
			if err := json.Unmarshal([]byte(out), &raw); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"gpu_utilization_pct", "gpu_utilization", "low_gpu_utilization", "loss_spread",
				"loss_steps_differ", "loss_spread_high"} {
				if _, ok := raw[k]; !ok {
					t.Errorf("JSON lacks %q", k)
				}
			}
			var st Status
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.wantSpread == nil && st.LossSpread != nil:
				t.Errorf("spread %v, want null", *st.LossSpread)
			case tc.wantSpread != nil && (st.LossSpread == nil || fmt.Sprintf("%.6f", *st.LossSpread) != fmt.Sprintf("%.6f", *tc.wantSpread)):
				t.Errorf("spread %v, want %v", st.LossSpread, *tc.wantSpread)
			}
			if st.LossStepsDiffer != tc.wantDiffer || st.LossSpreadHigh != tc.wantHigh {
				t.Errorf("differ=%v high=%v, want %v %v", st.LossStepsDiffer, st.LossSpreadHigh, tc.wantDiffer, tc.wantHigh)
			}
			if st.LowGPUUtilization || st.GPUUtilizationPct == nil || *st.GPUUtilizationPct != 90 {
				t.Errorf("utilisation %v low=%v, want 90 and not low", st.GPUUtilizationPct, st.LowGPUUtilization)
			}

			out, _, err = execute(t, f, "bert")
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.wantText {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(out, w) {
					t.Errorf("output has %q:\n%s", w, out)
				}
			}
		})
	}
}
