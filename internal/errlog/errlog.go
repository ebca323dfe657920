// Package errlog reports runs of failures of one operation — a Consul
// request retried through an outage, say — so that a log says it is
// happening without listing every attempt: the first failure at once, then
// at most one line per Every with how many there were, and a line when the
// operation works again (Run); and Throttled, one log for lines of many
// kinds at most one per interval. It is gpujob's one throttled logger: the
// Consul toolkit, the sweep reporter, the gateway, its autoscaler and the
// task supervisor share it.
package errlog

import (
	"fmt"
	"sync"
	"time"
)

// Every bounds how often a run of failures reaches the log.
const Every = 30 * time.Second

// Run is the failures of one operation. Its methods are safe for concurrent
// use, and do nothing with a nil logf.
type Run struct {
	logf  func(format string, args ...any)
	what  string
	note  string // after each failure's error: " (retrying)"
	now   func() time.Time
	mu    sync.Mutex
	fails int // since the last success
	held  int // failures not logged
	last  time.Time
}

// New is the run of the operation what, logged with logf.
func New(logf func(format string, args ...any), what string) *Run {
	return &Run{logf: logf, what: what, now: time.Now}
}

// NewRetrying is New for an operation that is retried on failure, which
// each failure's line says.
func NewRetrying(logf func(format string, args ...any), what string) *Run {
	return NewNoted(logf, what, " (retrying)")
}

// NewNoted is New with note after each failure's error, saying what
// happens meanwhile (" (keeping the last good ones)").
func NewNoted(logf func(format string, args ...any), what, note string) *Run {
	r := New(logf, what)
	r.note = note
	return r
}

// Failed counts a failure, and logs it unless a line went out within Every.
func (r *Run) Failed(err error) {
	if r.logf == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fails++
	now := r.now()
	if r.fails > 1 && now.Sub(r.last) < Every {
		r.held++
		return
	}
	msg := fmt.Sprintf("%s: %v%s", r.what, err, r.note)
	if r.held > 0 {
		msg += fmt.Sprintf(" (%d failures since the last line)", r.held+1)
	}
	r.logf("%s", msg)
	r.last, r.held = now, 0
}

// OK ends a run of failures, saying so if there was one.
func (r *Run) OK() {
	if r.logf == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fails > 0 {
		r.logf("%s: working again after %d failed attempts", r.what, r.fails)
	}
	r.fails, r.held = 0, 0
}

// Logf writes one line of the operation's own, not throttled.
func (r *Run) Logf(format string, args ...any) {
	if r.logf != nil {
		r.logf(format, args...)
	}
}

// Throttled is a log of lines of many kinds (the messages of a client that
// retries several operations through one outage) that writes at most one
// line per interval and says how many it held back since the last one.
// Its Logf is safe for concurrent use.
type Throttled struct {
	logf  func(format string, args ...any)
	every time.Duration
	now   func() time.Time
	mu    sync.Mutex
	last  time.Time
	held  int
	wrote bool
}

// NewThrottled writes through logf at most one line per every.
func NewThrottled(logf func(format string, args ...any), every time.Duration) *Throttled {
	return &Throttled{logf: logf, every: every, now: time.Now}
}

// Logf writes the line unless one went out within the interval; then it
// counts it, and the next line written says how many were held.
func (t *Throttled) Logf(format string, args ...any) {
	if t.logf == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if t.wrote && now.Sub(t.last) < t.every {
		t.held++
		return
	}
	msg := fmt.Sprintf(format, args...)
	if t.held > 0 {
		msg += fmt.Sprintf(" (and %d more like it)", t.held)
	}
	t.logf("%s", msg)
	t.last, t.wrote, t.held = now, true, 0
}
