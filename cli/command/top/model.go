package top

import (
	"context"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/internal/servekv"
)

// ServiceStats reads the gateway's figures per service ("<ns>/<service>").
type ServiceStats func(ctx context.Context) (map[string]servekv.Stats, error)

// HistoryLen is how many loss points a job's sparkline keeps.
const HistoryLen = 40

// LowUtilPct is the utilisation under which a training job's GPU is
// flagged (observe.LowUtilizationPct, `gpujob status`'s bar too).
const LowUtilPct = observe.LowUtilizationPct

// Model is the bubbletea model of `gpujob top`: the latest snapshot, the
// gateway's service figures, and each training job's loss history.
type Model struct {
	src      observe.Source
	services ServiceStats
	interval time.Duration
	// Cluster names the cluster in the header (the Nomad address).
	Cluster string
	// plain is set for the one frame printed without a terminal.
	plain bool

	width, height int

	snap    *observe.Snapshot
	snapErr error
	svc     map[string]servekv.Stats
	svcErr  error

	// fetching is true while a snapshot is being read; again asks for
	// one more read once it returns (a change or tick came meanwhile).
	fetching, again bool

	history map[string]*lossHistory // by namespace/job
}

// lossHistory is one job's loss across snapshots: the latest step seen per
// rank, and the mean of the ranks' latest losses each time a rank moved.
type lossHistory struct {
	steps map[int]int // rank → last step seen
	mean  []float64   // at most HistoryLen points
	seen  bool        // whether the job was in the latest snapshot
}

// NewModel returns a model reading src, and the gateway's figures from
// services when it is not nil; GPU stats are refreshed every interval.
func NewModel(src observe.Source, services ServiceStats, interval time.Duration) *Model {
	if interval <= 0 {
		interval = 2 * time.Second
	}
	return &Model{src: src, services: services, interval: interval, history: map[string]*lossHistory{}}
}

// Messages.
type (
	snapshotMsg struct {
		snap *observe.Snapshot
		err  error
	}
	servicesMsg struct {
		stats map[string]servekv.Stats
		err   error
	}
	changedMsg struct{}
	tickMsg    time.Time
	closedMsg  struct{} // Changed's channel was closed
)

// Init reads the first snapshot and starts the tick and the change wait.
func (m *Model) Init() tea.Cmd {
	m.fetching = true
	return tea.Batch(m.fetchSnapshot(), m.fetchServices(), m.waitChanged(), m.tick())
}

// Update handles keys, the terminal size, the snapshots and the timers.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.KeyMsg:
		switch msg.String() {
		case "q", "Q", "ctrl+c", "esc":
			return m, tea.Quit
		}
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
	case snapshotMsg:
		m.fetching = false
		m.apply(msg.snap, msg.err)
		if m.again {
			m.again = false
			return m, m.refresh()
		}
	case servicesMsg:
		m.svc, m.svcErr = msg.stats, msg.err
	case changedMsg:
		return m, tea.Batch(m.refresh(), m.waitChanged())
	case tickMsg:
		return m, tea.Batch(m.refresh(), m.fetchServices(), m.tick())
	}
	return m, nil
}

// refresh reads a snapshot unless one is being read, in which case one
// more is read when it returns.
func (m *Model) refresh() tea.Cmd {
	if m.fetching {
		m.again = true
		return nil
	}
	m.fetching = true
	return m.fetchSnapshot()
}

// apply takes a snapshot: it replaces the shown one (an error keeps the
// last good one) and extends the loss histories.
func (m *Model) apply(s *observe.Snapshot, err error) {
	m.snapErr = err
	if err != nil || s == nil {
		return
	}
	m.snap = s
	for _, h := range m.history {
		h.seen = false
	}
	for _, j := range s.Jobs {
		key := j.Namespace + "/" + j.ID
		h := m.history[key]
		if h == nil {
			h = &lossHistory{steps: map[int]int{}}
			m.history[key] = h
		}
		h.seen = true
		h.add(j.Losses)
	}
	for k, h := range m.history {
		if !h.seen {
			delete(m.history, k)
		}
	}
}

// add records the ranks' latest losses when any rank reported a new step.
func (h *lossHistory) add(losses []observe.RankLoss) {
	if len(losses) == 0 {
		return
	}
	moved := false
	sum := 0.0
	for _, l := range losses {
		if last, ok := h.steps[l.Rank]; !ok || last != l.Step {
			moved = true
			h.steps[l.Rank] = l.Step
		}
		sum += l.Loss
	}
	if !moved {
		return
	}
	h.mean = append(h.mean, sum/float64(len(losses)))
	if len(h.mean) > HistoryLen {
		h.mean = append(h.mean[:0:0], h.mean[len(h.mean)-HistoryLen:]...)
	}
}

func (m *Model) fetchSnapshot() tea.Cmd {
	src, timeout := m.src, m.interval*5
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(context.Background(), max(timeout, 10*time.Second))
		defer cancel()
		s, err := src.Snapshot(ctx)
		return snapshotMsg{snap: s, err: err}
	}
}

func (m *Model) fetchServices() tea.Cmd {
	if m.services == nil {
		return nil
	}
	get := m.services
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		s, err := get(ctx)
		return servicesMsg{stats: s, err: err}
	}
}

func (m *Model) waitChanged() tea.Cmd {
	ch := m.src.Changed()
	if ch == nil {
		return nil
	}
	return func() tea.Msg {
		if _, ok := <-ch; !ok {
			return closedMsg{}
		}
		return changedMsg{}
	}
}

func (m *Model) tick() tea.Cmd {
	return tea.Tick(m.interval, func(t time.Time) tea.Msg { return tickMsg(t) })
}
