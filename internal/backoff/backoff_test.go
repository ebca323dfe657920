package backoff

import (
	"context"
	"testing"
	"time"
)

func TestNextGrowsToTheCapWithJitterAndResets(t *testing.T) {
	b := New(10*time.Millisecond, 80*time.Millisecond)
	for i, hi := range []time.Duration{10, 20, 40, 80, 80, 80} {
		hi *= time.Millisecond
		if d := b.Next(); d < hi/2 || d > hi {
			t.Errorf("delay %d = %s, want within [%s, %s]", i, d, hi/2, hi)
		}
	}
	b.Reset()
	if d := b.Next(); d > b.Base() {
		t.Errorf("after Reset: %s > base %s", d, b.Base())
	}
	if c := New(time.Second, time.Millisecond); c.Next() > time.Second {
		t.Error("a cap below base is raised to base")
	}
}

func TestSleepEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if Sleep(ctx, time.Minute) || time.Since(start) > time.Second {
		t.Fatal("Sleep did not return at once for an ended context")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep reported a live context as ended")
	}
}
