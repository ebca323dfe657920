package report

import (
	"encoding/json"
	"math"
	"slices"
	"strings"

	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// rankZeroPrefix is what the supervisor's log prefixing puts before rank
// 0's lines. The supervisor tees rank 0's output before prefixing it, so a
// reporter normally never sees it; lines that come through a prefixed
// stream (a replayed log) parse the same all the same.
const rankZeroPrefix = "[rank 0] "

// stepOfLast is the Step of a result point whose line names no "steps": it
// takes the step of the last point reported before it (record.add).
const stepOfLast = -1

// Bounds on what one line may put into the record, which must stay far
// below Consul's 512 KiB value limit at MaxPoints points: a workload that
// prints a hundred fields a line keeps its first maxValues by name.
const (
	maxStep    = 1 << 53 // the integers a JSON number (float64) holds exactly
	maxValues  = 64
	maxNameLen = 128
)

// parseLine reads one line of rank 0's output. ok is false for every line
// that is not a metric or result line, and for one that is but cannot be
// used: a body that is not a JSON object, a metric line without a valid
// step, a line without one numeric value. Such lines are the workload's
// business and cost nothing: the reporter ignores them.
//
// A metric line's step is its "step" field, an integer from 0 up; its
// values are its other numeric fields. A result line is a Final point at
// its "steps" field (the workload's step count), else at the step of the
// last point (stepOfLast); "steps" and "step" are not values of it.
func parseLine(line string) (p sweepkv.Point, ok bool) {
	line = strings.TrimRight(line, "\r\n")
	line = strings.TrimPrefix(line, rankZeroPrefix)
	var body string
	switch {
	case strings.HasPrefix(line, sweepkv.MetricLinePrefix):
		body = line[len(sweepkv.MetricLinePrefix):]
	case strings.HasPrefix(line, sweepkv.ResultLinePrefix):
		body, p.Final = line[len(sweepkv.ResultLinePrefix):], true
	default:
		return sweepkv.Point{}, false
	}
	var fields map[string]any
	if json.Unmarshal([]byte(body), &fields) != nil || fields == nil {
		return sweepkv.Point{}, false
	}
	stepField := "step"
	if p.Final {
		stepField = "steps"
	}
	step, valid := validStep(fields[stepField])
	switch {
	case valid:
		p.Step = step
	case p.Final:
		p.Step = stepOfLast
	default:
		return sweepkv.Point{}, false
	}
	names := make([]string, 0, len(fields))
	for name, v := range fields {
		if _, num := v.(float64); num && name != "step" && name != "steps" && name != "" && len(name) <= maxNameLen {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return sweepkv.Point{}, false
	}
	slices.Sort(names)
	names = names[:min(len(names), maxValues)]
	p.Values = make(map[string]float64, len(names))
	for _, name := range names {
		p.Values[name] = fields[name].(float64)
	}
	return p, true
}

// validStep reads a JSON step: a whole number from 0 to maxStep.
func validStep(v any) (int, bool) {
	f, ok := v.(float64)
	if !ok || f < 0 || f > maxStep || f != math.Trunc(f) {
		return 0, false
	}
	return int(f), true
}
