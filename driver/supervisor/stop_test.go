package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestStopDeadline(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	signalled := &stopClock{}
	signalled.mark(at)
	signalled.mark(at.Add(time.Second)) // a second signal moves nothing
	recorded := filepath.Join(t.TempDir(), "deadline")
	if err := WriteStopDeadline(recorded, at.Add(42*time.Second)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		file  string
		kill  time.Duration
		clock *stopClock
		want  time.Duration // after at; -1: none
	}{
		{"the driver's record (a host member)", recorded, 0, nil, 42 * time.Second},
		{"the record wins over a kill timeout", recorded, 8 * time.Second, signalled, 42 * time.Second},
		{"a container member: the signal plus the kill timeout", "", 8 * time.Second, signalled, 8 * time.Second},
		{"docker counts whole seconds", "", 8900 * time.Millisecond, signalled, 8 * time.Second},
		{"no kill timeout: none", "", 0, signalled, -1},
		{"no signal (a trial's stop request): none", "", 8 * time.Second, &stopClock{}, -1},
		{"no clock: none", "", 8 * time.Second, nil, -1},
		{"a record that is missing: none", filepath.Join(t.TempDir(), "none"), 0, signalled, -1},
	}
	for _, tt := range tests {
		got, ok := stopDeadline(tt.file, tt.kill, tt.clock)
		switch {
		case tt.want < 0 && ok:
			t.Errorf("%s: deadline %s, want none", tt.name, got)
		case tt.want >= 0 && (!ok || !got.Equal(at.Add(tt.want))):
			t.Errorf("%s: deadline %s (%t), want +%s", tt.name, got, ok, tt.want)
		}
	}
}

// TestNotifyStopMarksTheSignal: the clock holds the signal's moment once
// the context ends, so a stop planned later still counts from it.
func TestNotifyStopMarksTheSignal(t *testing.T) {
	clock := &stopClock{}
	ctx, stop := notifyStop(context.Background(), clock, syscall.SIGUSR2)
	defer stop()
	if _, ok := clock.signalled(); ok {
		t.Fatal("marked before any signal")
	}
	before := time.Now()
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the signal did not end the context")
	}
	at, ok := clock.signalled()
	if !ok || at.Before(before) || at.After(time.Now()) {
		t.Errorf("marked %s (%t), want between %s and now", at, ok, before)
	}
}

// TestSupervisorStopReckonsTheContainerDeadline: a container member,
// which no driver writes a deadline, gives its ranks the time its docker
// task's kill timeout leaves after the stop signal (in whole seconds, as
// docker counts), not the fixed grace, and plans its leave before it.
func TestSupervisorStopReckonsTheContainerDeadline(t *testing.T) {
	coord := newFakeCoord(1, nil)
	dir := t.TempDir()
	spec := &Spec{Command: "/bin/sh", Args: []string{"-c", `trap "" TERM; touch "$STATE/up.$LOCAL_RANK"; exec sleep 60`},
		NProcPerNode: 2, RunID: "default/job", Self: Member{ID: "a1", Name: "job.g[0]", Addr: "127.0.0.1:1"}, Min: 1, Max: 1,
		StopGrace: Duration(time.Minute), Container: true, KillTimeout: Duration(2900 * time.Millisecond)}
	sup, err := New(spec, coord, []string{"PATH=/usr/bin:/bin", "STATE=" + dir}, &safeBuffer{}, &safeBuffer{})
	if err != nil {
		t.Fatal(err)
	}
	clock := &stopClock{}
	sup.stopSignal = clock
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() { done <- sup.Run(ctx) }()
	<-coord.watched
	eventually(func() bool {
		_, err := os.Stat(filepath.Join(dir, "up.1"))
		return err == nil
	})
	at := time.Now()
	clock.mark(at)
	cancel()
	deadline := at.Add(2 * time.Second) // docker stop -t 2
	select {
	case code := <-done:
		if code != ExitStopped {
			t.Fatalf("code %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stop took the fixed grace (a minute), not the kill timeout")
	}
	if now := time.Now(); now.After(deadline) {
		t.Errorf("ranks stopped %s after docker's SIGKILL would have come", now.Sub(deadline))
	}
	if took := time.Since(at); took < time.Second {
		t.Errorf("ranks stopped %s after the signal; the plan gives them most of 2s", took)
	}
	if leave := sup.LeaveDeadline(); leave.After(deadline) {
		t.Errorf("leaving the group may take until %s, past docker's SIGKILL at %s", leave, deadline)
	}
}
