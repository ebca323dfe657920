package supervisor

import (
	"context"
	"time"
)

// A job decides how often its group restarts: max_restarts is the job's,
// and a rank that exits at once makes every round a few Consul writes per
// member and two task events. So once rounds keep ending as soon as they
// start, each member waits before it joins the next one: after quickRounds
// rounds in a row that each lasted under quickRound, 1 s, doubling up to
// maxPause; a round that lasts resets it. Ordinary faults (a rank killed
// minutes into training) never wait.
const (
	quickRound  = 10 * time.Second
	quickRounds = 3
	firstPause  = time.Second
	maxPause    = 30 * time.Second
)

// pacer tracks how the member's rounds have been ending.
type pacer struct {
	quick int // rounds in a row that ended within quickRound
	pause time.Duration
}

// ended records a round that began at start and ended at now, and returns
// how long to wait before joining the next one.
func (p *pacer) ended(start, now time.Time) time.Duration {
	if now.Sub(start) >= quickRound {
		p.quick, p.pause = 0, 0
		return 0
	}
	p.quick++
	if p.quick < quickRounds {
		return 0
	}
	if p.pause == 0 {
		p.pause = firstPause
	} else {
		p.pause = min(2*p.pause, maxPause)
	}
	return p.pause
}

// sleepCtx waits d or until ctx ends; false when ctx ended.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
