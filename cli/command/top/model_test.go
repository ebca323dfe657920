package top

import (
	"context"
	"errors"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/internal/servekv"
)

var epoch = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeSource serves a fixed snapshot (the test may swap it).
type fakeSource struct {
	mu      sync.Mutex
	snap    *observe.Snapshot
	err     error
	calls   int
	changed chan struct{}
}

func newFakeSource(s *observe.Snapshot) *fakeSource {
	return &fakeSource{snap: s, changed: make(chan struct{}, 1)}
}

func (f *fakeSource) Snapshot(context.Context) (*observe.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return f.snap, f.err
}

func (f *fakeSource) Changed() <-chan struct{} { return f.changed }

func fp(v float64) *float64 { return &v }

// gpu is a GPU with stats: util %, memory used of 16 GiB, 60 C, power.
func gpu(uuid string, index int, util, memMiB float64, holder *observe.Holder) observe.GPU {
	return observe.GPU{UUID: uuid, Index: index, Vendor: "nvidia", Model: "Tesla T4", Healthy: true,
		UtilPct: fp(util), MemUsedMiB: fp(memMiB), MemTotalMiB: fp(16384), TempC: fp(60), PowerW: fp(50), PowerLimitW: fp(70),
		Holder: holder}
}

func trainHolder(member int) *observe.Holder {
	return &observe.Holder{Namespace: "default", JobID: "bert", AllocID: "alloc-" + strconv.Itoa(member),
		AllocName: "bert.train[" + strconv.Itoa(member) + "]", Task: "train", Kind: "train"}
}

// fixture: 2 nodes × 4 GPUs. The training job default/bert has member 0 on
// node-a (GPUs a0 a1) and member 1 on node-b (b0 b1); b0 runs at 50 %, the
// job's only GPU under 80 %. a3 is unhealthy; b2 serves default/clf.
// step is the ranks' step, loss their base loss.
func fixture(step int, loss float64) *observe.Snapshot {
	a3 := gpu("GPU-a3", 3, 0, 0, nil)
	a3.Healthy, a3.HealthDescription = false, "XID 79: fallen off the bus"
	return &observe.Snapshot{
		Taken: epoch.Add(time.Duration(step) * time.Second),
		Nodes: []observe.Node{
			{ID: "node-a-id", Name: "node-a", Status: "ready", GPUs: []observe.GPU{
				gpu("GPU-a0", 0, 95, 12000, trainHolder(0)),
				gpu("GPU-a1", 1, 90, 12000, trainHolder(0)),
				gpu("GPU-a2", 2, 0, 0, nil),
				a3,
			}},
			{ID: "node-b-id", Name: "node-b", Status: "ready", GPUs: []observe.GPU{
				gpu("GPU-b0", 0, 50, 8192, trainHolder(1)),
				gpu("GPU-b1", 1, 85, 8192, trainHolder(1)),
				gpu("GPU-b2", 2, 30, 4096, &observe.Holder{Namespace: "default", JobID: "clf", AllocName: "clf.serve[0]",
					Task: "serve", Kind: "service"}),
				gpu("GPU-b3", 3, 10, 0, nil),
			}},
		},
		Jobs: []observe.TrainJob{{
			Namespace: "default", ID: "bert", Status: "running", Workers: 2,
			MembersByState: map[string]int{"running": 2},
			Members: []observe.Member{
				{AllocID: "alloc-0", AllocName: "bert.train[0]", NodeName: "node-a", State: "running", Round: 1, FirstRank: 0, LastRank: 1,
					GPUs: []string{"GPU-a0", "GPU-a1"}},
				{AllocID: "alloc-1", AllocName: "bert.train[1]", NodeName: "node-b", State: "running", Round: 1, FirstRank: 2, LastRank: 3,
					GPUs: []string{"GPU-b0", "GPU-b1"}},
			},
			Round: 1, Restarts: 1, MaxRestarts: 3,
			Losses: []observe.RankLoss{
				{Rank: 0, Step: step, Loss: loss}, {Rank: 1, Step: step, Loss: loss + 0.1},
				{Rank: 2, Step: step, Loss: loss + 0.2}, {Rank: 3, Step: step, Loss: loss + 0.3},
			},
		}},
		Queue: []observe.Waiting{{Namespace: "default", JobID: "gpt-big", Kind: "train", Queued: 4, Since: epoch.Add(-5 * time.Minute)}},
		Sweeps: []observe.Sweep{{Namespace: "default", Name: "lr-search", Status: "running", MaxTrials: 10,
			TrialsByState: map[string]int{"running": 2, "completed": 3, "failed": 1}, Objective: "val_loss", Best: fp(0.1234),
			BestTrial: "trial-3"}},
		Warnings: []string{"node-c: no stats within 5s"},
	}
}

