package sweepplot

import (
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

const (
	defaultTitle  = "Sweep learning curves"
	defaultMetric = "objective"
	// legendMaxFrac caps the legend column's share of the width so that
	// long labels cannot squeeze the chart itself away.
	legendMaxFrac = 0.45
)

var panelPad = vg.Points(10)

// drawChart lays out the chart (left) and the legend column (right) on dc.
func drawChart(dc draw.Canvas, ss []series, skipped int, o Options) error {
	// vgimg starts white but SVG and PDF start transparent, and the legend
	// column lies outside the plot's own background: paint it all once.
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())

	p, err := newPlot(ss, o)
	if err != nil {
		return err
	}
	leg := buildLegend(ss, skipped)

	legW := legendWidth(leg) + 2*panelPad
	if limit := dc.Size().X * legendMaxFrac; legW > limit {
		legW = limit
	}
	// A margin all round keeps the title and axis labels off the image edge.
	plotC := draw.Crop(dc, panelPad, -legW, panelPad, -panelPad)
	p.Draw(plotC)

	// Start the legend level with the top of the data area, below the title.
	top := 2 * panelPad
	if p.Title.Text != "" {
		top += p.Title.TextStyle.Rectangle(p.Title.Text).Size().Y + p.Title.Padding
	}
	legC := draw.Crop(dc, dc.Size().X-legW+panelPad, -panelPad, panelPad, -top)
	leg.Draw(legC)
	return nil
}

// newPlot builds the chart: grid, then the lines in an order that keeps the
// important marks on top (ordinary, then best, then stop markers).
func newPlot(ss []series, o Options) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = o.Title
	if p.Title.Text == "" {
		p.Title.Text = defaultTitle
	}
	p.Title.TextStyle.Font.Size = vg.Points(14)
	p.Title.Padding = vg.Points(6)
	p.X.Label.Text = "step"
	p.Y.Label.Text = o.Metric
	if p.Y.Label.Text == "" {
		p.Y.Label.Text = defaultMetric
	}
	p.X.Tick.Marker = integerTicks{}

	grid := plotter.NewGrid()
	grid.Vertical.Color = gridColor
	grid.Horizontal.Color = gridColor
	p.Add(grid)

	for _, pass := range []bool{false, true} { // ordinary first, best on top
		for _, s := range ss {
			if s.best != pass {
				continue
			}
			ps, err := curvePlotters(s)
			if err != nil {
				return nil, err
			}
			p.Add(ps...)
		}
	}
	for _, s := range ss {
		if !s.stopped {
			continue
		}
		sc, err := plotter.NewScatter(plotter.XYs{s.last()})
		if err != nil {
			return nil, err
		}
		sc.GlyphStyle = stopGlyph()
		p.Add(sc)
	}
	return p, nil
}

// curvePlotters draws one series: a line, or a dot when a single point
// cannot make a line; the best curve also gets a dot at its end so the eye
// finds where it finished.
func curvePlotters(s series) ([]plot.Plotter, error) {
	var out []plot.Plotter
	if len(s.xys) > 1 {
		l, err := plotter.NewLine(s.xys)
		if err != nil {
			return nil, err
		}
		l.LineStyle = lineStyle(s.color, s.best, s.failed)
		out = append(out, l)
	}
	if len(s.xys) == 1 || s.best {
		r := dotRadius
		if s.best {
			r = bestDot
		}
		sc, err := plotter.NewScatter(plotter.XYs{s.last()})
		if err != nil {
			return nil, err
		}
		sc.GlyphStyle = draw.GlyphStyle{Color: s.color, Radius: r, Shape: draw.CircleGlyph{}}
		out = append(out, sc)
	}
	return out, nil
}

// integerTicks keeps only whole-number ticks: steps are integers, and a
// short sweep (steps 0..3) would otherwise be labelled 0.5, 1.5, ...
type integerTicks struct{}

// Ticks implements plot.Ticker.
func (integerTicks) Ticks(min, max float64) []plot.Tick {
	var out []plot.Tick
	for _, t := range (plot.DefaultTicks{}).Ticks(min, max) {
		if t.Value == math.Trunc(t.Value) {
			out = append(out, t)
		}
	}
	return out
}
