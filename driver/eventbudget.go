package driver

import (
	"fmt"
	"time"

	"github.com/gpujob/gpujob/internal/taskevent"
)

// Each task event the driver emits becomes an update of the allocation on
// Nomad's servers. A job decides how often its supervisor has something to
// say (max_restarts = 1000000 and a rank that exits at once is a group
// restart, two events, many times a second), so the driver relays a task's
// events within a budget: a burst, then one per interval. The events that
// end the task (succeeded, failed, stopped, a sweep's stop) always pass;
// what was dropped is counted and said with the next event relayed.

const (
	eventBurst = 20
	eventEvery = 3 * time.Second
	// maxEventMessage bounds an event's message (a failure's reason can
	// quote what a rank or a preloaded interpreter said).
	maxEventMessage = 2 << 10
)

// eventBudget is one task's.
type eventBudget struct {
	tokens  float64
	last    time.Time
	dropped int
}

func newEventBudget() *eventBudget { return &eventBudget{tokens: eventBurst} }

// admit says whether e may be relayed at now; when it may, e's message says
// how many were dropped before it.
func (b *eventBudget) admit(now time.Time, e *taskevent.Event) bool {
	if !b.last.IsZero() {
		b.tokens = min(eventBurst, b.tokens+float64(now.Sub(b.last))/float64(eventEvery))
	}
	b.last = now
	final := e.Kind == taskevent.Succeeded || e.Kind == taskevent.Failed || e.Kind == taskevent.Stopped || e.Kind == taskevent.TrialStopped
	if b.tokens < 1 && !final {
		b.dropped++
		return false
	}
	b.tokens = max(b.tokens-1, 0)
	if e.Message == "" {
		e.Message = e.Describe()
	}
	if len(e.Message) > maxEventMessage {
		e.Message = e.Message[:maxEventMessage] + "…"
	}
	if b.dropped > 0 {
		e.Message += fmt.Sprintf(" (%d earlier event(s) not relayed: over the task's budget of %d, then one per %s)", b.dropped, eventBurst, eventEvery)
		b.dropped = 0
	}
	return true
}
