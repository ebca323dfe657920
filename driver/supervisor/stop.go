package supervisor

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// Nomad gives a stopping task kill_timeout between its signal and SIGKILL.
// The driver knows it (StopTask's timeout) and writes the moment of the
// SIGKILL to the spec's StopDeadlineFile before it signals; the supervisor
// spends that time on the ranks' grace and on leaving the group in Consul.

// WriteStopDeadline records when the executor will SIGKILL the task.
func WriteStopDeadline(path string, deadline time.Time) error {
	if err := os.WriteFile(path, []byte(deadline.UTC().Format(time.RFC3339Nano)), 0o600); err != nil {
		return fmt.Errorf("recording the stop deadline: %w", err)
	}
	return nil
}

// readStopDeadline reads what WriteStopDeadline wrote; ok is false when no
// deadline was recorded (a stop that did not come from the driver).
func readStopDeadline(path string) (time.Time, bool) {
	if path == "" {
		return time.Time{}, false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
	return t, err == nil
}

// Bounds of a stop without a known deadline, and of leaving the group after
// a run that ended by itself.
const (
	defaultLeaveTimeout = 10 * time.Second
	// maxLeaveReserve caps the part of a long kill_timeout kept for Consul:
	// leaving takes milliseconds when Consul answers, and the ranks (saving
	// a checkpoint on SIGTERM) are who need a long kill_timeout.
	maxLeaveReserve = 5 * time.Second
	// stopMargin is kept back from the deadline for the exit itself.
	maxStopMargin = 500 * time.Millisecond
)

// stopPlan is how a stop spends its time.
type stopPlan struct {
	grace   time.Duration // SIGTERM to SIGKILL for the ranks
	leaveBy time.Time     // the deadline for leaving the group in Consul
}

// planStop splits the time to deadline: a margin for the exit, a third (at
// most maxLeaveReserve) reserved for Consul, the rest for the ranks. What
// the ranks leave unused goes to Consul too, since leaveBy is absolute.
// Without a deadline the ranks get fallbackGrace and Consul
// defaultLeaveTimeout after it.
func planStop(now, deadline time.Time, haveDeadline bool, fallbackGrace time.Duration) stopPlan {
	if !haveDeadline {
		return stopPlan{grace: fallbackGrace, leaveBy: now.Add(fallbackGrace + defaultLeaveTimeout)}
	}
	total := deadline.Sub(now)
	if total <= 0 {
		return stopPlan{grace: 0, leaveBy: now}
	}
	margin := min(total/10, maxStopMargin)
	usable := total - margin
	reserve := min(usable/3, maxLeaveReserve)
	return stopPlan{grace: usable - reserve, leaveBy: now.Add(usable)}
}
