package report

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// backoff yields capped exponential delays with jitter: the n-th is drawn
// from [d/2, d] with d = min(base·2ⁿ, cap), so the trials of a sweep that
// lost Consul together do not come back in lockstep.
type backoff struct {
	base, cap time.Duration
	n         int
}

func newBackoff(limit time.Duration) *backoff {
	return &backoff{base: backoffBase, cap: max(min(backoffCap, limit), backoffBase)}
}

func (b *backoff) next() time.Duration {
	d := b.cap
	if b.n < 30 {
		if e := b.base << b.n; e > 0 && e < b.cap {
			d = e
		}
	}
	b.n++
	return d/2 + rand.N(d/2+1)
}

func (b *backoff) reset() { b.n = 0 }

// sleepCtx waits d unless ctx ends first; it reports whether ctx is alive.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
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
