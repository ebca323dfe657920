// Package backoff is the one retry pacing of gpujob's Consul and Nomad
// clients: capped exponential delays with jitter, and a sleep that a
// context cuts short.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff yields capped exponential delays with jitter: the n-th delay is
// drawn from [d/2, d] with d = min(base·2ⁿ, cap), so that callers that
// failed together (the members of a group, the trials of a sweep) do not
// retry in lockstep. The zero value is not usable; see New.
type Backoff struct {
	base, cap time.Duration
	n         int
}

// New returns a Backoff from base up to cap (cap is raised to base).
func New(base, cap time.Duration) *Backoff {
	return &Backoff{base: base, cap: max(cap, base)}
}

// Base is the first delay's upper bound.
func (b *Backoff) Base() time.Duration { return b.base }

// Next returns the next delay.
func (b *Backoff) Next() time.Duration {
	d := b.cap
	if b.n < 30 {
		if e := b.base << b.n; e > 0 && e < b.cap {
			d = e
		}
	}
	b.n++
	return d/2 + rand.N(d/2+1)
}

// Reset starts again from base (after a success).
func (b *Backoff) Reset() { b.n = 0 }

// Wait sleeps the next delay; it reports false when ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool { return Sleep(ctx, b.Next()) }

// Sleep waits d unless ctx ends first; it reports whether ctx is alive.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
