package report

import (
	"reflect"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

func TestParseLine(t *testing.T) {
	many := `gpujob-metric: {"step": 1`
	for i := range maxValues + 10 {
		many += `, "v` + string(rune('a'+i/26)) + string(rune('a'+i%26)) + `": 1`
	}
	many += "}"
	tests := []struct {
		name string
		line string
		want sweepkv.Point
		ok   bool
	}{
		{"a metric line", `gpujob-metric: {"step": 40, "accuracy": 0.91, "loss": 0.3}`,
			sweepkv.Point{Step: 40, Values: map[string]float64{"accuracy": 0.91, "loss": 0.3}}, true},
		{"behind the rank prefix", `[rank 0] gpujob-metric: {"step": 2, "loss": 1}`,
			sweepkv.Point{Step: 2, Values: map[string]float64{"loss": 1}}, true},
		{"with a carriage return", "gpujob-metric: {\"step\": 2, \"loss\": 1}\r",
			sweepkv.Point{Step: 2, Values: map[string]float64{"loss": 1}}, true},
		{"non-numeric fields dropped", `gpujob-metric: {"step": 3, "loss": 0.5, "phase": "eval", "ok": true, "x": null, "l": [1], "o": {"a": 1}}`,
			sweepkv.Point{Step: 3, Values: map[string]float64{"loss": 0.5}}, true},
		{"a step written as 40.0", `gpujob-metric: {"step": 40.0, "loss": 1}`,
			sweepkv.Point{Step: 40, Values: map[string]float64{"loss": 1}}, true},
		{"step 0", `gpujob-metric: {"step": 0, "loss": 1}`, sweepkv.Point{Step: 0, Values: map[string]float64{"loss": 1}}, true},
		{"too many values keeps the first by name", many, sweepkv.Point{Step: 1, Values: func() map[string]float64 {
			m := map[string]float64{}
			for i := range maxValues {
				m["v"+string(rune('a'+i/26))+string(rune('a'+i%26))] = 1
			}
			return m
		}()}, true},
		{"a long name is dropped", `gpujob-metric: {"step": 1, "loss": 1, "` + strings.Repeat("n", maxNameLen+1) + `": 2}`,
			sweepkv.Point{Step: 1, Values: map[string]float64{"loss": 1}}, true},

		{"a result at its steps", `gpujob-result: {"accuracy": 0.94, "f1": 0.93, "steps": 120, "device": "cpu"}`,
			sweepkv.Point{Step: 120, Values: map[string]float64{"accuracy": 0.94, "f1": 0.93}, Final: true}, true},
		{"a result without steps takes the last step", `gpujob-result: {"accuracy": 0.94}`,
			sweepkv.Point{Step: stepOfLast, Values: map[string]float64{"accuracy": 0.94}, Final: true}, true},
		{"a result with bad steps takes the last step", `gpujob-result: {"accuracy": 0.94, "steps": -3}`,
			sweepkv.Point{Step: stepOfLast, Values: map[string]float64{"accuracy": 0.94}, Final: true}, true},
		{"a result's step field is no value", `[rank 0] gpujob-result: {"accuracy": 0.9, "step": 7, "steps": 8}`,
			sweepkv.Point{Step: 8, Values: map[string]float64{"accuracy": 0.9}, Final: true}, true},

		{"no step", `gpujob-metric: {"loss": 1}`, sweepkv.Point{}, false},
		{"a fractional step", `gpujob-metric: {"step": 1.5, "loss": 1}`, sweepkv.Point{}, false},
		{"a negative step", `gpujob-metric: {"step": -1, "loss": 1}`, sweepkv.Point{}, false},
		{"a step past 2^53", `gpujob-metric: {"step": 1e300, "loss": 1}`, sweepkv.Point{}, false},
		{"a string step", `gpujob-metric: {"step": "4", "loss": 1}`, sweepkv.Point{}, false},
		{"no value", `gpujob-metric: {"step": 4, "phase": "eval"}`, sweepkv.Point{}, false},
		{"a result without a value", `gpujob-result: {"steps": 4, "device": "cpu"}`, sweepkv.Point{}, false},
		{"not json", `gpujob-metric: {"step": 4, loss: 1}`, sweepkv.Point{}, false},
		{"NaN is not JSON", `gpujob-metric: {"step": 4, "loss": NaN}`, sweepkv.Point{}, false},
		{"not an object", `gpujob-metric: [1, 2]`, sweepkv.Point{}, false},
		{"null", `gpujob-metric: null`, sweepkv.Point{}, false},
		{"trailing garbage", `gpujob-metric: {"step": 4, "loss": 1} x`, sweepkv.Point{}, false},
		{"another rank's prefix", `[rank 1] gpujob-metric: {"step": 4, "loss": 1}`, sweepkv.Point{}, false},
		{"the prefix mid-line", `epoch 1 gpujob-metric: {"step": 4, "loss": 1}`, sweepkv.Point{}, false},
		{"no space after the colon", `gpujob-metric:{"step": 4, "loss": 1}`, sweepkv.Point{}, false},
		{"an ordinary line", `step 40 loss 0.3`, sweepkv.Point{}, false},
		{"empty", ``, sweepkv.Point{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseLine(tt.line)
			if ok != tt.ok || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("parseLine(%q) = %+v, %v; want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
			}
		})
	}
}
