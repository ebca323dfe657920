package sweepplot

import (
	"image/color"
	"math"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Colours. The highlight colour has a zero red channel and the palette below
// never goes under palMin in any channel, so neither a palette colour nor an
// anti-aliased blend of palette colours with the white background can ever
// equal highlightColor exactly: the best trial is the only thing painted in it
// (tests rely on this to find the best curve in the pixels).
var (
	highlightColor = color.RGBA{R: 0x00, G: 0x4C, B: 0xE0, A: 0xFF}
	stopColor      = color.RGBA{R: 0xD0, G: 0x10, B: 0x10, A: 0xFF}
	neutralColor   = color.RGBA{R: 0x80, G: 0x80, B: 0x80, A: 0xFF}
	gridColor      = color.RGBA{R: 0xE4, G: 0xE4, B: 0xE4, A: 0xFF}
)

// Palette for ordinary trials: muted (low saturation) so that the highlighted
// best curve and the red stop markers stand out against thirty thin lines.
const (
	palSaturation = 0.55
	palValue      = 0.80
	// palMin is the smallest channel any palette colour has: v*(1-s).
	palMin = palValue * (1 - palSaturation) * 255
)

// Line widths and marker sizes, in points (1pt = 4/3 px at 96 DPI).
var (
	thinWidth    = vg.Points(1)
	bestWidth    = vg.Points(3)
	failedDashes = []vg.Length{vg.Points(6), vg.Points(3)}
	stopRadius   = vg.Points(5)
	stopWidth    = vg.Points(2)
	dotRadius    = vg.Points(2)
	bestDot      = vg.Points(4)
)

// paletteColor returns the i-th ordinary trial's colour. Hues advance by the
// golden ratio, which spreads any number of curves around the colour wheel
// with neighbours (adjacent trial numbers) far apart, and needs no table
// that ~30 curves would overrun. It depends only on i: same input, same image.
func paletteColor(i int) color.RGBA {
	h := math.Mod(0.13+float64(i)*0.6180339887498949, 1)
	return hsv(h, palSaturation, palValue)
}

// hsv converts hue h in [0,1), saturation s and value v in [0,1] to opaque RGBA.
func hsv(h, s, v float64) color.RGBA {
	h6 := h * 6
	sector := math.Floor(h6)
	f := h6 - sector
	p, q, t := v*(1-s), v*(1-s*f), v*(1-s*(1-f))
	var r, g, b float64
	switch int(sector) % 6 {
	case 0:
		r, g, b = v, t, p
	case 1:
		r, g, b = q, v, p
	case 2:
		r, g, b = p, v, t
	case 3:
		r, g, b = p, q, v
	case 4:
		r, g, b = t, p, v
	default:
		r, g, b = v, p, q
	}
	c := func(x float64) uint8 { return uint8(math.Round(x * 255)) }
	return color.RGBA{R: c(r), G: c(g), B: c(b), A: 0xFF}
}

// lineStyle is how a curve's line is stroked, decided by its role alone so
// that the legend's thumbnails match the plot.
func lineStyle(c color.Color, best, failed bool) draw.LineStyle {
	st := draw.LineStyle{Color: c, Width: thinWidth}
	if best {
		st.Width = bestWidth
	}
	if failed {
		st.Dashes = failedDashes
	}
	return st
}

// stopGlyph is the red X drawn at the last point of a stopped trial.
func stopGlyph() draw.GlyphStyle {
	return draw.GlyphStyle{Color: stopColor, Radius: stopRadius, Shape: thickCross{width: stopWidth}}
}

// thickCross is draw.CrossGlyph with a chosen stroke width: the stock glyph
// strokes at 0.5pt, too faint to find among many lines.
type thickCross struct{ width vg.Length }

// DrawGlyph implements draw.GlyphDrawer.
func (g thickCross) DrawGlyph(c *draw.Canvas, sty draw.GlyphStyle, pt vg.Point) {
	c.SetLineStyle(draw.LineStyle{Color: sty.Color, Width: g.width})
	r := sty.Radius * vg.Length(math.Cos(math.Pi/4))
	var p vg.Path
	p.Move(vg.Point{X: pt.X - r, Y: pt.Y - r})
	p.Line(vg.Point{X: pt.X + r, Y: pt.Y + r})
	c.Stroke(p)
	p = vg.Path{}
	p.Move(vg.Point{X: pt.X - r, Y: pt.Y + r})
	p.Line(vg.Point{X: pt.X + r, Y: pt.Y - r})
	c.Stroke(p)
}
