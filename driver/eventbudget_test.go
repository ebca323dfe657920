package driver

import (
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/taskevent"
)

func TestEventBudget(t *testing.T) {
	b := newEventBudget()
	now := time.Unix(1000, 0)
	relayed := 0
	// A crash loop: 200 restarts within a second.
	for i := 0; i < 200; i++ {
		e := taskevent.Event{Kind: taskevent.Restarting, Round: i + 1}
		if b.admit(now.Add(time.Duration(i)*5*time.Millisecond), &e) {
			relayed++
		}
	}
	if relayed != eventBurst {
		t.Fatalf("relayed %d of 200 events in a second, want the burst of %d", relayed, eventBurst)
	}
	// The outcome always passes, saying what was dropped.
	failed := taskevent.Event{Kind: taskevent.Failed, Message: strings.Repeat("x", 10<<10)}
	if !b.admit(now.Add(time.Second), &failed) {
		t.Fatal("the task's failure was dropped")
	}
	if !strings.Contains(failed.Message, "180 earlier event(s) not relayed") || len(failed.Message) > maxEventMessage+200 {
		t.Errorf("message (%d bytes) %q…", len(failed.Message), failed.Message[len(failed.Message)-120:])
	}
	// Then one per interval.
	later := now.Add(time.Second + eventEvery)
	if e := (taskevent.Event{Kind: taskevent.Joined}); !b.admit(later, &e) {
		t.Error("no event relayed an interval later")
	}
	if e := (taskevent.Event{Kind: taskevent.Joined}); b.admit(later.Add(time.Millisecond), &e) {
		t.Error("a second event relayed within the interval")
	}
}
