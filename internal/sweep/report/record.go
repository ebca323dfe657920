package report

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// maxRecordBytes bounds the encoded record, below Consul's 512 KiB value
// limit with room to spare: MaxPoints keeps an ordinary record far below
// it, this catches points that each carry many long-named values.
const maxRecordBytes = 400 << 10

// add puts p at the end of m by the contract's rules (sweepkv.Metrics):
//
//   - a point whose step is greater than the last one's is appended;
//   - a point whose step is not (a trial resumed from a checkpoint reports
//     its steps again) replaces every point from its step on, and counts a
//     rewind;
//   - except a result (Final) at the very step of the last point, which is
//     that step's outcome, not a rerun: it merges into the last point (its
//     values win) without a rewind. A result that names no steps is at the
//     last point's step, so it always merges.
//
// Past MaxPoints the older half is thinned.
func add(m *sweepkv.Metrics, p sweepkv.Point) {
	n := len(m.Points)
	if p.Step == stepOfLast && n > 0 {
		p.Step = m.Points[n-1].Step
	}
	if n > 0 {
		last := &m.Points[n-1]
		switch {
		case p.Step > last.Step:
		case p.Final && !last.Final && p.Step == last.Step:
			values := maps.Clone(last.Values)
			if values == nil {
				values = map[string]float64{}
			}
			maps.Copy(values, p.Values)
			*last = sweepkv.Point{Step: p.Step, Values: values, Final: true}
			return
		default:
			i, _ := slices.BinarySearchFunc(m.Points, p.Step, func(q sweepkv.Point, step int) int {
				return cmp.Compare(q.Step, step)
			})
			m.Points = m.Points[:i]
			m.Rewinds++
		}
	}
	m.Points = append(m.Points, p)
	if len(m.Points) > sweepkv.MaxPoints {
		m.Points = thin(m.Points)
	}
}

// thin drops every second point of the older half (but the older half's
// latest result), so that the curve keeps its shape and its recent detail:
// repeated, it leaves the old part ever sparser. It keeps one result, not
// every one: a rank that prints a result line for every metric line would
// otherwise make a record whose older half never shrinks.
func thin(points []sweepkv.Point) []sweepkv.Point {
	half := len(points) / 2
	lastResult := -1
	for i := half - 1; i >= 0; i-- {
		if points[i].Final {
			lastResult = i
			break
		}
	}
	out := make([]sweepkv.Point, 0, len(points)-half/2)
	for i, p := range points[:half] {
		if i%2 == 0 || i == lastResult {
			out = append(out, p)
		}
	}
	return append(out, points[half:]...)
}

// merge is the record a supervisor writes when it takes over a trial's
// record: base (what an earlier supervisor of the trial left) followed by
// own (what this one has seen so far), as if every point of own had been
// added to base. own's points rise in step, so at most its first rewinds
// base; own's own rewinds are carried over.
func merge(base, own sweepkv.Metrics) sweepkv.Metrics {
	out := sweepkv.Metrics{Points: slices.Clone(base.Points), Rewinds: base.Rewinds, Updated: base.Updated,
		Reporting: base.Reporting.Plus(own.Reporting)}
	for _, p := range own.Points {
		add(&out, p)
	}
	out.Rewinds += own.Rewinds
	return out
}

// clone copies m deep enough that adding to the copy leaves m alone (the
// points' values are never changed in place).
func clone(m sweepkv.Metrics) sweepkv.Metrics {
	m.Points = slices.Clone(m.Points)
	return m
}

// encode is the record's JSON as it goes to Consul: points as a list,
// never null; a result that found no point to take its step from at step
// 0; and thinned until it fits maxRecordBytes.
func encode(m sweepkv.Metrics) ([]byte, error) {
	m.Points = slices.Clone(m.Points)
	if m.Points == nil {
		m.Points = []sweepkv.Point{}
	}
	for i := range m.Points {
		m.Points[i].Step = max(m.Points[i].Step, 0)
	}
	// Thinned first by an estimate of its size (above the JSON's but for
	// names full of characters JSON escapes, which the loop below still
	// catches): a record of MaxPoints huge points is 20 MB, and marshalling
	// that again and again while thinning would keep the supervisor busy
	// for seconds per write.
	for estimate(m.Points) > maxRecordBytes && len(m.Points) >= 2 {
		n := len(m.Points)
		if m.Points = thin(m.Points); len(m.Points) == n {
			break
		}
	}
	for {
		b, err := json.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("encoding the metrics record: %w", err)
		}
		if len(b) <= maxRecordBytes || len(m.Points) < 2 {
			return b, nil
		}
		n := len(m.Points)
		if m.Points = thin(m.Points); len(m.Points) == n {
			// Cannot happen with points of bounded size (parseLine), but
			// a loop that cannot shrink the record must not spin.
			return nil, fmt.Errorf("encoding the metrics record: %d bytes in %d points cannot be thinned below %d", len(b), n, maxRecordBytes)
		}
	}
}

// decode reads a record from Consul.
func decode(b []byte) (sweepkv.Metrics, error) {
	var m sweepkv.Metrics
	if err := json.Unmarshal(b, &m); err != nil {
		return sweepkv.Metrics{}, fmt.Errorf("decoding the metrics record: %w", err)
	}
	// A record written by hand, or by something else than a reporter,
	// must still rise in step for add's binary search.
	if !slices.IsSortedFunc(m.Points, func(a, b sweepkv.Point) int { return cmp.Compare(a.Step, b.Step) }) {
		return sweepkv.Metrics{}, fmt.Errorf("decoding the metrics record: its points are not in step order")
	}
	return m, nil
}

// estimate is about the JSON size of points, from above: per point its
// step, final flag and brackets, per value its quoted name and the longest
// float64 text.
func estimate(points []sweepkv.Point) int {
	n := 64 // the record's other fields
	for _, p := range points {
		n += 64
		for name := range p.Values {
			n += len(name) + 32
		}
	}
	return n
}
