// Package errlog reports runs of failures of one operation — a Consul
// request retried through an outage, say — so that a log says it is
// happening without listing every attempt: the first failure at once, then
// at most one line per Every with how many there were, and a line when the
// operation works again. The sweep reporter and the gateways' autoscaler
// share it.
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
	r := New(logf, what)
	r.note = " (retrying)"
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
