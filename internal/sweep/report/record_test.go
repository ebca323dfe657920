package report

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// pt is a point with one value, v.
func pt(step int, v float64) sweepkv.Point {
	return sweepkv.Point{Step: step, Values: map[string]float64{"v": v}}
}

func final(step int, v float64) sweepkv.Point {
	return sweepkv.Point{Step: step, Values: map[string]float64{"acc": v}, Final: true}
}

func steps(m sweepkv.Metrics) string {
	var s []string
	for _, p := range m.Points {
		f := ""
		if p.Final {
			f = "F"
		}
		s = append(s, fmt.Sprint(p.Step)+f)
	}
	return strings.Join(s, " ")
}

func TestAddRewindsAndResults(t *testing.T) {
	tests := []struct {
		name    string
		add     []sweepkv.Point
		steps   string
		rewinds int
	}{
		{"rising steps append", []sweepkv.Point{pt(1, 1), pt(2, 1), pt(5, 1)}, "1 2 5", 0},
		{"a resumed trial replaces from its step on", []sweepkv.Point{pt(10, 1), pt(20, 1), pt(30, 1), pt(20, 2), pt(25, 2)}, "10 20 25", 1},
		{"a step between points", []sweepkv.Point{pt(10, 1), pt(20, 1), pt(30, 1), pt(15, 2)}, "10 15", 1},
		{"the same step again replaces it", []sweepkv.Point{pt(10, 1), pt(20, 1), pt(20, 2)}, "10 20", 1},
		{"back to before the first", []sweepkv.Point{pt(10, 1), pt(20, 1), pt(0, 2)}, "0", 1},
		{"two resumptions", []sweepkv.Point{pt(10, 1), pt(20, 1), pt(10, 2), pt(20, 2), pt(5, 3)}, "5", 2},
		{"a result after the last step", []sweepkv.Point{pt(10, 1), pt(20, 1), final(30, 0.9)}, "10 20 30F", 0},
		{"a result at the last step merges", []sweepkv.Point{pt(10, 1), pt(20, 1), final(20, 0.9)}, "10 20F", 0},
		{"a result without steps merges into the last", []sweepkv.Point{pt(10, 1), final(stepOfLast, 0.9)}, "10F", 0},
		{"a result without steps first", []sweepkv.Point{final(stepOfLast, 0.9)}, "-1F", 0},
		{"a result before the last step rewinds", []sweepkv.Point{pt(10, 1), pt(20, 1), final(15, 0.9)}, "10 15F", 1},
		{"a second result at the same step is a rerun", []sweepkv.Point{pt(10, 1), final(20, 0.9), final(20, 0.8)}, "10 20F", 1},
		{"points after a restart past the result", []sweepkv.Point{pt(10, 1), final(20, 0.9), pt(15, 2), pt(20, 2)}, "10 15 20", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m sweepkv.Metrics
			for _, p := range tt.add {
				add(&m, p)
			}
			if got := steps(m); got != tt.steps || m.Rewinds != tt.rewinds {
				t.Fatalf("steps %q rewinds %d, want %q and %d", got, m.Rewinds, tt.steps, tt.rewinds)
			}
		})
	}
}

func TestResultMergesTheLastPointsValues(t *testing.T) {
	var m sweepkv.Metrics
	add(&m, sweepkv.Point{Step: 20, Values: map[string]float64{"loss": 0.2, "acc": 0.8}})
	before := m.Points[0].Values
	add(&m, sweepkv.Point{Step: stepOfLast, Values: map[string]float64{"acc": 0.9, "f1": 0.85}, Final: true})
	want := sweepkv.Point{Step: 20, Values: map[string]float64{"loss": 0.2, "acc": 0.9, "f1": 0.85}, Final: true}
	if len(m.Points) != 1 || !reflect.DeepEqual(m.Points[0], want) {
		t.Fatalf("points %+v, want [%+v]", m.Points, want)
	}
	if before["acc"] != 0.8 {
		t.Fatal("merging changed the earlier point's values in place (a copy of the record shares them)")
	}
}

func TestThinningKeepsTheRecordBounded(t *testing.T) {
	var m sweepkv.Metrics
	add(&m, final(0, 1)) // a result of an earlier run, which thinning keeps
	for step := 1; step <= 10*sweepkv.MaxPoints; step++ {
		add(&m, pt(step, float64(step)))
		if len(m.Points) > sweepkv.MaxPoints {
			t.Fatalf("%d points after step %d", len(m.Points), step)
		}
	}
	if !m.Points[0].Final {
		t.Error("thinning dropped a result")
	}
	// The recent half is whole: the last MaxPoints/2 steps are all there.
	n := len(m.Points)
	for i := 1; i < sweepkv.MaxPoints/2; i++ {
		if m.Points[n-i].Step != 10*sweepkv.MaxPoints-i+1 {
			t.Fatalf("recent point %d is step %d", n-i, m.Points[n-i].Step)
		}
	}
	for i := 1; i < n; i++ {
		if m.Points[i].Step <= m.Points[i-1].Step {
			t.Fatalf("points out of order at %d: %s", i, steps(m))
		}
	}
	if m.Rewinds != 0 {
		t.Errorf("thinning counted %d rewinds", m.Rewinds)
	}
}

