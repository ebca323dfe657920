package top

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mattn/go-runewidth"

	"github.com/gpujob/gpujob/cli/observe"
)

// width measures cells as a terminal outside East Asian locales does: the
// bar and sparkline blocks are one cell wide.
var width = &runewidth.Condition{EastAsianWidth: false}

const sparks = "▁▂▃▄▅▆▇█"

// section is a titled list of rows.
type section struct {
	title string
	rows  []string
}

// View renders the frame: the header and the GPUS, JOBS, QUEUE, QUEUES
// (with a queue configuration), SWEEPS and SERVICES sections, cut to the terminal's size (no limit when unknown).
func (m *Model) View() string {
	return m.frame(m.width, m.height)
}

// Frame renders one frame at the given size (0: no limit), as text.
func (m *Model) frame(w, h int) string {
	header := m.header()
	var secs []section
	if m.snap != nil {
		secs = []section{m.gpuSection(w), m.jobSection(compact(w)), m.queueSection()}
		if q, ok := m.queuesSection(); ok {
			secs = append(secs, q)
		}
		secs = append(secs, m.sweepSection())
		if m.services != nil {
			secs = append(secs, m.serviceSection())
		}
	}
	lines := append([]string{}, header...)
	lines = append(lines, layout(secs, h-len(header))...)
	if h > 0 && len(lines) > h {
		lines = lines[:h]
	}
	if w > 0 {
		for i, l := range lines {
			lines[i] = width.Truncate(l, w, "…")
		}
	}
	return strings.Join(lines, "\n")
}

// layout places the sections in avail lines (no limit when avail is 0 or
// less and no height is known): a section that does not fit loses rows from
// its end for a "… N more" line, the longest section first.
func layout(secs []section, avail int) []string {
	shown := make([]int, len(secs))
	for i, s := range secs {
		shown[i] = len(s.rows)
	}
	gap := 1 // blank line before each title
	if avail > 0 {
		fixed := func() int { return len(secs) * (1 + gap) }
		if sum(shown)+fixed() > avail {
			gap = 0
		}
		for sum(shown)+fixed() > avail {
			i := longest(shown)
			if shown[i] == 0 {
				break
			}
			if shown[i] == 1 && len(secs[i].rows) > 1 {
				// already only "… N more": drop the section's rows.
				shown[i] = 0
				continue
			}
			shown[i]--
		}
	}
	var out []string
	for i, s := range secs {
		if gap > 0 {
			out = append(out, "")
		}
		out = append(out, s.title)
		n := shown[i]
		if n >= len(s.rows) {
			out = append(out, s.rows...)
			continue
		}
		if n > 0 {
			out = append(out, s.rows[:n-1]...)
			out = append(out, fmt.Sprintf("  … %d more", len(s.rows)-(n-1)))
		}
	}
	return out
}

func sum(xs []int) int {
	t := 0
	for _, x := range xs {
		t += x
	}
	return t
}

func longest(xs []int) int {
	best := 0
	for i, x := range xs {
		if x > xs[best] {
			best = i
		}
	}
	return best
}

func (m *Model) header() []string {
	var b strings.Builder
	b.WriteString("gpujob top")
	if m.Cluster != "" {
		b.WriteString("  " + m.Cluster)
	}
	if m.snap == nil {
		lines := []string{b.String() + m.quitHint()}
		if m.snapErr != nil {
			lines = append(lines, "error: "+oneLine(m.snapErr.Error()))
		} else {
			lines = append(lines, "reading the cluster…")
		}
		return lines
	}
	s := m.snap
	gpus, unhealthy, held := 0, 0, 0
	for _, n := range s.Nodes {
		for _, g := range n.GPUs {
			gpus++
			if !g.Healthy {
				unhealthy++
			}
			if g.Holder != nil {
				held++
			}
		}
	}
	fmt.Fprintf(&b, "  %s  %d nodes  %d GPUs (%d held, %d unhealthy)  %d warnings",
		s.Taken.Local().Format("15:04:05"), len(s.Nodes), gpus, held, unhealthy, len(s.Warnings))
	lines := []string{b.String() + m.quitHint()}
	if m.snapErr != nil {
		lines = append(lines, "error: "+oneLine(m.snapErr.Error())+" (showing the last snapshot)")
	}
	if len(s.Warnings) > 0 {
		w := "warning: " + oneLine(s.Warnings[0])
		if len(s.Warnings) > 1 {
			w += fmt.Sprintf(" (+%d more)", len(s.Warnings)-1)
		}
		lines = append(lines, w)
	}
	return lines
}

func (m *Model) quitHint() string {
	if m.plain {
		return ""
	}
	return "  (q quits)"
}

