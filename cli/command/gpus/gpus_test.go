package gpus

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/gpujobs/fixture"
	"github.com/gpujob/gpujob/cli/nomadapi"
)

func execute(t *testing.T, f *nomadapi.Fake, args ...string) (string, string, error) {
	t.Helper()
	return fixture.Execute(NewCmd, f, args...)
}

const (
	g1 = "GPU-11111111-aaaa-bbbb-cccc-dddddddddddd"
	g2 = "GPU-22222222-aaaa-bbbb-cccc-dddddddddddd"
	g3 = "GPU-33333333-aaaa-bbbb-cccc-dddddddddddd"
	g4 = "GPU-44444444-aaaa-bbbb-cccc-dddddddddddd"
)

// cluster: node-1 with two fake T4s (one held by bert.train[0], the other
// free; a completed allocation's old claim is ignored); node-2 with two
// A100s, one unhealthy, one whose device gives no power/temperature (N/A);
// node-3 down.
func cluster() *nomadapi.Fake {
	f := nomadapi.NewFake()
	n1 := fixture.Node("n1", "node-1", "Tesla T4", 15360, true,
		fixture.GPU{ID: g1, Healthy: true}, fixture.GPU{ID: g2, Healthy: true})
	n2 := fixture.Node("n2", "node-2", "NVIDIA A100-SXM4-40GB", 40960, false,
		fixture.GPU{ID: g3, Healthy: false, HealthMsg: "critical Xid 79 (GPU has fallen off the bus)"},
		fixture.GPU{ID: g4, Healthy: true})
	n3 := fixture.Node("n3", "node-3", "Tesla T4", 15360, true, fixture.GPU{ID: "GPU-99999999-x", Healthy: true})
	n3.Status = "down"
	f.SetNode(n1)
	f.SetNode(n2)
	f.SetNode(n3)
	job := fixture.TrainJob("bert", 2, 1)
	f.SetJob(job)
	f.SetAlloc(fixture.Alloc(job, "aaaaaaaa-1", 0, n1, "running", []string{g1}))
	f.SetAlloc(fixture.Alloc(job, "dead0000-1", 1, n1, "complete", []string{g2}))
	f.SetNodeStats("n1", fixture.Stats("Tesla T4", map[string]fixture.Sample{
		g1: {UtilPct: fixture.Int(87), MemUsedMiB: fixture.Int(1024), MemTotal: fixture.Int(15360), TempC: fixture.Int(54),
			PowerW: fixture.Float(70), PowerLimitW: fixture.Float(70)},
		g2: {UtilPct: fixture.Int(0), MemUsedMiB: fixture.Int(0), MemTotal: fixture.Int(15360), TempC: fixture.Int(30),
			PowerW: fixture.Float(9.5), PowerLimitW: fixture.Float(70)},
	}))
	f.SetNodeStats("n2", fixture.Stats("NVIDIA A100-SXM4-40GB", map[string]fixture.Sample{
		g4: {UtilPct: fixture.Int(5), MemUsedMiB: fixture.Int(10), MemTotal: fixture.Int(40960)},
	}))
	return f
}

