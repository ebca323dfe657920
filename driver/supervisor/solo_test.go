package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func soloSpec(t *testing.T, script string, maxRestarts int) *Spec {
	dir := t.TempDir()
	return &Spec{Command: "/bin/sh", Args: []string{"-c", script}, NProcPerNode: 1, MaxRestarts: maxRestarts,
		RunID: "default/svc", Self: Member{ID: "a1", Name: "svc.replica[0]", Addr: "127.0.0.1:1"},
		Min: 1, Max: 1, Solo: true, StopGrace: Duration(500 * time.Millisecond),
		Env: map[string]string{"STATE": dir}, EventsFile: filepath.Join(dir, "events.jsonl")}
}

// A replica whose process fails exits with a failure at once when its
// budget is 0 (Nomad restarts it), after its restarts otherwise.
func TestSoloFailureSpendsTheLocalBudget(t *testing.T) {
	for _, c := range []struct {
		restarts, runs int
	}{{0, 1}, {2, 3}} {
		spec := soloSpec(t, `echo x >> "$STATE/runs"; exit 4`, c.restarts)
		if err := spec.Validate(); err != nil {
			t.Fatal(err)
		}
		sup, err := New(spec, newSolo(spec), []string{"PATH=/usr/bin:/bin"}, &safeBuffer{}, &safeBuffer{})
		if err != nil {
			t.Fatal(err)
		}
		if code := sup.Run(context.Background()); code != 1 {
			t.Errorf("max_restarts %d: exit %d, want 1", c.restarts, code)
		}
		b, _ := os.ReadFile(filepath.Join(spec.Env["STATE"], "runs"))
		if n := strings.Count(string(b), "x"); n != c.runs {
			t.Errorf("max_restarts %d: the process ran %d times, want %d", c.restarts, n, c.runs)
		}
		ev, _ := os.ReadFile(spec.EventsFile)
		if !strings.Contains(string(ev), "restart budget exhausted") {
			t.Errorf("max_restarts %d: events do not say the budget is spent:\n%s", c.restarts, ev)
		}
	}
}

// A replica runs alone as rank 0 of 1 and ends on the stop, with the
// process told to stop first.
func TestSoloRunsAloneUntilStopped(t *testing.T) {
	spec := soloSpec(t, `trap 'echo term > "$STATE/term"; exit 0' TERM; echo "$RANK/$WORLD_SIZE" > "$STATE/rank"; while :; do sleep 0.05; done`, 0)
	sup, err := New(spec, newSolo(spec), []string{"PATH=/usr/bin:/bin"}, &safeBuffer{}, &safeBuffer{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() { done <- sup.Run(ctx) }()
	rankFile := filepath.Join(spec.Env["STATE"], "rank")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(rankFile); strings.TrimSpace(string(b)) == "0/1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the process never started as rank 0 of 1")
		}
	}
	cancel()
	if code := <-done; code != ExitStopped {
		t.Errorf("exit %d, want %d", code, ExitStopped)
	}
	if _, err := os.Stat(filepath.Join(spec.Env["STATE"], "term")); err != nil {
		t.Errorf("the process was not sent SIGTERM: %v", err)
	}
}

func TestSoloSpecIsAGroupOfOne(t *testing.T) {
	spec := soloSpec(t, "true", 0)
	spec.Max = 2
	if err := spec.Validate(); err == nil {
		t.Error("a solo spec of 2 members validated")
	}
}