func serviceStats(context.Context) (map[string]servekv.Stats, error) {
	return map[string]servekv.Stats{"default/clf": {RPS: 12.5, P50Ms: 8, P99Ms: 45.5, Errors: 2, Inflight: 3}}, nil
}

// newTestModel returns a model that has taken the fixture at step 1 and
// the service stats, sized w×h.
func newTestModel(t *testing.T, w, h int) (*Model, *fakeSource) {
	t.Helper()
	src := newFakeSource(fixture(1, 2.0))
	m := NewModel(src, serviceStats, time.Second)
	update(m, tea.WindowSizeMsg{Width: w, Height: h})
	snap, _ := src.Snapshot(context.Background())
	update(m, snapshotMsg{snap: snap})
	stats, err := serviceStats(context.Background())
	update(m, servicesMsg{stats: stats, err: err})
	return m, src
}

func update(m *Model, msg tea.Msg) tea.Cmd {
	next, cmd := m.Update(msg)
	if next != m {
		panic("Update returned another model")
	}
	return cmd
}

func checkWidth(t *testing.T, frame string, w, h int) {
	t.Helper()
	lines := strings.Split(frame, "\n")
	if h > 0 && len(lines) > h {
		t.Errorf("%d lines, more than the terminal's %d", len(lines), h)
	}
	for _, l := range lines {
		if n := width.StringWidth(l); n > w {
			t.Errorf("line %d cells wide, more than the terminal's %d: %q", n, w, l)
		}
	}
}

func lineWith(t *testing.T, frame string, subs ...string) string {
	t.Helper()
next:
	for _, l := range strings.Split(frame, "\n") {
		for _, s := range subs {
			if !strings.Contains(l, s) {
				continue next
			}
		}
		return l
	}
	t.Fatalf("no line with %q in the frame:\n%s", subs, frame)
	return ""
}

var gpuRowRE = regexp.MustCompile(`^([ !]) ?(\d+) (?:Tesla T4 +)?\[([█░ ]*)\] +(\d+)% +\[([█░ ]*)\]`)

func TestFrameGPUBarsProportional(t *testing.T) {
	for _, w := range []int{60, 80, 120, 160} {
		m, _ := newTestModel(t, w, 60)
		frame := m.View()
		bw := barWidth(w)
		rows := 0
		for _, l := range strings.Split(frame, "\n") {
			g := gpuRowRE.FindStringSubmatch(l)
			if g == nil {
				continue
			}
			rows++
			util, _ := strconv.Atoi(g[4])
			bar := []rune(g[3])
			if len(bar) != bw {
				t.Errorf("width %d: util bar %d cells, want %d: %q", w, len(bar), bw, l)
			}
			full := strings.Count(g[3], "█")
			if want := int(math.Round(float64(util) / 100 * float64(bw))); full != want {
				t.Errorf("width %d: %d%% util drew %d of %d cells, want %d: %q", w, util, full, bw, want, l)
			}
		}
		if rows != 8 {
			t.Errorf("width %d: %d GPU rows, want 8:\n%s", w, rows, frame)
		}
		// 95 % fills more than 50 %, which fills more than 10 %.
		count := func(sub string) int {
			return strings.Count(gpuRowRE.FindStringSubmatch(lineWith(t, frame, sub))[3], "█")
		}
		if a, b, c := count(" 95%"), count(" 50%"), count(" 10%"); !(a > b && b > c) {
			t.Errorf("width %d: bars not ordered by utilisation: 95%%→%d 50%%→%d 10%%→%d", w, a, b, c)
		}
		if compact(w) {
			continue
		}
		// Memory: 12000 of 16384 MiB.
		l := lineWith(t, frame, "bert.train[0]", " 95%")
		if !strings.Contains(l, "11.7/16.0G") {
			t.Errorf("memory used/total missing: %q", l)
		}
		if !strings.Contains(l, "60C") || !strings.Contains(l, "50/70W") {
			t.Errorf("temperature or power missing: %q", l)
		}
	}
}