// compact is whether a terminal w wide gets the compact GPU rows.
func compact(w int) bool { return w > 0 && w < 110 }

// barWidth is the util and memory bars' width for a terminal w wide: the
// rest of a GPU row takes 58 cells (28 compact), and its holder about 34
// (22 compact).
func barWidth(w int) int {
	switch {
	case w <= 0:
		return 10
	case compact(w):
		return min(max((w-50)/2, 5), 20)
	}
	return min(max((w-92)/2, 5), 20)
}

// nameWidth is the width of a section's name column: its longest name, at
// most 32 cells.
func nameWidth(names []string) int {
	w := 0
	for _, n := range names {
		w = max(w, min(width.StringWidth(n), 32))
	}
	return w
}

// pad fits s to exactly w cells.
func pad(s string, w int) string {
	return width.FillRight(width.Truncate(s, w, "…"), w)
}

func (m *Model) gpuSection(w int) section {
	s := m.snap
	bw := barWidth(w)
	low := m.lowUtil()
	sec := section{}
	total := 0
	for _, n := range s.Nodes {
		total += len(n.GPUs)
		held, bad := 0, 0
		for _, g := range n.GPUs {
			if g.Holder != nil {
				held++
			}
			if !g.Healthy {
				bad++
			}
		}
		line := fmt.Sprintf("%s  %s  %d GPUs, %d held", firstOf(n.Name, n.ID), firstOf(n.Status, "?"), len(n.GPUs), held)
		if compact(w) && len(n.GPUs) > 0 {
			line = fmt.Sprintf("%s  %s  %d× %s, %d held", firstOf(n.Name, n.ID), firstOf(n.Status, "?"), len(n.GPUs), n.GPUs[0].Model, held)
		}
		if bad > 0 {
			line += fmt.Sprintf(", %d UNHEALTHY", bad)
		}
		if n.StatsErr != "" {
			line += "  stats: " + oneLine(n.StatsErr)
		}
		sec.rows = append(sec.rows, line)
		for _, g := range n.GPUs {
			sec.rows = append(sec.rows, gpuRow(g, bw, low[g.UUID], compact(w)))
		}
	}
	sec.title = fmt.Sprintf("GPUS  %d nodes, %d GPUs", len(s.Nodes), total)
	return sec
}

// gpuRow is a GPU's row; a compact one (a narrow terminal) leaves out the
// model, the memory in GiB and the power.
func gpuRow(g observe.GPU, bw int, low, compact bool) string {
	mark := " "
	if !g.Healthy {
		mark = "!"
	}
	memPct := (*float64)(nil)
	if g.MemUsedMiB != nil && g.MemTotalMiB != nil && *g.MemTotalMiB > 0 {
		p := *g.MemUsedMiB / *g.MemTotalMiB * 100
		memPct = &p
	} else if g.MemUtilPct != nil {
		memPct = g.MemUtilPct
	}
	mem := "-"
	if g.MemUsedMiB != nil && g.MemTotalMiB != nil {
		mem = fmt.Sprintf("%.1f/%.1fG", *g.MemUsedMiB/1024, *g.MemTotalMiB/1024)
	}
	temp := "-"
	if g.TempC != nil {
		temp = fmt.Sprintf("%.0fC", *g.TempC)
	}
	power := "-"
	if g.PowerW != nil {
		power = fmt.Sprintf("%.0fW", *g.PowerW)
		if g.PowerLimitW != nil {
			power = fmt.Sprintf("%.0f/%.0fW", *g.PowerW, *g.PowerLimitW)
		}
	}
	var who []string
	if !g.Healthy {
		who = append(who, "UNHEALTHY"+prefixed(": ", oneLine(g.HealthDescription)))
	}
	if h := g.Holder; h != nil {
		name := firstOf(h.AllocName, h.JobID)
		if h.Namespace != "" {
			name = h.Namespace + "/" + name
		}
		if low {
			name += " (<80% util)"
		}
		who = append(who, name)
	} else if g.Healthy {
		who = append(who, "free")
	}
	if compact {
		return fmt.Sprintf("%s%2d %s %4s %s %4s %4s %s", mark, g.Index, bar(g.UtilPct, bw), pct(g.UtilPct),
			bar(memPct, bw), pct(memPct), temp, strings.Join(who, " "))
	}
	return fmt.Sprintf("%s%2d %s %s %4s  %s %10s  %4s  %9s  %s", mark, g.Index, pad(g.Model, 12),
		bar(g.UtilPct, bw), pct(g.UtilPct), bar(memPct, bw), mem, temp, power, strings.Join(who, " "))
}

