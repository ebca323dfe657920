package sweepplot

import (
	"bytes"
	"fmt"
	"image"
	"image/png"
	"math"
	"os"
	"strings"
	"testing"
)

// sweep builds n synthetic trials: curves rising towards different plateaus,
// every third one stopped early (ASHA-like), one failed, trial 1 the best.
func sweep(n int) []Curve {
	cs := make([]Curve, 0, n)
	for i := 0; i < n; i++ {
		plateau := 0.6 + 0.3*float64((i*7)%n)/float64(n)
		last := 100
		state := "completed"
		note := ""
		switch {
		case i == 1:
			plateau = 0.95
		case i == 4:
			state, last = "failed", 55
		case i%3 == 0:
			state, last = "stopped", 20+20*(i%2)
			note = fmt.Sprintf("ASHA at step %d", last)
		}
		var pts []Point
		for s := 0; s <= last; s += 5 {
			pts = append(pts, Point{Step: s, Value: plateau * (1 - math.Exp(-float64(s)/25))})
		}
		cs = append(cs, Curve{
			ID:       fmt.Sprintf("trial-%03d", i),
			Label:    fmt.Sprintf("trial-%03d lr=%.0e layers=%d", i, 1e-4*float64(i+1), 2+2*(i%2)),
			State:    state,
			Points:   pts,
			Best:     i == 1,
			StopNote: note,
		})
	}
	return cs
}

func render(t *testing.T, cs []Curve, o Options) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Render(&buf, cs, o); err != nil {
		t.Fatalf("Render: %v", err)
	}
	return buf.Bytes()
}

// countPixels counts the pixels for which match is true. It reads the
// decoder's pixel buffer directly: At() and colour conversion per pixel make
// a 1200x700 scan take seconds under -race.
func countPixels(t *testing.T, img image.Image, match func(r, g, b uint8) bool) int {
	t.Helper()
	rgba, ok := img.(*image.RGBA)
	if !ok {
		t.Fatalf("decoded %T, want *image.RGBA", img)
	}
	n := 0
	for i := 0; i+3 < len(rgba.Pix); i += 4 {
		if match(rgba.Pix[i], rgba.Pix[i+1], rgba.Pix[i+2]) {
			n++
		}
	}
	return n
}

func isHighlight(r, g, b uint8) bool {
	return r == highlightColor.R && g == highlightColor.G && b == highlightColor.B
}

// isStopRed matches the stop marker and its anti-aliased edges; no palette
// colour has a channel below palMin, so ordinary lines never match.
func isStopRed(r, g, b uint8) bool { return r > 150 && g < 80 && b < 80 }

func TestRenderPNG(t *testing.T) {
	noBest := sweep(5)
	for i := range noBest {
		noBest[i].Best = false
	}
	completedOnly := sweep(3)[1:3]
	completedOnly[1].State = "completed"

	tests := []struct {
		name          string
		curves        []Curve
		opts          Options
		wantW, wantH  int
		wantHighlight bool
		wantStopRed   bool
	}{
		{"defaults", sweep(5), Options{}, 1200, 700, true, true},
		{"thirty trials", sweep(30), Options{Width: 800, Height: 450, Metric: "accuracy"}, 800, 450, true, true},
		{"no best", noBest, Options{Width: 500, Height: 300}, 500, 300, false, true},
		{"no stopped", completedOnly, Options{Width: 500, Height: 300}, 500, 300, true, false},
		{"single point", []Curve{{ID: "t0", Best: true, Points: []Point{{Step: 3, Value: 1}}}}, Options{Width: 400, Height: 300}, 400, 300, true, false},
		{"only height set", sweep(3), Options{Height: 240}, 1200, 240, true, true},
		{"format case", sweep(3), Options{Width: 500, Height: 300, Format: "PNG"}, 500, 300, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			img, err := png.Decode(bytes.NewReader(render(t, tc.curves, tc.opts)))
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if got := img.Bounds().Size(); got != (image.Point{X: tc.wantW, Y: tc.wantH}) {
				t.Fatalf("size %v, want %dx%d", got, tc.wantW, tc.wantH)
			}
			if nonWhite := countPixels(t, img, func(r, g, b uint8) bool { return r != 255 || g != 255 || b != 255 }); nonWhite < 1000 {
				t.Errorf("image looks blank: %d non-white pixels", nonWhite)
			}
			if n := countPixels(t, img, isHighlight); (n > 20) != tc.wantHighlight {
				t.Errorf("%d pixels in the highlight colour, want highlight=%v", n, tc.wantHighlight)
			}
			if n := countPixels(t, img, isStopRed); (n > 0) != tc.wantStopRed {
				t.Errorf("%d stop-marker pixels, want markers=%v", n, tc.wantStopRed)
			}
		})
	}
}

