package sweepplot

import (
	"fmt"
	"image/color"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

const (
	// maxNamed is the most curves the legend names one by one. Past it a
	// per-trial legend is a wall of near-identical colours nobody can match
	// to lines, so the legend names the best and counts the rest by state.
	maxNamed = 10
	// Label lengths (runes) that keep the legend column narrow.
	maxLabel = 56
	maxNote  = 40
)

// buildLegend returns the legend for ss. Entries are text plus thumbnails
// drawn with the very styles used in the chart.
func buildLegend(ss []series, skipped int) plot.Legend {
	leg := plot.NewLegend()
	leg.Top, leg.Left = true, true
	leg.ThumbnailWidth = vg.Points(24)
	leg.Padding = vg.Points(4)
	leg.TextStyle.Font.Size = vg.Points(11)

	// The best first: it is the one entry every reader looks for.
	for _, s := range ss {
		if s.best {
			leg.Add(entryText(s), thumbs(s.color, s)...)
		}
	}
	if len(ss) <= maxNamed {
		for _, s := range ss {
			if !s.best {
				leg.Add(entryText(s), thumbs(s.color, s)...)
			}
		}
	} else {
		for _, g := range stateGroups(ss) {
			leg.Add(fmt.Sprintf("%d %s", g.n, g.word), thumbs(neutralColor, g.sample)...)
		}
	}
	if skipped > 0 {
		leg.Add(fmt.Sprintf("%d %s without points (not drawn)", skipped, plural(skipped, "trial", "trials")))
	}
	return leg
}

// entryText names one trial, with the state when it matters to the reader.
func entryText(s series) string {
	t := truncate(s.name(), maxLabel)
	if s.best {
		t = "best: " + t
	}
	switch st := s.curve.State; {
	case s.stopped:
		if s.curve.StopNote != "" {
			t += " [stopped: " + truncate(s.curve.StopNote, maxNote) + "]"
		} else {
			t += " [stopped]"
		}
	case st == "" || st == "completed":
	default:
		t += " [" + truncate(st, maxNote) + "]"
	}
	return t
}

// group is one compact-legend line: how many non-best curves share a state.
type group struct {
	word   string
	n      int
	sample series // carries the role (stopped/failed) for the thumbnail
}

// stateGroups counts the non-best curves by state, in a fixed order
// (completed, running, stopped, failed, then the rest alphabetically) so the
// same sweep always gets the same legend.
func stateGroups(ss []series) []group {
	byState := map[string]*group{}
	for _, s := range ss {
		if s.best {
			continue
		}
		st := s.curve.State
		if st == "" {
			st = "unknown"
		}
		g, ok := byState[st]
		if !ok {
			word := st
			if s.stopped {
				word = "stopped early"
			}
			g = &group{word: word, sample: s}
			byState[st] = g
		}
		g.n++
	}
	rank := map[string]int{"completed": 0, "running": 1, stateStopped: 2, stateFailed: 3}
	keys := make([]string, 0, len(byState))
	for k := range byState {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		ri, oki := rank[keys[i]]
		rj, okj := rank[keys[j]]
		switch {
		case oki && okj:
			return ri < rj
		case oki != okj:
			return oki
		default:
			return keys[i] < keys[j]
		}
	})
	out := make([]group, 0, len(keys))
	for _, k := range keys {
		out = append(out, *byState[k])
	}
	return out
}

// thumbs draws s's role (thickness, dashes, stop X) in colour c.
func thumbs(c color.Color, s series) []plot.Thumbnailer {
	t := []plot.Thumbnailer{lineThumb{lineStyle(c, s.best, s.failed)}}
	if s.stopped {
		t = append(t, glyphThumb{stopGlyph()})
	}
	return t
}

// lineThumb is a legend swatch: a horizontal stroke in a line style.
type lineThumb struct{ style draw.LineStyle }

// Thumbnail implements plot.Thumbnailer.
func (t lineThumb) Thumbnail(c *draw.Canvas) {
	y := c.Center().Y
	c.StrokeLine2(t.style, c.Min.X, y, c.Max.X, y)
}

// glyphThumb is a legend swatch: one glyph at the swatch's centre.
type glyphThumb struct{ style draw.GlyphStyle }

// Thumbnail implements plot.Thumbnailer.
func (t glyphThumb) Thumbnail(c *draw.Canvas) { c.DrawGlyph(t.style, c.Center()) }

// legendWidth is the natural width of the legend's widest entry.
func legendWidth(l plot.Legend) vg.Length {
	r := l.Rectangle(draw.Canvas{})
	return r.Max.X - r.Min.X
}

// truncate shortens s to at most n runes, marking the cut.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-3]) + "..."
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
