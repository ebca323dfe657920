package supervisor

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"
)

// Nomad gives a stopping task kill_timeout between its signal and SIGKILL.
// For a host member the driver knows it (StopTask's timeout) and writes the
// moment of the SIGKILL to the spec's StopDeadlineFile before it signals.
// A container member's stop never reaches the gpujob driver: Nomad's docker
// driver runs `docker stop` with the docker task's kill_timeout, so its
// supervisor reckons the same moment from when the stop signal came and the
// spec's KillTimeout, which the driver wrote from the sidecar's config into
// the read-only run directory. Either way the supervisor spends that time
// on the ranks' grace and on leaving the group in Consul.
//
// The deadline only plans the supervisor's own steps; it kills nothing
// late. The SIGKILL that ends the member is the executor's (host) or
// docker's (container), at the kill_timeout Nomad gives, whatever the
// supervisor believes: a deadline past it (a KillTimeout above the client's
// max_kill_timeout, a sidecar config that says more than the docker task's
// kill_timeout) costs the member only its clean leave from the group, whose
// other members then see its session expire.

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

// stopClock records when the first stop signal came.
type stopClock struct {
	mu sync.Mutex
	at time.Time
}

func (c *stopClock) mark(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() {
		c.at = t
	}
}

// signalled is when the first stop signal came; ok is false before one.
func (c *stopClock) signalled() (at time.Time, ok bool) {
	if c == nil {
		return time.Time{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at, !c.at.IsZero()
}

// notifyStop is signal.NotifyContext that also marks the first signal's
// moment on clock, before the context ends: a stop's deadline counts from
// it, not from when the supervisor gets round to planning the stop. Later
// signals are swallowed until stop is called, as NotifyContext's are.
func notifyStop(parent context.Context, clock *stopClock, sigs ...os.Signal) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	go func() {
		select {
		case <-ch:
			clock.mark(time.Now())
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		cancel()
	}
}

// dockerKillTimeout is kill as `docker stop` counts it: Nomad's docker
// driver passes whole seconds, rounded down.
func dockerKillTimeout(kill time.Duration) time.Duration {
	return kill.Truncate(time.Second)
}

// stopDeadline is when this stop's SIGKILL comes: the driver's record for a
// host member; for a container member, the stop signal's moment plus the
// docker task's kill timeout. ok is false when neither is known (a stop
// the driver did not record, a sidecar config without the kill timeout, a
// trial's stop request without a signal).
func stopDeadline(deadlineFile string, killTimeout time.Duration, clock *stopClock) (time.Time, bool) {
	if d, ok := readStopDeadline(deadlineFile); ok {
		return d, true
	}
	if killTimeout <= 0 {
		return time.Time{}, false
	}
	at, ok := clock.signalled()
	if !ok {
		return time.Time{}, false
	}
	return at.Add(dockerKillTimeout(killTimeout)), true
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
