package sweepplot

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgpdf"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Point is one reported value of the objective metric.
type Point struct {
	Step  int
	Value float64
}

// Curve is one trial's learning curve and how to present it.
type Curve struct {
	ID       string  // "trial-003"
	Label    string  // e.g. "trial-003 lr=0.01 layers=2"; ID is used when empty
	State    string  // "completed", "stopped", "failed", "running", ...
	Points   []Point // the objective metric's points in step order
	Best     bool    // the sweep's best trial
	StopNote string  // for stopped trials, e.g. "ASHA at step 40"; may be empty
}

// Options controls the output. The zero value gives a 1200x700 PNG.
type Options struct {
	Title, Metric string
	Width, Height int    // pixels; 0: 1200x700
	Format        string // "png" (default), "svg", "pdf"
}

// Trial states that change how a curve is drawn. Anything else ("completed",
// "running", "pending", ...) is an ordinary curve.
const (
	stateStopped = "stopped"
	stateFailed  = "failed"
)

const (
	defaultWidth, defaultHeight = 1200, 700
	// maxSide bounds each side: a PNG is held uncompressed in memory (4 bytes
	// a pixel), and a typo such as -width 120000 must not take the CLI down.
	maxSide = 10000
	// dpi ties Options' pixels to gonum/plot's physical lengths. 96 is
	// vgimg's default, so a PNG has exactly Width x Height pixels; SVG and
	// PDF get the same layout at the same physical size.
	dpi = 96
)

// Render draws every curve's learning curve: x = step, y = metric. Stopped
// trials end with a red X at their last point; the best trial is drawn thick
// in the highlight colour and named in the legend; failed trials are dashed;
// other trials are thin, each in its own colour.
//
// Curves with no (finite) points are skipped and counted in the legend. No
// curves at all, or none with a point, is an error: an empty chart would look
// like a rendering bug rather than "no metrics reported yet".
func Render(w io.Writer, curves []Curve, o Options) (err error) {
	wpx, hpx, format, err := o.normalize()
	if err != nil {
		return err
	}
	if len(curves) == 0 {
		return errors.New("sweepplot: no curves to draw: the sweep has no trials")
	}
	series, skipped := prepare(curves)
	if len(series) == 0 {
		return fmt.Errorf("sweepplot: none of the %d trials has reported a point of the objective metric yet", len(curves))
	}

	// gonum/plot reports some impossible layouts by panicking. A report is a
	// convenience; turn that into an error instead of crashing the CLI.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("sweepplot: drawing failed: %v", r)
		}
	}()

	wl := vg.Length(wpx) * vg.Inch / dpi
	hl := vg.Length(hpx) * vg.Inch / dpi
	cw := newCanvas(format, wl, hl)
	dc := draw.New(cw)
	if err := drawChart(dc, series, skipped, o); err != nil {
		return err
	}
	if _, err := cw.WriteTo(w); err != nil {
		return fmt.Errorf("sweepplot: writing %s: %w", format, err)
	}
	return nil
}

// normalize applies the defaults and rejects options that cannot be drawn.
func (o Options) normalize() (w, h int, format string, err error) {
	w, h = o.Width, o.Height
	if w == 0 {
		w = defaultWidth
	}
	if h == 0 {
		h = defaultHeight
	}
	if w < 0 || h < 0 || w > maxSide || h > maxSide {
		return 0, 0, "", fmt.Errorf("sweepplot: image size %dx%d out of range (1..%d pixels a side)", o.Width, o.Height, maxSide)
	}
	format = strings.ToLower(strings.TrimPrefix(o.Format, "."))
	switch format {
	case "":
		format = "png"
	case "png", "svg", "pdf":
	default:
		return 0, 0, "", fmt.Errorf("sweepplot: unknown format %q (want png, svg or pdf)", o.Format)
	}
	return w, h, format, nil
}

// newCanvas builds the backend for format, which normalize has checked.
func newCanvas(format string, w, h vg.Length) vg.CanvasWriterTo {
	switch format {
	case "svg":
		return vgsvg.New(w, h)
	case "pdf":
		return vgpdf.New(w, h)
	default:
		return vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(dpi))}
	}
}
