package supervisor

import (
	"testing"
	"time"
)

func TestPacerWaitsOnlyInACrashLoop(t *testing.T) {
	var p pacer
	t0 := time.Unix(0, 0)
	quick := func(i int) time.Duration {
		return p.ended(t0.Add(time.Duration(i)*time.Minute), t0.Add(time.Duration(i)*time.Minute+time.Second))
	}
	var got []time.Duration
	for i := 0; i < 9; i++ {
		got = append(got, quick(i))
	}
	want := []time.Duration{0, 0, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("pauses after quick rounds %v, want %v", got, want)
		}
	}
	// A round that lasts resets it: ordinary faults never wait.
	if d := p.ended(t0, t0.Add(time.Hour)); d != 0 {
		t.Fatalf("after a long round: %s", d)
	}
	if d := quick(100); d != 0 {
		t.Fatalf("the first quick round after a long one waits %s", d)
	}
}
