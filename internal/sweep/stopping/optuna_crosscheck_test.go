package stopping

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/gpujob/gpujob/internal/testpriv"
)

// optunaReplay replays recorded traces into real Optuna studies with
// MedianPruner, in the same order, and prints every should_prune() answer.
const optunaReplay = `
import json, math, sys, warnings
import optuna
from optuna.trial import TrialState

warnings.simplefilter("ignore")
optuna.logging.set_verbosity(optuna.logging.ERROR)
with open(sys.argv[1]) as f:
    cases = json.load(f)
out = []
for case in cases:
    study = optuna.create_study(direction=case["direction"], pruner=optuna.pruners.MedianPruner(**case["pruner"]))
    trials, answers = {}, []
    for ev in case["events"]:
        kind, i = ev[0], ev[1]
        if kind == "ask":
            trials[i] = study.ask()
        elif kind == "report":
            trials[i].report(math.nan if ev[3] is None else ev[3], ev[2])
            answers.append(bool(trials[i].should_prune()))  # numpy.bool_ otherwise
        elif ev[2] == "COMPLETE":
            study.tell(trials[i], 0.0)  # the objective value plays no part in pruning
        else:
            study.tell(trials[i], state=getattr(TrialState, ev[2]))
    out.append(answers)
json.dump(out, sys.stdout)
`

type optunaCase struct {
	Direction string         `json:"direction"`
	Pruner    map[string]int `json:"pruner"`
	Events    [][]any        `json:"events"`
	name      string
	want      []bool // Go's decision at each report
}

// jsonValue encodes NaN as null, which JSON can carry.
func jsonValue(v float64) any {
	if math.IsNaN(v) {
		return nil
	}
	return v
}

// simulate runs a sweep of learning curves with parallel trials reporting in
// turn, decides with m after every report exactly as the controller would,
// and records the events for Optuna. Some trials report only even steps,
// some end early (other trials then lack their later steps), some fail, and
// a few values are NaN, so every rule gets exercised.
func simulate(name string, m Median, mode Mode, seed uint64) *optunaCase {
	rng := rand.New(rand.NewPCG(seed, 1))
	c := &optunaCase{
		name:      name,
		Direction: map[Mode]string{Max: "maximize", Min: "minimize"}[mode],
		Pruner: map[string]int{
			"n_startup_trials": m.MinTrials, "n_warmup_steps": m.GracePeriod,
			"interval_steps": m.interval(), "n_min_trials": m.minReported(),
		},
	}
	r := newRec(mode)
	type run struct {
		id         int
		ceiling    float64
		rate       float64
		step, last int
		stride     int
		failAt     int
	}
	const trials, parallel = 20, 4
	var running []*run
	next := 0
	for len(running) > 0 || next < trials {
		for len(running) < parallel && next < trials {
			tr := &run{id: next, ceiling: 0.5 + 0.5*rng.Float64(), rate: 2 + 10*rng.Float64(), last: 20 + rng.IntN(10), stride: 1, failAt: -1}
			if next%5 == 2 {
				tr.stride = 2
			}
			if next%7 == 3 {
				tr.failAt = 8 + rng.IntN(10)
			}
			c.Events = append(c.Events, []any{"ask", tr.id})
			running = append(running, tr)
			next++
		}
		var still []*run
		for _, tr := range running {
			id := strconv.Itoa(tr.id)
			v := tr.ceiling*(1-math.Exp(-float64(tr.step+1)/tr.rate)) + 0.03*rng.NormFloat64()
			if mode == Min {
				v = 1 - v
			}
			if rng.IntN(60) == 0 {
				v = math.NaN()
			}
			r.report(id, tr.step, v)
			d := m.Decide(id, r.h)
			c.Events = append(c.Events, []any{"report", tr.id, tr.step, jsonValue(v)})
			c.want = append(c.want, d.Stop)
			end := ""
			switch {
			case d.Stop:
				r.end(id, Stopped)
				end = "PRUNED"
			case tr.step == tr.failAt:
				r.end(id, Failed)
				end = "FAIL"
			case tr.step+tr.stride > tr.last:
				r.end(id, Completed)
				end = "COMPLETE"
			}
			if end != "" {
				c.Events = append(c.Events, []any{"tell", tr.id, end})
				continue
			}
			tr.step += tr.stride
			still = append(still, tr)
		}
		running = still
	}
	return c
}

// TestMedianMatchesOptuna compares every decision with Optuna 3.1's
// MedianPruner on the same recorded traces. It needs /usr/bin/python3 with
// optuna (Debian: python3-optuna).
func TestMedianMatchesOptuna(t *testing.T) {
	const python = "/usr/bin/python3"
	testpriv.NeedPython(t, python, "no Optuna to compare with: apt-get install python3-optuna", "optuna")
	params := []Median{
		{MinTrials: 5}, // Optuna's defaults
		{MinTrials: 3, GracePeriod: 5, Interval: 3},
		{MinTrials: 1, GracePeriod: 2, Interval: 4, MinReported: 3},
		{GracePeriod: 10, Interval: 2, MinReported: 2},
	}
	var cases []*optunaCase
	for i, m := range params {
		for _, mode := range []Mode{Max, Min} {
			for seed := uint64(1); seed <= 3; seed++ {
				cases = append(cases, simulate(fmt.Sprintf("%+v/%s/seed%d", m, mode, seed), m, mode, seed*100+uint64(i)))
			}
		}
	}
	in := filepath.Join(t.TempDir(), "traces.json")
	data, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(in, data, 0o600); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "replay.py")
	if err := os.WriteFile(script, []byte(optunaReplay), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, script, in)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("optuna replay: %v", err)
	}
	var got [][]bool
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("optuna replay output: %v: %.200s", err, out)
	}
	if len(got) != len(cases) {
		t.Fatalf("optuna answered %d cases, want %d", len(got), len(cases))
	}
	var decisions, stops int
	for i, c := range cases {
		if len(got[i]) != len(c.want) {
			t.Errorf("%s: optuna made %d decisions, Go %d", c.name, len(got[i]), len(c.want))
			continue
		}
		for j := range c.want {
			decisions++
			if c.want[j] {
				stops++
			}
			if got[i][j] != c.want[j] {
				t.Errorf("%s: decision %d: Go stop=%v, Optuna prune=%v", c.name, j, c.want[j], got[i][j])
				break // later events follow Go's decisions, so they no longer compare
			}
		}
	}
	t.Logf("%d cases, %d decisions (%d stops) identical to Optuna's", len(cases), decisions, stops)
	if stops == 0 || stops == decisions {
		t.Errorf("the traces never (or always) stop a trial; the comparison proves little")
	}
}
