package top

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/internal/queue/admit"
)

// withQueues is the fixture with a queue configuration's summaries.
func withQueues() *observe.Snapshot {
	s := fixture(1, 2.0)
	since := s.Taken.Add(-17*time.Minute - 3*time.Second)
	s.Queues = []observe.QueueSummary{
		{Name: "team-a", Declared: true, QuotaGPUs: 8, Borrow: true, UsedGPUs: 10, BorrowedGPUs: 2, WaitingJobs: 3, WaitingGPUs: 12,
			OldestWaitSince: &since, PreemptedJobs: 1},
		{Name: "default", Declared: true, UsedGPUs: 1},
		{Name: admit.UndeclaredQueue, WaitingJobs: 0, RefusedJobs: 2},
	}
	return s
}

// With a queue configuration, top shows a QUEUES section: each queue's
// quota, use and borrowing, what waits for admission and the oldest
// wait; without one, no such section.
func TestFrameQueues(t *testing.T) {
	m, src := newTestModel(t, 140, 60)
	if frame := m.View(); strings.Contains(frame, "QUEUES") {
		t.Fatalf("a QUEUES section without a queue configuration:\n%s", frame)
	}
	src.snap = withQueues()
	update(m, snapshotMsg{snap: src.snap})
	frame := m.View()
	lineWith(t, frame, "QUEUES  3, 3 jobs waiting for admission")
	lineWith(t, frame, "team-a", "quota 8", "used 10 (2 borrowed)", "waiting 3 jobs / 12 GPUs", "oldest 17m3s", "1 preempted")
	row := lineWith(t, frame, "default", "no quota", "used 1 ", "waiting 0 jobs / 0 GPUs")
	if strings.Contains(row, "oldest") {
		t.Errorf("an oldest wait for a queue where none waits: %q", row)
	}
	if row := lineWith(t, frame, "(not declared)", "2 refused"); strings.Contains(row, "quota") {
		t.Errorf("a quota for what no queue declares: %q", row)
	}
	checkWidth(t, frame, 140, 60)
	// Nomad's own queue keeps its section.
	lineWith(t, frame, "QUEUE  1 waiting")
}

// -json carries the queues; without a configuration it has no "queues".
func TestJSONQueues(t *testing.T) {
	out, _, err := execute(t, newFakeSource(withQueues()), true, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Queues []map[string]any `json:"queues"`
	}
	if err := json.NewDecoder(bytes.NewBufferString(out)).Decode(&s); err != nil {
		t.Fatal(err)
	}
	if len(s.Queues) != 3 || s.Queues[0]["name"] != "team-a" || s.Queues[0]["borrowed_gpus"] != 2.0 ||
		s.Queues[0]["waiting_gpus"] != 12.0 || s.Queues[0]["oldest_wait_since"] == nil {
		t.Errorf("queues: %v", s.Queues)
	}
	out, _, err = execute(t, newFakeSource(fixture(1, 2)), true, "--json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, `"queues"`) {
		t.Errorf("a queues key without a queue configuration")
	}
}