func TestGPUsTable(t *testing.T) {
	out, errOut, err := execute(t, cluster())
	if err != nil {
		t.Fatal(err)
	}
	norm := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{
		"node-1 Tesla T4 (fake) GPU-11111111 15360 MiB healthy 87% 1024/15360 MiB 54 C 70/70 W bert.train[0] (aaaaaaaa)",
		"node-1 Tesla T4 (fake) GPU-22222222 15360 MiB healthy 0% 0/15360 MiB 30 C 9.5/70 W free",
		"node-2 NVIDIA A100-SXM4-40GB GPU-33333333 40960 MiB unhealthy [1] - - - - free",
		"node-2 NVIDIA A100-SXM4-40GB GPU-44444444 40960 MiB healthy 5% 10/40960 MiB N/A N/A free",
		"node-3 (down) Tesla T4 (fake) GPU-99999999 15360 MiB healthy - - - - free",
		"[1] node-2 " + g3 + ": critical Xid 79 (GPU has fallen off the bus)",
		"MODEL GPUS HEALTHY IN USE FREE NVIDIA A100-SXM4-40GB 2 1 0 1 Tesla T4 (fake) 3 3 1 2",
	} {
		if !strings.Contains(norm, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "warning: node node-3 is down: no GPU stats") {
		t.Errorf("stderr: %q", errOut)
	}
}

func TestGPUsJSON(t *testing.T) {
	out, _, err := execute(t, cluster(), "--json")
	if err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	byID := map[string]GPU{}
	for _, g := range r.GPUs {
		byID[g.ID] = g
	}
	if len(r.GPUs) != 5 {
		t.Fatalf("gpus: %+v", r.GPUs)
	}
	a := byID[g1]
	if a.Node != "node-1" || !a.Fake || !a.Healthy || *a.MemoryMiB != 15360 || *a.UtilizationPct != 87 || *a.MemoryUsedMiB != 1024 ||
		*a.MemoryTotalMiB != 15360 || *a.TemperatureC != 54 || *a.PowerW != 70 || *a.PowerLimitW != 70 {
		t.Errorf("g1: %+v", a)
	}
	if a.Holder == nil || a.Holder.AllocID != "aaaaaaaa-1" || a.Holder.JobID != "bert" || a.Holder.AllocName != "bert.train[0]" || a.Holder.Task != "train" {
		t.Errorf("g1 holder: %+v", a.Holder)
	}
	if byID[g2].Holder != nil {
		t.Errorf("a completed allocation holds g2: %+v", byID[g2].Holder)
	}
	u := byID[g3]
	if u.Healthy || u.HealthDescription != "critical Xid 79 (GPU has fallen off the bus)" || u.Fake || u.UtilizationPct != nil {
		t.Errorf("g3: %+v", u)
	}
	na := byID[g4]
	if na.TemperatureC != nil || na.PowerW != nil || *na.UtilizationPct != 5 {
		t.Errorf("g4 (N/A values): %+v", na)
	}
	if len(r.Totals) != 2 || r.Totals[1] != (Total{Model: "Tesla T4", Count: 3, Healthy: 3, InUse: 1, Fake: 3}) ||
		r.Totals[0] != (Total{Model: "NVIDIA A100-SXM4-40GB", Count: 2, Healthy: 1, InUse: 0}) {
		t.Errorf("totals: %+v", r.Totals)
	}
	if len(r.Warnings) != 1 {
		t.Errorf("warnings: %v", r.Warnings)
	}
	var raw map[string][]map[string]any
	_ = json.Unmarshal([]byte(out), &raw)
	if v, ok := raw["gpus"][3]["temperature_c"]; !ok || v != nil {
		t.Errorf("an N/A value must be null in JSON: %v", raw["gpus"][3])
	}
}

func TestGPUsStatsErrorIsAWarning(t *testing.T) {
	f := cluster()
	f.Fail("NodeStats", errors.New("reading the stats of node n1: Unexpected response code: 500 (no path to node)"))
	out, errOut, err := execute(t, f)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut, "no path to node") || !strings.Contains(out, "bert.train[0]") {
		t.Errorf("out:\n%s\nerr:\n%s", out, errOut)
	}
}

func TestGPUsErrorsAndEmpty(t *testing.T) {
	f := nomadapi.NewFake()
	out, _, err := execute(t, f)
	if err != nil || !strings.Contains(out, "No GPUs") {
		t.Errorf("%v %q", err, out)
	}
	f.Fail("Nodes", errors.New("listing nodes: cannot reach Nomad at http://127.0.0.1:4646 (is the agent running? set NOMAD_ADDR or --address)"))
	if _, _, err := execute(t, f); err == nil || !strings.Contains(err.Error(), "cannot reach Nomad") {
		t.Errorf("agent error: %v", err)
	}
}

// gpus counts holders by the rule every view shares (observe.HoldsDevices,
// Nomad's): a pending allocation and one told to stop but still running
// hold their GPUs; a lost one does not. Its totals are the inventory's.
func TestGPUsHoldersAreTheInventorys(t *testing.T) {
	f := nomadapi.NewFake()
	n1 := fixture.Node("n1", "node-1", "Tesla T4", 15360, true,
		fixture.GPU{ID: g1, Healthy: true}, fixture.GPU{ID: g2, Healthy: true}, fixture.GPU{ID: g3, Healthy: true})
	f.SetNode(n1)
	job := fixture.TrainJob("bert", 3, 1)
	f.SetJob(job)
	f.SetAlloc(fixture.Alloc(job, "aaaaaaaa-1", 0, n1, "pending", []string{g1}))
	stopping := fixture.Alloc(job, "bbbbbbbb-1", 1, n1, "running", []string{g2})
	stopping.DesiredStatus = "stop"
	f.SetAlloc(stopping)
	f.SetAlloc(fixture.Alloc(job, "cccccccc-1", 2, n1, "lost", []string{g3}))
	out, _, err := execute(t, f, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	held := map[string]string{}
	for _, g := range r.GPUs {
		if g.Holder != nil {
			held[g.ID] = g.Holder.AllocID
		}
	}
	if len(held) != 2 || held[g1] != "aaaaaaaa-1" || held[g2] != "bbbbbbbb-1" {
		t.Errorf("holders %v; want g1 by the pending allocation and g2 by the stopping one", held)
	}
	if len(r.Totals) != 1 || r.Totals[0] != (Total{Model: "Tesla T4", Count: 3, Healthy: 3, InUse: 2, Fake: 3}) {
		t.Errorf("totals: %+v", r.Totals)
	}
	text, _, err := execute(t, f)
	if err != nil {
		t.Fatal(err)
	}
	if norm := strings.Join(strings.Fields(text), " "); !strings.Contains(norm, "Tesla T4 (fake) 3 3 2 1") {
		t.Errorf("the totals row lacks 1 free GPU:\n%s", text)
	}
}