func TestThin(t *testing.T) {
	var ps []sweepkv.Point
	for i := range 10 {
		ps = append(ps, pt(i, 0))
	}
	ps[3].Final = true
	if got := steps(sweepkv.Metrics{Points: thin(ps)}); got != "0 2 3F 4 5 6 7 8 9" {
		t.Fatalf("thin: %s", got)
	}
}

func TestMerge(t *testing.T) {
	base := sweepkv.Metrics{Points: []sweepkv.Point{pt(10, 1), pt(20, 1), pt(30, 1)}, Rewinds: 2}
	tests := []struct {
		name    string
		own     []sweepkv.Point
		steps   string
		rewinds int
	}{
		{"nothing new", nil, "10 20 30", 2},
		{"continued past the old points", []sweepkv.Point{pt(40, 2)}, "10 20 30 40", 2},
		{"resumed from a checkpoint at 20", []sweepkv.Point{pt(20, 2), pt(25, 2)}, "10 20 25", 3},
		{"resumed, rewound itself too", []sweepkv.Point{pt(20, 2), pt(40, 2), pt(35, 3)}, "10 20 35", 4},
		{"only a result without steps", []sweepkv.Point{final(stepOfLast, 0.9)}, "10 20 30F", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var own sweepkv.Metrics
			for _, p := range tt.own {
				add(&own, p)
			}
			got := merge(base, own)
			if steps(got) != tt.steps || got.Rewinds != tt.rewinds {
				t.Fatalf("steps %q rewinds %d, want %q and %d", steps(got), got.Rewinds, tt.steps, tt.rewinds)
			}
			if len(base.Points) != 3 {
				t.Fatal("merge changed base")
			}
		})
	}
}

func TestEncode(t *testing.T) {
	b, err := encode(sweepkv.Metrics{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"points":[]`) {
		t.Errorf("an empty record encodes as %s, want a points list", b)
	}
	var m sweepkv.Metrics
	add(&m, final(stepOfLast, 1))
	b, _ = encode(m)
	back, err := decode(b)
	if err != nil || back.Points[0].Step != 0 || m.Points[0].Step != stepOfLast {
		t.Errorf("a lone stepless result: %s (%v); the record kept step %d", b, err, m.Points[0].Step)
	}

	// Points with many long values are thinned below the byte bound.
	m = sweepkv.Metrics{}
	const n = 400 // 3.5 MB of values
	for step := range n {
		v := map[string]float64{}
		for i := range maxValues {
			v[fmt.Sprintf("%s%03d", strings.Repeat("n", maxNameLen-3), i)] = 0.123456789
		}
		add(&m, sweepkv.Point{Step: step, Values: v})
	}
	b, err = encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > maxRecordBytes {
		t.Fatalf("encoded %d bytes, above %d", len(b), maxRecordBytes)
	}
	if err := json.Unmarshal(b, &back); err != nil || back.Points[len(back.Points)-1].Step != n-1 {
		t.Fatalf("the thinned record lost its last point (%v)", err)
	}
}

func TestDecodeRefusesPointsOutOfOrder(t *testing.T) {
	if _, err := decode([]byte(`{"points":[{"step":5,"values":{"v":1}},{"step":2,"values":{"v":1}}]}`)); err == nil {
		t.Fatal("decoded points out of step order")
	}
	if _, err := decode([]byte(`{"points":`)); err == nil {
		t.Fatal("decoded a truncated record")
	}
}

func TestLineWriter(t *testing.T) {
	var got []string
	w := NewLineWriter(func(l string) { got = append(got, l) })
	for _, chunk := range []string{"a", "b\nc\n", "", "\nd", strings.Repeat("x", maxLineLen+1), "y\ne", "\n", "tail"} {
		if n, err := w.Write([]byte(chunk)); n != len(chunk) || err != nil {
			t.Fatalf("Write(%d bytes) = %d, %v", len(chunk), n, err)
		}
	}
	w.Close()
	want := []string{"ab", "c", "", "e", "tail"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("lines %q, want %q (the over-long line skipped)", got, want)
	}
}

// A record that alternates results and metric points (a rank printing both
// in a loop) still thins down to the size limit: thinning once kept every
// result, so the older half of such a record never shrank and encode spun
// forever — the supervisor's reporter busy at 100 % CPU, its record never
// written again, its Close never returning.
func TestEncodeTerminatesWhenResultsFillTheRecord(t *testing.T) {
	var m sweepkv.Metrics
	for step := 1; step <= 400; step++ {
		p := sweepkv.Point{Step: step, Values: map[string]float64{}, Final: step%2 == 1}
		for i := 0; i < maxValues; i++ {
			p.Values[fmt.Sprintf("%s%03d", strings.Repeat("v", maxNameLen-8), i)] = float64(step)
		}
		add(&m, p)
	}
	done := make(chan []byte, 1)
	go func() {
		b, err := encode(m)
		if err != nil {
			t.Error(err)
		}
		done <- b
	}()
	select {
	case b := <-done:
		if len(b) > maxRecordBytes {
			t.Errorf("encoded %d bytes, over the %d limit", len(b), maxRecordBytes)
		}
		var back sweepkv.Metrics
		if err := json.Unmarshal(b, &back); err != nil || len(back.Points) == 0 || back.Points[len(back.Points)-1].Step != 400 {
			t.Errorf("the encoded record lost its latest point: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("encode did not return within 10 s")
	}
}