func TestRenderSVGLegend(t *testing.T) {
	few := sweep(5)
	many := sweep(30)
	tests := []struct {
		name         string
		curves       []Curve
		want, reject []string
	}{
		{
			name:   "few trials are each named",
			curves: few,
			want: []string{
				"best: trial-001 lr=2e-04 layers=4", "My title", "accuracy", "step",
				"trial-000 lr=1e-04 layers=2 [stopped: ASHA at step 20]",
				"trial-004 lr=5e-04 layers=2 [failed]",
				"stroke-dasharray", // the failed trial is dashed
			},
		},
		{
			name:   "many trials get a compact legend",
			curves: many,
			want:   []string{"best: trial-001 lr=2e-04 layers=4", "completed", "stopped early", "1 failed"},
			reject: []string{"trial-017"},
		},
		{
			name:   "skipped curves are counted",
			curves: append(sweep(2), Curve{ID: "trial-009", State: "running"}, Curve{ID: "trial-010", Points: []Point{{1, math.NaN()}}}),
			want:   []string{"2 trials without points (not drawn)"},
			reject: []string{"trial-009", "trial-010"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			svg := string(render(t, tc.curves, Options{Format: "svg", Title: "My title", Metric: "accuracy"}))
			if !strings.HasPrefix(strings.TrimSpace(svg), "<?xml") {
				t.Fatalf("not an SVG document: %.60q", svg)
			}
			for _, w := range tc.want {
				if !strings.Contains(svg, w) {
					t.Errorf("SVG lacks %q", w)
				}
			}
			for _, r := range tc.reject {
				if strings.Contains(svg, r) {
					t.Errorf("SVG unexpectedly contains %q", r)
				}
			}
		})
	}
}

func TestRenderPDF(t *testing.T) {
	t.Parallel()
	out := render(t, sweep(4), Options{Format: "pdf", Width: 400, Height: 300})
	if !bytes.HasPrefix(out, []byte("%PDF-")) {
		t.Fatalf("not a PDF: %.20q", out)
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name    string
		curves  []Curve
		opts    Options
		wantErr string
	}{
		{"nil curves", nil, Options{}, "no curves"},
		{"empty curves", []Curve{}, Options{}, "no curves"},
		{"no points anywhere", []Curve{{ID: "a"}, {ID: "b", Points: []Point{{0, math.Inf(1)}}}}, Options{}, "none of the 2 trials"},
		{"unknown format", sweep(2), Options{Format: "gif"}, "unknown format"},
		{"negative size", sweep(2), Options{Width: -1}, "out of range"},
		{"huge size", sweep(2), Options{Width: 100000, Height: 100}, "out of range"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := Render(&buf, tc.curves, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
			}
			if buf.Len() != 0 {
				t.Errorf("wrote %d bytes despite the error", buf.Len())
			}
		})
	}
}

func TestRenderDeterministic(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"png", "svg"} {
		t.Run(format, func(t *testing.T) {
			o := Options{Width: 400, Height: 300, Format: format, Metric: "accuracy"}
			a, b := render(t, sweep(12), o), render(t, sweep(12), o)
			if !bytes.Equal(a, b) {
				t.Fatalf("two renders of the same input differ (%d vs %d bytes)", len(a), len(b))
			}
		})
	}
}

func TestRenderDoesNotModifyInput(t *testing.T) {
	cs := []Curve{{ID: "t", Best: true, Points: []Point{{10, 0.5}, {0, 0.1}, {5, 0.3}}}}
	render(t, cs, Options{Width: 300, Height: 200})
	if cs[0].Points[0].Step != 10 {
		t.Fatalf("Render sorted the caller's points: %v", cs[0].Points)
	}
}

func TestPaletteNeverHighlight(t *testing.T) {
	for i := 0; i < 200; i++ {
		c := paletteColor(i)
		if float64(min(c.R, c.G, c.B)) < palMin-1 || c == highlightColor {
			t.Fatalf("palette colour %d = %v breaks the invariant the pixel tests rely on", i, c)
		}
	}
}

// TestWriteSample writes a sample for eyeballing when SWEEPPLOT_SAMPLE names
// a file, e.g. SWEEPPLOT_SAMPLE=/tmp/sweep.png go test -run Sample.
func TestWriteSample(t *testing.T) {
	path := os.Getenv("SWEEPPLOT_SAMPLE")
	if path == "" {
		t.Skip("set SWEEPPLOT_SAMPLE=/tmp/sweep.png to write a sample")
	}
	n := 30
	if s := os.Getenv("SWEEPPLOT_TRIALS"); s != "" {
		fmt.Sscan(s, &n)
	}
	format := strings.TrimPrefix(strings.ToLower(path[strings.LastIndex(path, "."):]), ".")
	out := render(t, sweep(n), Options{Title: "bert-lr: accuracy by step", Metric: "accuracy", Format: format})
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}