// bar is "[█████░░░░░]" filled in proportion to p (0–100), blank when p is
// unknown.
func bar(p *float64, w int) string {
	if p == nil {
		return "[" + strings.Repeat(" ", w) + "]"
	}
	n := int(math.Round(math.Max(0, math.Min(100, *p)) / 100 * float64(w)))
	return "[" + strings.Repeat("█", n) + strings.Repeat("░", w-n) + "]"
}

func pct(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", *p)
}

// lowUtil is the GPUs of running training jobs (and trials) under
// LowUtilPct utilisation, by UUID.
func (m *Model) lowUtil() map[string]bool {
	out := map[string]bool{}
	for _, n := range m.snap.Nodes {
		for _, g := range n.GPUs {
			if g.Holder != nil && (g.Holder.Kind == observe.KindTrain || g.Holder.Kind == observe.KindTrial) && g.UtilPct != nil && observe.LowUtilization(*g.UtilPct) {
				out[g.UUID] = true
			}
		}
	}
	return out
}

func (m *Model) jobSection(narrow bool) section {
	s := m.snap
	sec := section{title: fmt.Sprintf("JOBS  %d training", len(s.Jobs))}
	if len(s.Jobs) == 0 {
		return sec
	}
	// The GPUs of each job, from its members and from the holders.
	util := map[string]*float64{}
	jobGPUs := map[string]map[string]bool{}
	for _, n := range s.Nodes {
		for _, g := range n.GPUs {
			util[g.UUID] = g.UtilPct
			if h := g.Holder; h != nil {
				k := h.Namespace + "/" + h.JobID
				if jobGPUs[k] == nil {
					jobGPUs[k] = map[string]bool{}
				}
				jobGPUs[k][g.UUID] = true
			}
		}
	}
	names := []string{"JOB"}
	for _, j := range s.Jobs {
		names = append(names, j.Namespace+"/"+j.ID)
	}
	nameW := nameWidth(names)
	if narrow {
		// A narrow terminal: no status or round, a shorter trend, the
		// low-utilisation flag as a "!" mark.
		sec.rows = append(sec.rows, fmt.Sprintf("  %s %4s %5s %5s %7s %s", width.FillRight("JOB", nameW),
			"MEMB", "RANKS", "RESTS", "LOSS", "TREND"))
	} else {
		sec.rows = append(sec.rows, fmt.Sprintf("  %s  %-7s  %7s  %5s  %5s  %8s  %8s  %s",
			width.FillRight("JOB", nameW), "STATUS", "MEMBERS", "RANKS", "ROUND", "RESTARTS", "LOSS", "TREND"))
	}
	for _, j := range s.Jobs {
		key := j.Namespace + "/" + j.ID
		total := j.Workers
		if total < 0 {
			total = len(j.Members)
		}
		members := fmt.Sprintf("%d/%d", j.MembersByState["running"], total)
		ranks := "-"
		lo, hi := -1, -1
		for _, mem := range j.Members {
			if mem.FirstRank < 0 {
				continue
			}
			if lo < 0 || mem.FirstRank < lo {
				lo = mem.FirstRank
			}
			hi = max(hi, mem.LastRank)
		}
		if lo >= 0 {
			ranks = strconv.Itoa(lo) + "-" + strconv.Itoa(hi)
		}
		round := "-"
		if j.Round > 0 {
			round = strconv.Itoa(j.Round)
		}
		budget := "?"
		if j.MaxRestarts >= 0 {
			budget = strconv.Itoa(j.MaxRestarts)
		}
		loss := "-"
		if len(j.Losses) > 0 {
			t := 0.0
			for _, l := range j.Losses {
				t += l.Loss
			}
			loss = strconv.FormatFloat(t/float64(len(j.Losses)), 'g', 4, 64)
		}
		trend := ""
		if h := m.history[key]; h != nil {
			trend = sparkline(h.mean)
		}
		for _, mem := range j.Members {
			for _, u := range mem.GPUs {
				if jobGPUs[key] == nil {
					jobGPUs[key] = map[string]bool{}
				}
				jobGPUs[key][u] = true
			}
		}
		lowN, n := 0, 0
		for u := range jobGPUs[key] {
			n++
			if p := util[u]; p != nil && observe.LowUtilization(*p) {
				lowN++
			}
		}
		if narrow {
			mark := " "
			if lowN > 0 && j.Status == "running" {
				mark = "!"
			}
			tr := []rune(trend)
			tr = tr[max(0, len(tr)-10):]
			sec.rows = append(sec.rows, strings.TrimRight(fmt.Sprintf("%s %s %4s %5s %5s %7s %s", mark, pad(key, nameW),
				members, ranks, fmt.Sprintf("%d/%s", j.Restarts, budget), loss, string(tr)), " "))
			continue
		}
		row := fmt.Sprintf("  %s  %-7s  %7s  %5s  %5s  %8s  %8s  %s", pad(key, nameW),
			firstOf(j.Status, "?"), members, ranks, round, fmt.Sprintf("%d/%s", j.Restarts, budget), loss,
			width.FillRight(trend, HistoryLen/2))
		if lowN > 0 && j.Status == "running" {
			row += fmt.Sprintf("  LOW UTIL: %d/%d GPUs <%d%%", lowN, n, LowUtilPct)
		}
		sec.rows = append(sec.rows, strings.TrimRight(row, " "))
	}
	return sec
}

