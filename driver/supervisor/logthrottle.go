package supervisor

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// consulLogEvery bounds how often the rendezvous's retry messages reach the
// task's stderr: during a Consul outage every outstanding request retries
// every couple of seconds, and the user needs to see that it is happening,
// not every attempt.
const consulLogEvery = 5 * time.Second

// throttledLog writes at most one line per interval and says how many it
// held back since the last one.
type throttledLog struct {
	out     io.Writer
	every   time.Duration
	now     func() time.Time
	mu      sync.Mutex
	last    time.Time
	held    int
	hasLast bool
}

func newThrottledLog(out io.Writer, every time.Duration) *throttledLog {
	return &throttledLog{out: out, every: every, now: time.Now}
}

func (l *throttledLog) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if l.hasLast && now.Sub(l.last) < l.every {
		l.held++
		return
	}
	msg := fmt.Sprintf(format, args...)
	if l.held > 0 {
		msg += fmt.Sprintf(" (and %d more like it)", l.held)
	}
	fmt.Fprintf(l.out, "gpujob: consul: %s\n", msg)
	l.last, l.hasLast, l.held = now, true, 0
}
