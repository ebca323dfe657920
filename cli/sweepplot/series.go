package sweepplot

import (
	"image/color"
	"math"
	"sort"

	"gonum.org/v1/plot/plotter"
)

// series is a Curve ready to draw: finite points in step order, its colour
// and its role.
type series struct {
	curve           Curve
	xys             plotter.XYs
	color           color.RGBA
	best            bool
	stopped, failed bool
}

// prepare turns curves into drawable series, in input order, and counts the
// curves left with nothing to draw. It never modifies the caller's slices.
//
// Non-finite values are dropped rather than rejected: a diverging trial that
// reports a NaN loss is exactly what a sweep report should still show, and
// gonum/plot refuses NaN and Inf outright. Points are sorted by step (stable)
// because results read back from KV are not guaranteed to arrive in order,
// and an unsorted line would zigzag.
func prepare(curves []Curve) (out []series, skipped int) {
	colorIdx := 0
	for _, c := range curves {
		xys := make(plotter.XYs, 0, len(c.Points))
		for _, p := range c.Points {
			if math.IsNaN(p.Value) || math.IsInf(p.Value, 0) {
				continue
			}
			xys = append(xys, plotter.XY{X: float64(p.Step), Y: p.Value})
		}
		if len(xys) == 0 {
			skipped++
			continue
		}
		sort.SliceStable(xys, func(i, j int) bool { return xys[i].X < xys[j].X })

		s := series{
			curve:   c,
			xys:     xys,
			best:    c.Best,
			stopped: c.State == stateStopped,
			failed:  c.State == stateFailed,
		}
		if s.best {
			s.color = highlightColor
		} else {
			// Only ordinary curves consume palette slots, so a trial's
			// colour depends on its position among them and nothing else.
			s.color = paletteColor(colorIdx)
			colorIdx++
		}
		out = append(out, s)
	}
	return out, skipped
}

// name is how a trial is called in the legend.
func (s series) name() string {
	switch {
	case s.curve.Label != "":
		return s.curve.Label
	case s.curve.ID != "":
		return s.curve.ID
	default:
		return "unnamed trial"
	}
}

// last is the curve's final drawn point: where a stopped trial's X goes.
func (s series) last() plotter.XY { return s.xys[len(s.xys)-1] }