// sparkline draws the last HistoryLen/2 points, scaled between their
// minimum and maximum.
func sparkline(xs []float64) string {
	if len(xs) > HistoryLen/2 {
		xs = xs[len(xs)-HistoryLen/2:]
	}
	if len(xs) == 0 {
		return ""
	}
	lo, hi := xs[0], xs[0]
	for _, x := range xs {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	r := []rune(sparks)
	var b strings.Builder
	for _, x := range xs {
		i := len(r) / 2
		if hi > lo {
			i = int(math.Round((x - lo) / (hi - lo) * float64(len(r)-1)))
		}
		b.WriteRune(r[i])
	}
	return b.String()
}

func (m *Model) queueSection() section {
	s := m.snap
	sec := section{title: fmt.Sprintf("QUEUE  %d waiting", len(s.Queue))}
	var names []string
	for _, q := range s.Queue {
		names = append(names, q.Namespace+"/"+q.JobID)
	}
	nw := nameWidth(names)
	for _, q := range s.Queue {
		wait := "-"
		if !q.Since.IsZero() {
			wait = duration(s.Taken.Sub(q.Since))
		}
		sec.rows = append(sec.rows, fmt.Sprintf("  %s  %-7s  %d allocs waiting %s", pad(q.Namespace+"/"+q.JobID, nw), q.Kind, q.Queued, wait))
	}
	return sec
}

func (m *Model) sweepSection() section {
	s := m.snap
	sec := section{title: fmt.Sprintf("SWEEPS  %d", len(s.Sweeps))}
	var names []string
	for _, sw := range s.Sweeps {
		names = append(names, sw.Namespace+"/"+sw.Name)
	}
	nw := nameWidth(names)
	for _, sw := range s.Sweeps {
		var parts []string
		done := 0
		for _, st := range []string{"pending", "running", "stopping", "completed", "stopped", "failed"} {
			if n := sw.TrialsByState[st]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, st))
				if st == "completed" || st == "stopped" || st == "failed" {
					done += n
				}
			}
		}
		trials := fmt.Sprintf("%d/%d done", done, sw.MaxTrials)
		if len(parts) > 0 {
			trials += " (" + strings.Join(parts, ", ") + ")"
		}
		best := "best -"
		if sw.Best != nil {
			dir := "min"
			if sw.Maximize {
				dir = "max"
			}
			best = fmt.Sprintf("best %s=%s (%s%s)", firstOf(sw.Objective, "objective"),
				strconv.FormatFloat(*sw.Best, 'g', 4, 64), dir, prefixed(", ", sw.BestTrial))
		}
		sec.rows = append(sec.rows, fmt.Sprintf("  %s  %-9s  %s  %s", pad(sw.Namespace+"/"+sw.Name, nw), sw.Status, trials, best))
	}
	return sec
}

func (m *Model) serviceSection() section {
	names := make([]string, 0, len(m.svc))
	for k := range m.svc {
		names = append(names, k)
	}
	sort.Strings(names)
	sec := section{title: fmt.Sprintf("SERVICES  %d", len(names))}
	if m.svcErr != nil {
		sec.title += "  gateway: " + oneLine(m.svcErr.Error())
	}
	nw := nameWidth(names)
	for _, k := range names {
		st := m.svc[k]
		sec.rows = append(sec.rows, fmt.Sprintf("  %s  %7.1f req/s  p99 %7.1f ms  p50 %7.1f ms  %d errors  %d in flight  %d held",
			pad(k, nw), st.RPS, st.P99Ms, st.P50Ms, st.Errors, st.Inflight, st.Queued))
	}
	return sec
}

// duration is d rounded to the second, or the minute past an hour.
func duration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	if d >= time.Hour {
		return d.Round(time.Minute).String()
	}
	return d.Round(time.Second).String()
}

func firstOf(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