func TestFrameUnhealthyAndLowUtilisation(t *testing.T) {
	m, _ := newTestModel(t, 120, 60)
	frame := m.View()
	l := lineWith(t, frame, "UNHEALTHY: XID 79")
	if !strings.HasPrefix(l, "! 3 Tesla T4") {
		t.Errorf("unhealthy GPU row not marked: %q", l)
	}
	if n := strings.Count(frame, "UNHEALTHY: "); n != 1 {
		t.Errorf("%d GPUs marked unhealthy, want 1", n)
	}
	lineWith(t, frame, "node-a", "4 GPUs, 2 held, 1 UNHEALTHY")
	// Narrow: the unhealthy mark leads the compact row too.
	update(m, tea.WindowSizeMsg{Width: 60, Height: 40})
	if l := lineWith(t, m.View(), "  0%", "UNHEALTHY"); !strings.HasPrefix(l, "! 3 [") {
		t.Errorf("compact unhealthy row: %q", l)
	}
	lineWith(t, m.View(), "node-a", "4× Tesla T4, 2 held, 1 UNHEALTHY")
	update(m, tea.WindowSizeMsg{Width: 120, Height: 60})
	// The job row flags its one GPU under 80 % (b0 at 50 %; b2's service
	// at 30 % is not the job's).
	job := lineWith(t, frame, "default/bert", "running")
	for _, want := range []string{" 2/2 ", " 0-3 ", " 1/3 ", "LOW UTIL: 1/4 GPUs <80%"} {
		if !strings.Contains(job, want) {
			t.Errorf("job row lacks %q: %q", want, job)
		}
	}
	if !strings.Contains(lineWith(t, frame, " 50%"), "default/bert.train[1] (<80% util)") {
		t.Errorf("the low GPU's row is not flagged:\n%s", frame)
	}
	if strings.Contains(lineWith(t, frame, " 30%"), "<80%") {
		t.Errorf("a service's GPU is flagged:\n%s", frame)
	}
	// No flag once every GPU of the job is busy.
	s := fixture(2, 1.9)
	s.Nodes[1].GPUs[0].UtilPct = fp(99)
	update(m, snapshotMsg{snap: s})
	if strings.Contains(m.View(), "LOW UTIL") {
		t.Errorf("flagged with every GPU ≥ 80%%:\n%s", m.View())
	}
}

func TestFrameOtherSections(t *testing.T) {
	m, _ := newTestModel(t, 120, 60)
	frame := m.View()
	lineWith(t, frame, "gpujob top", "2 nodes", "8 GPUs (5 held, 1 unhealthy)", "1 warnings", "(q quits)")
	lineWith(t, frame, "warning: node-c: no stats within 5s")
	lineWith(t, frame, "QUEUE  1 waiting")
	lineWith(t, frame, "default/gpt-big", "train", "4 allocs waiting 5m1s")
	lineWith(t, frame, "default/lr-search", "running", "4/10 done (2 running, 3 completed, 1 failed)", "best val_loss=0.1234 (min, trial-3)")
	lineWith(t, frame, "default/clf", "12.5 req/s", "p99    45.5 ms", "2 errors", "3 in flight")
	// The mean loss of the four ranks: 2.0, 2.1, 2.2, 2.3.
	lineWith(t, frame, "default/bert", " 2.15 ")

	// A failed read keeps the last snapshot, with the error.
	update(m, snapshotMsg{err: errors.New("connection refused")})
	frame = m.View()
	lineWith(t, frame, "error: connection refused (showing the last snapshot)")
	lineWith(t, frame, "default/bert")
	update(m, servicesMsg{err: errors.New("the gateway did not answer")})
	lineWith(t, m.View(), "SERVICES  0  gateway: the gateway did not answer")
}

