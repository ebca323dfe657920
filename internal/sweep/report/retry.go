package report

import (
	"fmt"
	"github.com/gpujob/gpujob/internal/backoff"
	"sync"
	"time"
)

// Backoff between retries of a failed Consul request: short at first (an
// agent restart or a leader election is over in seconds), capped so that
// the reporter writes again within seconds of Consul coming back.
const (
	backoffBase = 100 * time.Millisecond
	backoffCap  = 5 * time.Second
)

// newBackoff paces the reporter's retries, capped at limit (and at
// backoffCap).
func newBackoff(limit time.Duration) *backoff.Backoff {
	return backoff.New(backoffBase, max(min(backoffCap, limit), backoffBase))
}

// logEvery bounds how often a run of failures of one kind reaches the log:
// during a Consul outage every retry fails, and the task's stderr should
// say that it is happening, not list every attempt.
const logEvery = 30 * time.Second

// errorLog reports a run of failures of one operation: the first at once,
// then at most one line per logEvery with how many there were, and a line
// when the operation succeeds again.
type errorLog struct {
	logf  func(format string, args ...any)
	what  string
	now   func() time.Time
	mu    sync.Mutex
	fails int // since the last success
	held  int // failures not logged
	last  time.Time
}

func newErrorLog(logf func(string, ...any), what string) *errorLog {
	return &errorLog{logf: logf, what: what, now: time.Now}
}

func (l *errorLog) failed(err error) {
	if l.logf == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fails++
	now := l.now()
	if l.fails > 1 && now.Sub(l.last) < logEvery {
		l.held++
		return
	}
	msg := fmt.Sprintf("%s: %v (retrying)", l.what, err)
	if l.held > 0 {
		msg += fmt.Sprintf(" (%d failures since the last line)", l.held+1)
	}
	l.logf("%s", msg)
	l.last, l.held = now, 0
}

func (l *errorLog) ok() {
	if l.logf == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fails > 0 {
		l.logf("%s: working again after %d failed attempts", l.what, l.fails)
	}
	l.fails, l.held = 0, 0
}