func sparkOf(t *testing.T, frame string) string {
	t.Helper()
	l := lineWith(t, frame, "default/bert", " 0-3 ")
	var b strings.Builder
	for _, r := range l {
		if strings.ContainsRune(sparks, r) {
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSparklineGrows(t *testing.T) {
	m, _ := newTestModel(t, 120, 60)
	if s := sparkOf(t, m.View()); len([]rune(s)) != 1 {
		t.Fatalf("sparkline after one snapshot: %q", s)
	}
	// Falling loss: each new step adds a point.
	for step := 2; step <= 6; step++ {
		update(m, snapshotMsg{snap: fixture(step, 2.0-float64(step)*0.2)})
		if s := sparkOf(t, m.View()); len([]rune(s)) != step {
			t.Fatalf("sparkline after %d snapshots: %q", step, s)
		}
	}
	s := []rune(sparkOf(t, m.View()))
	if s[0] != '█' || s[len(s)-1] != '▁' {
		t.Errorf("falling loss drew %q, want from █ down to ▁", string(s))
	}
	// A snapshot without a new step (a stats tick) adds nothing.
	update(m, snapshotMsg{snap: fixture(6, 0.8)})
	if got := sparkOf(t, m.View()); got != string(s) {
		t.Errorf("a snapshot without new steps changed the sparkline: %q → %q", string(s), got)
	}
	// Bounded: the history keeps HistoryLen points, the row shows half.
	for step := 7; step < 7+2*HistoryLen; step++ {
		update(m, snapshotMsg{snap: fixture(step, float64(step%5))})
	}
	if n := len(m.history["default/bert"].mean); n != HistoryLen {
		t.Errorf("history holds %d points, want %d", n, HistoryLen)
	}
	if n := len([]rune(sparkOf(t, m.View()))); n != HistoryLen/2 {
		t.Errorf("sparkline %d points wide, want %d", n, HistoryLen/2)
	}
	checkWidth(t, m.View(), 120, 60)
	// A job gone from the snapshot loses its history.
	s2 := fixture(100, 1)
	s2.Jobs = nil
	update(m, snapshotMsg{snap: s2})
	if len(m.history) != 0 {
		t.Errorf("history kept for a job gone: %v", m.history)
	}
}

func TestFrameFitsTheTerminal(t *testing.T) {
	for _, size := range [][2]int{{60, 40}, {120, 40}, {60, 12}, {120, 18}, {20, 5}} {
		w, h := size[0], size[1]
		m, _ := newTestModel(t, w, h)
		for step := 2; step < 30; step++ {
			update(m, snapshotMsg{snap: fixture(step, 1/float64(step))})
		}
		frame := m.View()
		checkWidth(t, frame, w, h)
		if h >= 12 {
			lineWith(t, frame, "GPUS")
			lineWith(t, frame, "JOBS")
		}
		if h >= 12 && h < 30 && !strings.Contains(frame, "more") {
			t.Errorf("%dx%d: sections cut without a \"… N more\" line:\n%s", w, h, frame)
		}
	}
	// At 40 lines everything fits: no row cut.
	m, _ := newTestModel(t, 120, 40)
	if strings.Contains(m.View(), "… ") {
		t.Errorf("rows cut at 120x40:\n%s", m.View())
	}
	// Before any size, nothing is cut.
	src := newFakeSource(fixture(1, 1))
	m = NewModel(src, nil, time.Second)
	update(m, snapshotMsg{snap: src.snap})
	if strings.Contains(m.View(), "…") || strings.Contains(m.View(), "SERVICES") {
		t.Errorf("unsized frame cut, or services shown without a gateway:\n%s", m.View())
	}
}

func TestFrameCountsMoreRows(t *testing.T) {
	m, _ := newTestModel(t, 120, 16)
	frame := m.View()
	checkWidth(t, frame, 120, 16)
	l := lineWith(t, frame, "… ", " more")
	n, err := strconv.Atoi(strings.Fields(strings.TrimSpace(l))[1])
	if err != nil || n < 2 {
		t.Fatalf("bad \"more\" line %q", l)
	}
	// The GPU section has 10 rows (2 node lines, 8 GPUs): shown + hidden.
	shown := 0
	for _, l := range strings.Split(frame, "\n") {
		if gpuRowRE.MatchString(l) || strings.Contains(l, " GPUs, ") {
			shown++
		}
	}
	if shown+n != 10 {
		t.Errorf("%d GPU rows shown + %d more ≠ 10:\n%s", shown, n, frame)
	}
}

func TestKeysQuit(t *testing.T) {
	for _, k := range []tea.KeyMsg{
		{Type: tea.KeyRunes, Runes: []rune("q")},
		{Type: tea.KeyCtrlC},
		{Type: tea.KeyEsc},
	} {
		m, _ := newTestModel(t, 80, 24)
		cmd := update(m, k)
		if cmd == nil {
			t.Fatalf("%s: no command", k)
		}
		if _, ok := cmd().(tea.QuitMsg); !ok {
			t.Errorf("%s did not quit", k)
		}
	}
	m, _ := newTestModel(t, 80, 24)
	if cmd := update(m, tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("x")}); cmd != nil {
		t.Errorf("x returned a command")
	}
}

// run executes cmd and the commands it batches, returning their messages
// (tick commands are not run: they would wait).
func runCmd(cmd tea.Cmd) []tea.Msg {
	if cmd == nil {
		return nil
	}
	msg := cmd()
	if b, ok := msg.(tea.BatchMsg); ok {
		var out []tea.Msg
		for _, c := range b {
			out = append(out, runCmd(c)...)
		}
		return out
	}
	return []tea.Msg{msg}
}

func TestUpdatesFromChangesAndTicks(t *testing.T) {
	src := newFakeSource(fixture(1, 2))
	m := NewModel(src, serviceStats, time.Millisecond)
	update(m, tea.WindowSizeMsg{Width: 100, Height: 40})
	if !strings.Contains(m.View(), "reading the cluster") {
		t.Errorf("first frame: %q", m.View())
	}
	// Init reads a snapshot and the services, waits on Changed, ticks.
	src.changed <- struct{}{}
	var kinds []string
	for _, msg := range runCmd(m.Init()) {
		switch msg := msg.(type) {
		case snapshotMsg, servicesMsg, changedMsg, tickMsg:
			kinds = append(kinds, typeName(msg))
			update(m, msg)
		}
	}
	if strings.Join(kinds, ",") != "snapshot,services,changed,tick" {
		t.Errorf("Init's messages: %v", kinds)
	}
	lineWith(t, m.View(), "default/bert")
	// A change while a read is in flight asks for one more read after it.
	src.snap = fixture(2, 1.5)
	m.fetching = true
	cmd := update(m, changedMsg{})
	if !m.again {
		t.Error("a change during a read was dropped")
	}
	_ = cmd // only the next change wait: not run (it would block)
	calls := src.calls
	cmd = update(m, snapshotMsg{snap: fixture(1, 2)})
	msgs := runCmd(cmd)
	if src.calls != calls+1 || len(msgs) != 1 {
		t.Fatalf("no second read after the change: %d calls, %v", src.calls-calls, msgs)
	}
	update(m, msgs[0])
	if n := len([]rune(sparkOf(t, m.View()))); n != 2 {
		t.Errorf("sparkline %d points after 2 steps", n)
	}
}

func typeName(msg tea.Msg) string {
	switch msg.(type) {
	case snapshotMsg:
		return "snapshot"
	case servicesMsg:
		return "services"
	case changedMsg:
		return "changed"
	case tickMsg:
		return "tick"
	}
	return "?"
}
